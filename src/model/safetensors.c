#include "model/safetensors.h"

#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// Tensor bytes are copied between the file and host floats as they are; the format is
// little-endian, so a big-endian host would need byte swaps that this file does not do.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

// The reference implementation refuses headers above 100 MB; so do we, so that a garbage length
// field cannot make us allocate most of a multi-gigabyte file as "header".
#define MAX_HEADER_BYTES (100u * 1000u * 1000u)
#define METADATA_KEY "__metadata__"

// ---------------------------------------------------------------------------------------------
// dtypes

typedef enum { KIND_F32, KIND_F64, KIND_F16, KIND_BF16, KIND_OTHER } dtype_kind;

typedef struct {
    const char *name;
    size_t size;
    dtype_kind kind;
} dtype_info;

// The reference's whole-byte dtypes. Integer and 8-bit float tensors can be loaded (a checkpoint
// may carry them beside the weights) but not converted to f32.
static const dtype_info DTYPES[] = {
    {"F64", 8, KIND_F64},    {"F32", 4, KIND_F32},       {"F16", 2, KIND_F16},       {"BF16", 2, KIND_BF16},
    {"I64", 8, KIND_OTHER},  {"I32", 4, KIND_OTHER},     {"I16", 2, KIND_OTHER},     {"I8", 1, KIND_OTHER},
    {"U64", 8, KIND_OTHER},  {"U32", 4, KIND_OTHER},     {"U16", 2, KIND_OTHER},     {"U8", 1, KIND_OTHER},
    {"BOOL", 1, KIND_OTHER}, {"F8_E4M3", 1, KIND_OTHER}, {"F8_E5M2", 1, KIND_OTHER},
};

static const dtype_info *find_dtype(const char *name) {
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (strcmp(DTYPES[i].name, name) == 0) return &DTYPES[i];
    return NULL;
}

int64_t weft_st_numel(const weft_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

// ---------------------------------------------------------------------------------------------
// loading

static uint64_t read_le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

// The file descriptor is closed before any error: the fuzz targets run many rejected inputs in
// one process, and a descriptor left open by each would exhaust the limit.
#define CHECK_CLOSING(fd, cond, ...)                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            close(fd);                                                                             \
            weft_fatal(__VA_ARGS__);                                                               \
        }                                                                                          \
    } while (0)

static void read_at(int fd, const char *path, void *dst, size_t n, off_t at, const char *what) {
    for (size_t done = 0; done < n;) {
        ssize_t r = pread(fd, (char *)dst + done, n - done, at + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        CHECK_CLOSING(fd, r > 0,
                      "%s: could not read the %s (%zu bytes): %s; check that the file is not being "
                      "rewritten while weft reads it",
                      path, what, n, r < 0 ? strerror(errno) : "unexpected end of file");
        done += (size_t)r;
    }
}

static int open_regular(const char *path, struct stat *sb) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) weft_fatal("%s: cannot open (%s); check the path", path, strerror(errno));
    CHECK_CLOSING(fd, fstat(fd, sb) == 0, "%s: cannot stat (%s); check the path", path, strerror(errno));
    CHECK_CLOSING(fd, S_ISREG(sb->st_mode), "%s: not a regular file; pass the path of a .safetensors file",
                  path);
    return fd;
}

// Reads "name": [non-negative integers] into out; returns the element count, or -1 if the field is
// missing, not an array, longer than max, or holds anything but non-negative integers.
static int read_index_array(json_t *obj, const char *field, int64_t *out, int max) {
    json_t *arr = json_object_get(obj, field);
    if (!json_is_array(arr) || json_array_size(arr) > (size_t)max) return -1;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
        out[i] = json_integer_value(v);
    }
    return (int)json_array_size(arr);
}

