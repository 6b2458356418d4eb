// Shared frame of weft's libFuzzer targets (tests/fuzz/fuzz_<reader>.c, built with clang by
// `make fuzz` and the CMake option WEFT_FUZZ).
//
// weft's readers take paths, so each input is written to a file in a per-process temporary
// directory first. Bad input ends in weft_fatal: the fatal hook longjmps back here, so that one
// clean "weft: error:" line counts as a handled input, not as a crash, and the next input runs in
// the same process. Crashes, ASan reports (out-of-bounds reads, use after free) and UBSan reports
// (-fno-sanitize-recover) stop the fuzzer.
//
// Leaks: what a reader allocated before an error is not freed (a real run exits there), so each
// body runs first with LeakSanitizer ignoring its allocations. An input the reader rejects is done
// then. An input it accepts runs again, deterministically down the same path, with leak tracking
// on and the harness freeing all the reader returned: if that run made more allocations than it
// freed, a leak check runs, and a leak on the accepted path aborts the input (the LeakSanitizer
// report above libFuzzer's "deadly signal"; the input lands in its crash- artifact). libFuzzer's
// own per-input check stays off (-detect_leaks=0): it would count the rejected inputs'
// allocations and switch itself off after 1,000 of them. LeakSanitizer's check at exit
// (ASAN_OPTIONS=detect_leaks=1) still covers everything not ignored.
#ifndef WEFT_TESTS_FUZZ_H
#define WEFT_TESTS_FUZZ_H

#include "core/core.h"

#include <dirent.h>
#include <sanitizer/allocator_interface.h>
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static jmp_buf weft_fuzz_jmp;
static char weft_fuzz_dir[64];

static volatile bool weft_fuzz_accepted; // volatile: set between setjmp and a longjmp
static bool weft_fuzz_counting;
static size_t weft_fuzz_mallocs, weft_fuzz_frees;
static size_t weft_fuzz_n_rejected, weft_fuzz_n_accepted, weft_fuzz_n_checks;

static void weft_fuzz_on_fatal(void) { longjmp(weft_fuzz_jmp, 1); }

static void weft_fuzz_malloc_hook(const volatile void *p, size_t n) {
    if (__atomic_load_n(&weft_fuzz_counting, __ATOMIC_RELAXED))
        __atomic_fetch_add(&weft_fuzz_mallocs, 1, __ATOMIC_RELAXED);
}

static void weft_fuzz_free_hook(const volatile void *p) {
    if (__atomic_load_n(&weft_fuzz_counting, __ATOMIC_RELAXED))
        __atomic_fetch_add(&weft_fuzz_frees, 1, __ATOMIC_RELAXED);
}

// At exit: the directory goes, and one line on stdout (stderr is closed by -close_fd_mask=2) says
// how many bodies were rejected and accepted, and how many leak checks the accepted ones ran, so
// a run's "0 leaks" can be seen to have covered accepted inputs.
static void weft_fuzz_exit(void) {
    weft_remove_tree(weft_fuzz_dir);
    printf("weft fuzz: %zu rejected, %zu accepted, %zu leak checks\n", weft_fuzz_n_rejected,
           weft_fuzz_n_accepted, weft_fuzz_n_checks);
    fflush(stdout);
}

// Creates the temporary directory (removed at exit) and installs the fatal and allocation hooks;
// call from LLVMFuzzerInitialize. The directory is in $TMPDIR, else in /dev/shm where there is
// one: rewriting an input file on the disk's file system (ext4) blocked about 1 ms per input, six
// times the whole run of a small reader; memory (tmpfs) does not.
static inline void weft_fuzz_init(void) {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || strlen(tmp) >= 40) tmp = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(weft_fuzz_dir, sizeof weft_fuzz_dir, "%s/weft_fuzz_XXXXXX", tmp);
    if (!mkdtemp(weft_fuzz_dir)) abort();
    atexit(weft_fuzz_exit);
    weft_set_fatal_hook(weft_fuzz_on_fatal);
    if (!__sanitizer_install_malloc_and_free_hooks(weft_fuzz_malloc_hook, weft_fuzz_free_hook))
        abort();
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

// Counts the allocations and frees of an accepted input's second run.
static inline void weft_fuzz_count_start(void) {
    weft_fuzz_mallocs = weft_fuzz_frees = 0;
    __atomic_store_n(&weft_fuzz_counting, true, __ATOMIC_RELAXED);
}

// Ends the count; more allocations than frees means a possible leak, which a LeakSanitizer check
// (a scan of the whole heap, so only then) confirms or clears.
static inline void weft_fuzz_check_leaks(void) {
    __atomic_store_n(&weft_fuzz_counting, false, __ATOMIC_RELAXED);
    weft_fuzz_n_accepted++;
    if (weft_fuzz_mallocs <= weft_fuzz_frees) return;
    weft_fuzz_n_checks++;
    if (__lsan_do_recoverable_leak_check()) {
        __sanitizer_report_error_summary("SUMMARY: weft fuzz: an accepted input leaked (above)");
        abort();
    }
}

static inline void weft_fuzz_nondeterministic(void) {
    __sanitizer_report_error_summary("SUMMARY: weft fuzz: an accepted input failed when run again");
    abort();
}

// Runs the body with weft_fatal turned into a return: WEFT_FUZZ_RUN({ ... }). The body runs with
// its allocations ignored by LeakSanitizer; if it ends in an error, the descriptors left open on
// the inputs are closed and that is all, else it runs again with leaks checked (see the top).
// Nothing declared outside the body is read after an error, so it needs no volatile.
#define WEFT_FUZZ_RUN(...)                                                                         \
    do {                                                                                           \
        weft_fuzz_accepted = false;                                                                \
        __lsan_disable();                                                                          \
        if (setjmp(weft_fuzz_jmp) == 0) {                                                          \
            __VA_ARGS__                                                                            \
            weft_fuzz_accepted = true;                                                             \
        }                                                                                          \
        __lsan_enable();                                                                           \
        if (!weft_fuzz_accepted) {                                                                 \
            weft_fuzz_n_rejected++;                                                                \
            weft_fuzz_close_inputs();                                                              \
        } else {                                                                                   \
            weft_fuzz_count_start();                                                               \
            if (setjmp(weft_fuzz_jmp) == 0) {                                                      \
                __VA_ARGS__                                                                        \
            } else {                                                                               \
                weft_fuzz_nondeterministic();                                                      \
            }                                                                                      \
            weft_fuzz_check_leaks();                                                               \
        }                                                                                          \
    } while (0)

#endif
