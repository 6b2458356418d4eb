// Debian 12's OpenBLAS 0.3.21 does not recognise recent AVX-512 CPUs (AMD Zen 4, some Xeons) and
// falls back to its "Prescott" kernels, about 5x slower for sgemm. The core type can only be chosen
// through OPENBLAS_CORETYPE before the library initialises, which happens before main(), so when the
// detection is wrong we set the variable and re-execute the same program once.
#include "backend/cpu/blas_setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *openblas_get_corename(void);

static const char *best_coretype(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SKYLAKEX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "HASWELL";
    return NULL;
}

static bool is_fallback_core(const char *name) {
    return name && (strcasecmp(name, "prescott") == 0 || strcasecmp(name, "core2") == 0 ||
                    strcasecmp(name, "nehalem") == 0 || strcasecmp(name, "katmai") == 0);
}

void weft_blas_fix_coretype(void) {
    if (getenv("OPENBLAS_CORETYPE")) return; // the user (or our own re-exec) chose already
    const char *want = best_coretype();
    if (!want || !is_fallback_core(openblas_get_corename())) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = '\0';
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return;
    static char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    char *argv[1024];
    int argc = 0;
    for (size_t i = 0; i < len && argc < 1023; i += strlen(buf + i) + 1) argv[argc++] = buf + i;
    argv[argc] = NULL;
    fflush(NULL);
    execv(self, argv);
    // exec failed: carry on with the slow kernels rather than stop.
}

const char *weft_blas_corename(void) { return openblas_get_corename(); }