// Fills t from one header entry, checking types and that the byte range matches shape * dtype.
static void parse_tensor(const char *path, const char *name, json_t *entry, weft_st_tensor *t) {
    static const char *fix = "the file is corrupt or was written by a broken tool; re-download or re-save it";
    if (!json_is_object(entry)) weft_fatal("%s: header entry \"%s\" is not a JSON object; %s", path, name, fix);
    t->name = weft_strdup(name);

    json_t *dtype = json_object_get(entry, "dtype");
    if (!json_is_string(dtype)) weft_fatal("%s: tensor \"%s\" has no string field \"dtype\"; %s", path, name, fix);
    const dtype_info *info = find_dtype(json_string_value(dtype));
    if (!info)
        weft_fatal("%s: tensor \"%s\" has dtype \"%s\", which weft does not know (known: F64 F32 F16 BF16 I64 I32 "
                   "I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2); convert the checkpoint to F32, BF16 or F16",
                   path, name, json_string_value(dtype));
    strcpy(t->dtype, info->name); // every known name fits in dtype[8]

    t->ndim = read_index_array(entry, "shape", t->shape, WEFT_ST_MAX_DIMS);
    if (t->ndim < 0)
        weft_fatal("%s: tensor \"%s\" has a missing or invalid \"shape\" (want an array of at most %d "
                   "non-negative integers); %s",
                   path, name, WEFT_ST_MAX_DIMS, fix);

    int64_t offsets[2];
    if (read_index_array(entry, "data_offsets", offsets, 2) != 2 || offsets[0] > offsets[1])
        weft_fatal("%s: tensor \"%s\" has a missing or invalid \"data_offsets\" (want [begin, end] with "
                   "0 <= begin <= end); %s",
                   path, name, fix);
    t->offset = (size_t)offsets[0];
    t->nbytes = (size_t)(offsets[1] - offsets[0]);

    // shape * dtype size, computed without overflow: a garbage shape must not wrap to a valid size.
    uint64_t want = info->size;
    for (int i = 0; i < t->ndim; i++)
        if (__builtin_mul_overflow(want, (uint64_t)t->shape[i], &want))
            weft_fatal("%s: tensor \"%s\" has a shape whose size overflows 64 bits; %s", path, name, fix);
    if (want != t->nbytes)
        weft_fatal("%s: tensor \"%s\" (%s, %d dims) needs %llu bytes but its data_offsets [%lld, %lld] span %zu; "
                   "%s",
                   path, name, info->name, t->ndim, (unsigned long long)want, (long long)offsets[0],
                   (long long)offsets[1], t->nbytes, fix);
}

static void check_metadata(const char *path, json_t *meta) {
    const char *key;
    json_t *value;
    bool ok = json_is_object(meta);
    if (ok) json_object_foreach(meta, key, value) ok = ok && json_is_string(value);
    if (!ok)
        weft_fatal("%s: \"" METADATA_KEY "\" must be an object of string values; the file was written by a broken "
                   "tool; re-save it",
                   path);
}

static int compare_by_offset(const void *a, const void *b) {
    const weft_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return strcmp(x->name, y->name); // zero-sized tensors share offsets; keep the order deterministic
}

