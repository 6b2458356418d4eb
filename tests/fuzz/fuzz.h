// Shared frame of weft's libFuzzer targets (tests/fuzz/fuzz_<reader>.c, built with clang by
// `make fuzz` and the CMake option WEFT_FUZZ).
//
// weft's readers take paths, so each input is written to a file in a per-process temporary
// directory first. Bad input ends in weft_fatal: the fatal hook longjmps back here, so that one
// clean "weft: error:" line counts as a handled input, not as a crash, and the next input runs in
// the same process. What a reader allocated before the error is not freed (a real run exits
// there), which is why the targets run with -detect_leaks=0. Crashes, ASan reports (out-of-bounds
// reads, use after free) and UBSan reports (-fno-sanitize-recover) still stop the fuzzer.
#ifndef WEFT_TESTS_FUZZ_H
#define WEFT_TESTS_FUZZ_H

#include "core/core.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static jmp_buf weft_fuzz_jmp;
static char weft_fuzz_dir[64];

static void weft_fuzz_on_fatal(void) { longjmp(weft_fuzz_jmp, 1); }

// Creates the temporary directory and installs the fatal hook; call from LLVMFuzzerInitialize.
static inline void weft_fuzz_init(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(weft_fuzz_dir, sizeof weft_fuzz_dir, "%s/weft_fuzz_XXXXXX",
             tmp && strlen(tmp) < 40 ? tmp : "/tmp");
    if (!mkdtemp(weft_fuzz_dir)) abort();
    weft_set_fatal_hook(weft_fuzz_on_fatal);
}

// Writes n bytes to <dir>/<name> (plainly: an atomic write's temporary name would add nothing)
// and returns the path, valid until the next call with the same name.
static inline const char *weft_fuzz_file(const char *name, const void *data, size_t n) {
    static char path[8][128];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 128, "%s/%s", weft_fuzz_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) abort();
    return p;
}

// After an error: closes the descriptors a reader left open on the input files (a real run exits
// there). Leaked memory is bounded per input; descriptors are not, and past the process's limit
// (1024) every later open fails and libFuzzer aborts.
static inline void weft_fuzz_close_inputs(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    size_t n = strlen(weft_fuzz_dir);
    for (struct dirent *e; (e = readdir(d));) {
        char link[64], target[256];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len > 0 && (size_t)len > n && strncmp(target, weft_fuzz_dir, n) == 0)
            close(atoi(e->d_name));
    }
    closedir(d);
}

// Runs the body with weft_fatal turned into a return: WEFT_FUZZ_RUN({ ... }); volatile is not
// needed because nothing declared outside the body is read after an error.
#define WEFT_FUZZ_RUN(...)                                                                         \
    do {                                                                                           \
        if (setjmp(weft_fuzz_jmp) == 0) {                                                          \
            __VA_ARGS__                                                                            \
        } else {                                                                                   \
            weft_fuzz_close_inputs();                                                              \
        }                                                                                          \
    } while (0)

#endif
