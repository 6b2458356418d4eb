#define _XOPEN_SOURCE 700 // nftw
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void (*fatal_hook)(void);

void weft_set_fatal_hook(void (*hook)(void)) { fatal_hook = hook; }

static int error_rank;
static void (*end_job)(void);
void weft_set_error_rank(int rank, void (*end)(void)) { error_rank = rank, end_job = end; }

void weft_print_line(const char *prefix, const char *fmt, va_list ap) {
    va_list measure;
    va_copy(measure, ap);
    int n = vsnprintf(NULL, 0, fmt, measure);
    va_end(measure);
    size_t head = strlen(prefix), len = head + (size_t)(n > 0 ? n : 0) + 1;
    char *line = malloc(len + 1); // not weft_alloc: its failure would come back here
    if (!line) { // out of memory: the message in pieces beats no message
        fputs(prefix, stderr), vfprintf(stderr, fmt, ap), fputc('\n', stderr), fflush(stderr);
        return;
    }
    memcpy(line, prefix, head);
    vsnprintf(line + head, len - head, fmt, ap);
    line[len - 1] = '\n';
    fflush(stderr);
    for (size_t done = 0; done < len;) {
        ssize_t w = write(STDERR_FILENO, line + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    free(line);
}

static noreturn void end_with_error(bool cleanup, const char *fmt, va_list ap) {
    if (error_rank > 0) sleep(3); // core.h: rank 0 ends the job first
    weft_print_line("weft: error: ", fmt, ap);
    if (fatal_hook) fatal_hook();
    if (end_job) end_job();
    if (!cleanup) {
        fflush(NULL);
        _exit(1);
    }
    exit(1);
}

noreturn void weft_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    end_with_error(true, fmt, ap);
}

noreturn void weft_fatal_without_cleanup(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    end_with_error(false, fmt, ap);
}

void weft_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    fflush(stdout);
}

uint16_t weft_bf16_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float weft_f32_from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void *weft_alloc(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (!p) weft_fatal("out of host memory allocating %zu bytes", bytes);
    memset(p, 0, rounded);
    return p;
}

void weft_free(void *p) { free(p); }

void *weft_grow(void *array, int n, int *cap, size_t size, int first_cap) {
    if (n < *cap) return array;
    int grown_cap = *cap ? 2 * *cap : first_cap;
    char *grown = weft_alloc(size * (size_t)grown_cap);
    if (n) memcpy(grown, array, size * (size_t)n);
    weft_free(array);
    *cap = grown_cap;
    return grown;
}

// A spilled allocation's block: this header, then the caller's bytes at a 64-byte offset.
struct weft_arena_spill {
    struct weft_arena_spill *next;
};
enum { ARENA_HEADER = 64 };

static void *arena_take(weft_arena *a, size_t bytes, bool zeroed) {
    size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    a->asked += rounded;
    if (a->used + rounded > a->cap) { // its own block (zeroed), until the reset grows the arena
        struct weft_arena_spill *spill = weft_alloc(ARENA_HEADER + rounded);
        spill->next = a->spills;
        a->spills = spill;
        return (char *)spill + ARENA_HEADER;
    }
    char *p = a->base + a->used;
    a->used += rounded;
    if (zeroed) memset(p, 0, rounded);
    return p;
}

void *weft_arena_alloc(weft_arena *a, size_t bytes) { return arena_take(a, bytes, true); }
void *weft_arena_stage(weft_arena *a, size_t bytes) { return arena_take(a, bytes, false); }

static void free_spills(weft_arena *a) {
    while (a->spills) {
        struct weft_arena_spill *next = a->spills->next;
        weft_free(a->spills);
        a->spills = next;
    }
}

void weft_arena_reset(weft_arena *a) {
    if (a->spills) { // the span asked for more than the arena holds: grow it to that, and a quarter
        free_spills(a);
        weft_free(a->base);
        a->cap = a->asked + a->asked / 4;
        a->base = weft_alloc(a->cap);
    }
    a->used = a->asked = 0;
}