static void parse_header(weft_safetensors *st, const char *header, size_t len) {
    const char *path = st->path;
    json_error_t err;
    // Duplicate names would make "find" ambiguous; the reference rejects them too.
    json_t *root = json_loadb(header, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        weft_fatal("%s: the header is not valid JSON (%s, at byte %d of %zu); the file is corrupt or not a "
                   "safetensors file; re-download or re-save it",
                   path, err.text, err.position, len);
    if (!json_is_object(root))
        weft_fatal("%s: the header is not a JSON object; the file is corrupt or not a safetensors file; "
                   "re-download or re-save it",
                   path);

    size_t count = json_object_size(root);
    json_t *meta = json_object_get(root, METADATA_KEY);
    if (meta) {
        check_metadata(path, meta);
        count--;
    }
    st->tensors = weft_alloc(count * sizeof *st->tensors);
    const char *name;
    json_t *entry;
    json_object_foreach(root, name, entry) {
        if (strcmp(name, METADATA_KEY) != 0) parse_tensor(path, name, entry, &st->tensors[st->n++]);
    }
    json_decref(root);
    qsort(st->tensors, (size_t)st->n, sizeof *st->tensors, compare_by_offset);
}

// Every tensor must lie inside the data section; the furthest end tells how much data the header
// promised, which is what a truncated download lacks.
static void check_data_extent(const weft_safetensors *st, size_t data_len) {
    size_t need = 0;
    const char *last = NULL;
    for (int i = 0; i < st->n; i++) {
        // Sorted by offset: each tensor must start at or after the previous one's end, or two
        // tensors would share bytes (a write to one changing the other).
        const weft_st_tensor *t = &st->tensors[i], *prev = i ? &st->tensors[i - 1] : NULL;
        if (prev && t->offset < prev->offset + prev->nbytes)
            weft_fatal("%s: tensors \"%s\" and \"%s\" overlap (bytes [%zu, %zu) and [%zu, %zu)); "
                       "the file is corrupt or was written by a broken tool; re-download or re-save it",
                       st->path, prev->name, t->name, prev->offset, prev->offset + prev->nbytes,
                       t->offset, t->offset + t->nbytes);
        size_t end = st->tensors[i].offset + st->tensors[i].nbytes;
        if (end > need) need = end, last = st->tensors[i].name;
    }
    if (need > data_len)
        weft_fatal("%s: the file is truncated (header says %zu data bytes, up to the end of tensor \"%s\"; file has "
                   "%zu); re-download or re-save it",
                   st->path, need, last, data_len);
}

static void file_identity(const struct stat *sb, uint64_t id[4]) {
    id[0] = (uint64_t)sb->st_dev, id[1] = (uint64_t)sb->st_ino, id[2] = (uint64_t)sb->st_size;
    id[3] = (uint64_t)sb->st_mtim.tv_sec * 1000000000u + (uint64_t)sb->st_mtim.tv_nsec;
}

// Maps a file whose header was read and checked, after making sure it is still that file (the
// header was read through a descriptor closed before the checks, which may end the process).
static void map_file(weft_st_file *f) {
    struct stat now;
    uint64_t id[4];
    int fd = open_regular(f->path, &now);
    file_identity(&now, id);
    CHECK_CLOSING(fd, memcmp(id, f->identity, sizeof id) == 0,
                  "%s: the file changed while weft read it; wait until it is written, then run again", f->path);
    size_t len = (size_t)now.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        weft_fatal("%s: cannot map the file (%s, %zu bytes); check the memory limits (ulimit -v)", f->path,
                   strerror(errno), len);
    f->map = map, f->map_len = len;
    f->data = (const unsigned char *)map + f->data_start;
}

void weft_safetensors_map(weft_safetensors *st) {
    for (int i = 0; i < st->n_files; i++)
        if (!st->files[i].map) map_file(&st->files[i]);
}

weft_safetensors *weft_safetensors_read_header(const char *path) {
    struct stat sb;
    int fd = open_regular(path, &sb);
    uint64_t file_len = (uint64_t)sb.st_size;
    CHECK_CLOSING(fd, file_len >= 8,
                  "%s: the file is %llu bytes, too short to hold the 8-byte header length; it is truncated or not "
                  "a safetensors file; re-download or re-save it",
                  path, (unsigned long long)file_len);
    unsigned char len_bytes[8];
    read_at(fd, path, len_bytes, 8, 0, "header length");
    uint64_t header_len = read_le64(len_bytes);
    CHECK_CLOSING(fd, header_len <= file_len - 8,
                  "%s: the header length field says %llu bytes but only %llu follow it; the file is truncated or "
                  "not a safetensors file; re-download or re-save it",
                  path, (unsigned long long)header_len, (unsigned long long)(file_len - 8));
    CHECK_CLOSING(fd, header_len <= MAX_HEADER_BYTES,
                  "%s: the header length field says %llu bytes, above the format's 100 MB limit; the file is "
                  "corrupt or not a safetensors file; re-download or re-save it",
                  path, (unsigned long long)header_len);
    char *header = weft_alloc((size_t)header_len + 1);
    read_at(fd, path, header, (size_t)header_len, 8, "header");
    close(fd);

    weft_safetensors *st = weft_alloc(sizeof *st);
    st->path = weft_strdup(path);
    parse_header(st, header, (size_t)header_len);
    weft_free(header);
    size_t data_start = (size_t)(8 + header_len);
    check_data_extent(st, (size_t)file_len - data_start);
    st->files = weft_alloc(sizeof *st->files);
    st->n_files = 1;
    st->files[0] = (weft_st_file){.path = weft_strdup(path), .data_len = (size_t)file_len - data_start,
                                  .data_start = data_start};
    file_identity(&sb, st->files[0].identity);
    return st;
}

// Mapped, not read: a multi-gigabyte checkpoint is never copied into weft's memory, and each
// tensor is converted straight from the page cache into the parameter buffer.
weft_safetensors *weft_safetensors_load(const char *path) {
    weft_safetensors *st = weft_safetensors_read_header(path);
    weft_safetensors_map(st);
    return st;
}

const weft_st_tensor *weft_safetensors_find(const weft_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

void weft_safetensors_free(weft_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) weft_free(st->tensors[i].name);
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].map_len);
        weft_free(st->files[i].path);
    }
    weft_free(st->files);
    weft_free(st->tensors);
    weft_free(st->path);
    weft_free(st);
}

