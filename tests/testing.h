// Shared helpers for weft's C tests: an always-on CHECK, a per-test temporary directory whose
// files are removed at the end, and EXPECT_FATAL, which runs code that must fail the weft way.
//
// Header-only on purpose: every tests/<layer>/test_*.c is its own executable (CMakeLists.txt
// globs them one by one), so there is no test library to link a .c file into; everything here is
// static and each test gets its own copy. tests/ is not on the include path (only src/ is, through
// weftlib), so a test includes this as "../testing.h".
#ifndef WEFT_TESTS_TESTING_H
#define WEFT_TESTS_TESTING_H

#include "core/core.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

// Unlike assert(), stays on in Release builds (-DNDEBUG), which is how ctest normally runs.
#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                   \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

// ---------------------------------------------------------------------------------------------
// Temporary files. weft_test_make_dir creates $TMPDIR/<prefix>_XXXXXX (or /tmp/...); every path
// handed out by weft_test_path is remembered so that weft_test_remove_dir can delete exactly what
// the test made and then require the directory to be empty. Paths must fit 128 bytes, so a long
// $TMPDIR falls back to /tmp. (mkdtemp is POSIX, declared because CMake builds as gnu17.)

enum { WEFT_TEST_MAX_FILES = 64, WEFT_TEST_PATH_MAX = 128 };

// Separate objects rather than one struct: GCC's -Wrestrict cannot tell that a snprintf from dir
// into files[i] does not overlap when both are members of the same object.
static char weft_test_dir[64] __attribute__((unused));
static int weft_test_n_files __attribute__((unused));
static char weft_test_files[WEFT_TEST_MAX_FILES][WEFT_TEST_PATH_MAX] __attribute__((unused));

static inline void weft_test_make_dir(const char *prefix) {
    const char *tmp = getenv("TMPDIR");
    snprintf(weft_test_dir, sizeof weft_test_dir, "%s/%s_XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp", prefix);
    CHECK(mkdtemp(weft_test_dir) != NULL);
}

// "<dir>/<name>", remembered for weft_test_remove_dir. The file need not exist (yet).
static inline const char *weft_test_path(const char *name) {
    CHECK(weft_test_n_files < WEFT_TEST_MAX_FILES);
    char *path = weft_test_files[weft_test_n_files++];
    CHECK(snprintf(path, WEFT_TEST_PATH_MAX, "%s/%s", weft_test_dir, name) < WEFT_TEST_PATH_MAX);
    return path;
}

// Writes len bytes to <dir>/<name> and returns the path.
static inline const char *weft_test_write_file(const char *name, const void *data, size_t len) {
    const char *path = weft_test_path(name);
    CHECK(weft_write_file_atomic(path, data, len));
    return path;
}

static inline const char *weft_test_write_text(const char *name, const char *text) {
    return weft_test_write_file(name, text, strlen(text));
}

// Deletes every file handed out (those never created are skipped) and the directory, which must
// then be empty: a stray file means the code under test left something behind.
static inline void weft_test_remove_dir(void) {
    for (int i = 0; i < weft_test_n_files; i++) unlink(weft_test_files[i]);
    CHECK(rmdir(weft_test_dir) == 0);
}

// ---------------------------------------------------------------------------------------------
// Fatal errors. weft reports bad input through weft_fatal: exit status 1 and exactly one line,
// "weft: error: <path>: ...", on stderr. A test of that runs the code in a forked child with
// stderr on a pipe, so one test process can check many bad inputs, and so a crash, an abort or
// a normal return (the bad input was accepted) are told apart from the intended failure.

// Children end in weft_fatal with the loader's buffers still live, by design; under LeakSanitizer
// that would turn exit status 1 into 23, so the child stops tracking its own allocations.
extern void __lsan_disable(void) __attribute__((weak));

// Runs fn(path) in a child and checks it fails the weft way: exit status 1 and exactly one line of
// stderr, starting "weft: error: ", containing `path` and every string of the NULL-terminated
// must_contain. On success the line is echoed to stdout (ctest's log); otherwise the test exits 1.
// Use it through EXPECT_FATAL, which builds the list.
static inline void weft_test_expect_fatal(void (*fn)(const char *), const char *path, const char *const *must_contain) {
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
        _exit(0); // returned normally: the bad input was accepted
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
              strstr(err, path) && len > 0 && strchr(err, '\n') == err + len - 1;
    for (const char *const *s = must_contain; ok && *s; s++) ok = strstr(err, *s) != NULL;
    if (!ok) {
        fprintf(stderr, "case %s (expecting", path);
        for (const char *const *s = must_contain; *s; s++) fprintf(stderr, " \"%s\"", *s);
        fprintf(stderr, "): status %d, stderr:\n%s\n", status, err);
        exit(1);
    }
    printf("%s", err);
}

// EXPECT_FATAL(fn, path, "substring", ...): fn(path) must fail the weft way with one error line
// naming path and containing each substring. path is evaluated once, so it may be the call that
// writes the bad file.
#define EXPECT_FATAL(fn, path, ...) weft_test_expect_fatal((fn), (path), (const char *const[]){__VA_ARGS__, NULL})

#endif