void weft_arena_free(weft_arena *a) {
    free_spills(a);
    weft_free(a->base);
    *a = (weft_arena){0};
}

char *weft_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = weft_alloc(n);
    memcpy(d, s, n);
    return d;
}

char *weft_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || S_ISDIR(st.st_mode)) { // a directory "opens" on Linux
        fclose(f);
        errno = EISDIR;
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0) goto fail;
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) goto fail;
    char *buf = weft_alloc((size_t)size + 1);
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        weft_free(buf);
        goto fail;
    }
    fclose(f);
    buf[size] = '\0';
    if (len) *len = (size_t)size;
    return buf;
fail:
    fclose(f);
    return NULL;
}

FILE *weft_open_input(const char *path, const char *what) {
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    FILE *f = dir ? NULL : fopen(path, "r");
    WEFT_CHECK(f, "%s: cannot open %s (%s); check the path", path, what,
               dir ? "a directory, not a file" : strerror(errno));
    return f;
}

void weft_prepare_output(const char *path, const char *what) {
    struct stat st;
    WEFT_CHECK(*path, "an empty path for %s; give a file's path", what);
    WEFT_CHECK(!(stat(path, &st) == 0 && S_ISDIR(st.st_mode)),
               "%s: cannot write %s there: a directory, not a file; give a file's path", path, what);
    size_t n = strlen(path);
    char *dir = weft_alloc(n + 2);
    memcpy(dir, path, n + 1);
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else slash[slash == dir] = '\0'; // "/x" lives in "/"
    weft_mkdirs(dir); // a failure shows below
    int err = stat(dir, &st) != 0           ? errno
              : !S_ISDIR(st.st_mode)          ? ENOTDIR
              : access(dir, W_OK | X_OK) != 0 ? errno
                                              : 0;
    weft_free(dir);
    WEFT_CHECK(!err, "%s: cannot write %s there (its directory: %s); give another path", path,
               what, strerror(err));
}

bool weft_mkdirs(const char *path) {
    size_t n = strlen(path);
    char *buf = weft_alloc(n + 1);
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755); // an existing parent is fine; a real failure shows below
            *p = '/';
        }
    bool ok = mkdir(buf, 0755) == 0 || errno == EEXIST;
    weft_free(buf);
    return ok;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    return remove(path);
}

bool weft_remove_tree(const char *path) {
    if (access(path, F_OK) != 0) return true;
    // Depth-first, without following links: children go before their directory.
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

static bool write_all(int fd, const char *p, size_t left) {
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w, left -= (size_t)w;
    }
    return true;
}

bool weft_write_parts_atomic(const char *path, int n, const void *const *parts, const size_t *lens) {
    size_t cap = strlen(path) + 32;
    char *tmp = weft_alloc(cap);
    snprintf(tmp, cap, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    bool ok = fd >= 0;
    for (int i = 0; ok && i < n; i++) ok = write_all(fd, parts[i], lens[i]);
    if (fd >= 0) {
        ok = ok && fsync(fd) == 0;
        ok = (close(fd) == 0) && ok;
    }
    ok = ok && rename(tmp, path) == 0;
    if (!ok) unlink(tmp);
    weft_free(tmp);
    return ok;
}

bool weft_write_file_atomic(const char *path, const void *data, size_t len) {
    return weft_write_parts_atomic(path, 1, &data, &len);
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void weft_rng_seed(weft_rng *rng, uint64_t seed) {
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t weft_rng_next(weft_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double weft_rng_uniform(weft_rng *rng) { return (double)(weft_rng_next(rng) >> 11) * 0x1.0p-53; }

double weft_rng_normal(weft_rng *rng) {
    double u1 = weft_rng_uniform(rng), u2 = weft_rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double weft_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int weft_num_threads(void) { return omp_get_max_threads(); }

size_t weft_host_memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    if (kib) return (size_t)kib * 1024;
    return (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE); // no /proc
}

void weft_format_bytes(char *buf, size_t n, size_t bytes) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    if (u == 0) snprintf(buf, n, "%zu B", bytes);
    else snprintf(buf, n, "%.2f %s", v, units[u]);
}
