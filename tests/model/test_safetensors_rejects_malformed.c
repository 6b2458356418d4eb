// Every kind of malformed or truncated safetensors file ends the process with status 1 and one
// line "weft: error: <path>: ..." on stderr, never a crash, a hang or a silent partial load.
#include "core/core.h"
#include "model/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                   \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

// Children end in weft_fatal with the loader's buffers still live, by design; under LeakSanitizer
// that would turn exit status 1 into 23, so the child stops tracking its own allocations.
extern void __lsan_disable(void) __attribute__((weak));

static char dir[64];
static int n_files;
static char files[32][128];

static const char *temp_path(const char *name) {
    CHECK(n_files < 32);
    char *p = files[n_files++];
    snprintf(p, sizeof files[0], "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t len) {
    CHECK(weft_write_file_atomic(path, data, len));
}

// A file with the given header text (unpadded) followed by data_len zero bytes.
static const char *write_with_header(const char *name, const char *json, size_t data_len) {
    size_t json_len = strlen(json), total = 8 + json_len + data_len;
    unsigned char *buf = weft_alloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)json_len >> (8 * i));
    memcpy(buf + 8, json, json_len);
    const char *path = temp_path(name);
    write_bytes(path, buf, total);
    weft_free(buf);
    return path;
}

static void load(const char *path) {
    weft_safetensors *st = weft_safetensors_load(path);
    weft_safetensors_free(st);
}

static void read_first_as_f32(const char *path) {
    weft_safetensors *st = weft_safetensors_load(path);
    float x[4];
    weft_safetensors_read_f32(st, &st->tensors[0], x);
    weft_safetensors_free(st);
}

// Runs fn(path) in a child and checks it fails the weft way: exit status 1 and exactly one line
// of stderr, "weft: error: ...", naming the path and containing `expect`.
static void expect_fatal(void (*fn)(const char *), const char *path, const char *expect) {
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], STDERR_FILENO);
        if (__lsan_disable) __lsan_disable();
        fn(path);
        _exit(0); // returned normally: the malformed input was accepted
    }
    close(pipefd[1]);
    char err[4096];
    size_t len = 0;
    ssize_t r;
    while ((r = read(pipefd[0], err + len, sizeof err - 1 - len)) > 0) len += (size_t)r;
    close(pipefd[0]);
    err[len] = '\0';
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);

    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 1 && strncmp(err, "weft: error: ", 13) == 0 &&
              strstr(err, path) && strstr(err, expect) && len > 0 && strchr(err, '\n') == err + len - 1;
    if (!ok) {
        fprintf(stderr, "case %s (expecting \"%s\"): status %d, stderr:\n%s\n", path, expect, status, err);
        exit(1);
    }
    printf("%s", err);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/weft_st_XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
    CHECK(mkdtemp(dir) != NULL);

    // A valid file cut inside its data section.
    float values[100];
    for (int i = 0; i < 100; i++) values[i] = (float)i;
    weft_safetensors_writer *w = weft_safetensors_writer_create();
    weft_safetensors_writer_add_f32(w, "w", values, 2, (const int64_t[]){10, 10});
    const char *good = temp_path("good.safetensors");
    CHECK(weft_safetensors_writer_save(w, good));
    weft_safetensors_writer_free(w);
    size_t len;
    char *bytes = weft_read_file(good, &len);
    CHECK(bytes && len > 400);
    const char *cut = temp_path("truncated.safetensors");
    write_bytes(cut, bytes, len - 100);
    expect_fatal(load, cut, "truncated (header says 400 data bytes");

    // Shorter than the length field itself.
    const char *tiny = temp_path("tiny.safetensors");
    write_bytes(tiny, bytes, 5);
    expect_fatal(load, tiny, "too short");

    // Header length larger than the file.
    const unsigned char big_len[16] = {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'};
    const char *bad_len = temp_path("bad_length.safetensors");
    write_bytes(bad_len, big_len, sizeof big_len);
    expect_fatal(load, bad_len, "header length");
    weft_free(bytes);

    expect_fatal(load, write_with_header("not_json.safetensors", "this is not json", 0), "not valid JSON");
    expect_fatal(load, write_with_header("array.safetensors", "[1, 2, 3]", 0), "not a JSON object");
    expect_fatal(load,
                 write_with_header("out_of_range.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[1000,1016]}}", 16),
                 "truncated");
    expect_fatal(load,
                 write_with_header("reversed.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 16),
                 "data_offsets");
    expect_fatal(load,
                 write_with_header("inconsistent.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 16),
                 "needs 8 bytes");
    expect_fatal(load,
                 write_with_header("bad_dtype.safetensors",
                                   "{\"w\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,2]}}", 16),
                 "dtype \"Q7\"");
    expect_fatal(load, write_with_header("no_dtype.safetensors", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 16),
                 "dtype");
    expect_fatal(load,
                 write_with_header("bad_shape.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 16),
                 "shape");
    expect_fatal(load,
                 write_with_header("huge_shape.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                                   "\"data_offsets\":[0,0]}}",
                                   16),
                 "overflows");
    expect_fatal(load, write_with_header("entry_not_object.safetensors", "{\"w\":[1,2]}", 0), "not a JSON object");
    expect_fatal(load, write_with_header("bad_metadata.safetensors", "{\"__metadata__\":{\"k\":1}}", 0),
                 "__metadata__");
    expect_fatal(load,
                 write_with_header("duplicate.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                   "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                                   8),
                 "not valid JSON");
    expect_fatal(load, temp_path("does_not_exist.safetensors"), "cannot open");
    expect_fatal(
        read_first_as_f32,
        write_with_header("int.safetensors", "{\"i\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
        "I32");

    for (int i = 0; i < n_files; i++) unlink(files[i]);
    CHECK(rmdir(dir) == 0);
    printf("ok\n");
    return 0;
}