// ---------------------------------------------------------------------------------------------
// conversion to f32

static float bits_to_f32(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// IEEE half to single, exact for every input (subnormals, infinities and NaNs included).
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13)); // rebias 15 -> 127
    float mag = (float)mant * 0x1p-24f;                                           // zero or subnormal
    return sign ? -mag : mag;
}

void weft_safetensors_read_f32(const weft_safetensors *st, const weft_st_tensor *t, float *dst) {
    const dtype_info *info = find_dtype(t->dtype);
    if (!info || info->kind == KIND_OTHER)
        weft_fatal("%s: tensor \"%s\" is %s, which cannot be read as floating point; weft reads F32, BF16, F16 "
                   "and F64 weights",
                   st->path, t->name, t->dtype);
    WEFT_CHECK(t->file >= 0 && t->file < st->n_files && st->files[t->file].map &&
                   t->offset + t->nbytes <= st->files[t->file].data_len,
               "%s: tensor \"%s\" lies outside the data section", st->path, t->name);
    const unsigned char *src = st->files[t->file].data + t->offset;
    int64_t n = weft_st_numel(t);
    if (info->kind == KIND_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    // memcpy per element: offsets in the file need not be aligned to the element size.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        if (info->kind == KIND_F64) {
            double d;
            memcpy(&d, src + i * 8, 8);
            dst[i] = (float)d;
        } else {
            uint16_t h;
            memcpy(&h, src + i * 2, 2);
            dst[i] = info->kind == KIND_BF16 ? bits_to_f32((uint32_t)h << 16) : f16_to_f32(h);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// writing

typedef struct {
    char *name;
    int ndim;
    int64_t shape[WEFT_ST_MAX_DIMS];
    float *data;
    size_t nbytes;
} writer_tensor;

struct weft_safetensors_writer {
    writer_tensor *tensors;
    int n, cap;
    json_t *metadata; // an object; jansson keeps insertion order
};

weft_safetensors_writer *weft_safetensors_writer_create(void) {
    weft_safetensors_writer *w = weft_alloc(sizeof *w);
    w->metadata = json_object();
    if (!w->metadata) weft_fatal("out of memory creating a safetensors writer");
    return w;
}

void weft_safetensors_writer_add_f32(weft_safetensors_writer *w, const char *name, const float *data, int ndim,
                                     const int64_t *shape) {
    WEFT_CHECK(ndim >= 0 && ndim <= WEFT_ST_MAX_DIMS, "safetensors writer: tensor \"%s\" has %d dims (0..%d allowed)",
               name, ndim, WEFT_ST_MAX_DIMS);
    WEFT_CHECK(strcmp(name, METADATA_KEY) != 0, "safetensors writer: \"%s\" is reserved and cannot name a tensor",
               name);
    for (int i = 0; i < w->n; i++)
        WEFT_CHECK(strcmp(w->tensors[i].name, name) != 0, "safetensors writer: tensor \"%s\" added twice", name);
    w->tensors = weft_grow(w->tensors, w->n, &w->cap, sizeof *w->tensors, 16);

    writer_tensor *t = &w->tensors[w->n++];
    t->name = weft_strdup(name);
    t->ndim = ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        WEFT_CHECK(shape[i] >= 0, "safetensors writer: tensor \"%s\" has negative dim %lld", name, (long long)shape[i]);
        t->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    t->nbytes = numel * sizeof(float);
    t->data = weft_alloc(t->nbytes);
    if (t->nbytes) memcpy(t->data, data, t->nbytes);
}

void weft_safetensors_writer_add_metadata(weft_safetensors_writer *w, const char *key, const char *value) {
    if (json_object_set_new(w->metadata, key, json_string(value)) != 0)
        weft_fatal("safetensors writer: metadata \"%s\" is not valid UTF-8 (key or value)", key);
}

// The header in the reference's shape: metadata first (if any), then one entry per tensor of
// [first, end) with offsets assigned back to back in the order added.
static json_t *build_header(const weft_safetensors_writer *w, int first, int end) {
    json_t *root = json_object();
    if (json_object_size(w->metadata) > 0) json_object_set(root, METADATA_KEY, w->metadata);
    size_t offset = 0;
    for (int i = first; i < end; i++) {
        const writer_tensor *t = &w->tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                  (json_int_t)offset, (json_int_t)(offset + t->nbytes));
        if (!entry || json_object_set_new(root, t->name, entry) != 0)
            weft_fatal("safetensors writer: cannot encode tensor \"%s\" (is its name valid UTF-8?)", t->name);
        offset += t->nbytes;
    }
    return root;
}

bool weft_safetensors_writer_save_range(weft_safetensors_writer *w, int first, int end, const char *path) {
    WEFT_CHECK(first >= 0 && first <= end && end <= w->n, "safetensors writer: range [%d, %d) of %d tensors",
               first, end, w->n);
    json_t *header = build_header(w, first, end);
    // Compact separators like the reference; jansson keeps keys in insertion order.
    const size_t flags = JSON_COMPACT | JSON_PRESERVE_ORDER;
    size_t json_len = json_dumpb(header, NULL, 0, flags);
    if (json_len == 0) weft_fatal("safetensors writer: could not encode the header");
    // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
    size_t header_len = (json_len + 7) / 8 * 8;
    unsigned char *head = weft_alloc(8 + header_len);
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)header_len >> (8 * i));
    json_dumpb(header, (char *)head + 8, json_len, flags);
    json_decref(header);
    memset(head + 8 + json_len, ' ', header_len - json_len);
    // The tensors are written from where they are: no buffer of the whole file.
    int n = 1 + end - first;
    const void **parts = weft_alloc(sizeof *parts * (size_t)n);
    size_t *lens = weft_alloc(sizeof *lens * (size_t)n);
    parts[0] = head, lens[0] = 8 + header_len;
    for (int i = first; i < end; i++) {
        parts[1 + i - first] = w->tensors[i].data;
        lens[1 + i - first] = w->tensors[i].nbytes;
    }
    bool ok = weft_write_parts_atomic(path, n, parts, lens);
    weft_free(parts);
    weft_free(lens);
    weft_free(head);
    return ok;
}

bool weft_safetensors_writer_save(weft_safetensors_writer *w, const char *path) {
    return weft_safetensors_writer_save_range(w, 0, w->n, path);
}

int weft_safetensors_writer_count(const weft_safetensors_writer *w) { return w->n; }
const char *weft_safetensors_writer_name(const weft_safetensors_writer *w, int i) { return w->tensors[i].name; }
size_t weft_safetensors_writer_nbytes(const weft_safetensors_writer *w, int i) { return w->tensors[i].nbytes; }

void weft_safetensors_writer_free(weft_safetensors_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        weft_free(w->tensors[i].name);
        weft_free(w->tensors[i].data);
    }
    weft_free(w->tensors);
    json_decref(w->metadata);
    weft_free(w);
}
