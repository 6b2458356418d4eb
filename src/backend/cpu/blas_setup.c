// Debian 12's OpenBLAS 0.3.21 does not recognise recent AVX-512 CPUs: some Xeons fall back to its
// "Prescott" kernels, about 5x slower for sgemm, and AMD Zen 4 and Zen 5 get its "Haswell" (AVX2)
// kernels. Speed is half the problem: the Haswell sgemm kernel sums a row's products in an order
// that depends on where the row falls in its block of rows, so a micro-batch split changes the
// forward pass's bits (measured on a Zen 5: logits 5e-6 apart between 1 and 2 micro-batches), while
// the SkylakeX kernel gives every row the same bits in any call (with the padding in ops.c). On an
// AVX-512 CPU weft therefore always uses the SkylakeX kernels. The core type can only be chosen
// through OPENBLAS_CORETYPE before the library initialises, which happens before main(), so when the
// choice differs we set the variable and re-execute the same program once.
#include "backend/cpu/blas_setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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

// OpenBLAS's AVX-512 core types: every one runs the row-stable SkylakeX sgemm kernel.
static bool is_avx512_core(const char *name) {
    return name && (strcasecmp(name, "skylakex") == 0 || strcasecmp(name, "cooperlake") == 0 ||
                    strcasecmp(name, "sapphirerapids") == 0);
}

// Whether OpenBLAS must be restarted on another core type: its own detection fell back to a slow
// one, or an AVX-512 CPU runs non-AVX-512 kernels, whoever chose them (the environment of some
// machines sets OPENBLAS_CORETYPE=Haswell for every program).
static bool needs_other_core(const char *want) {
    if (!want) return false;
    const char *chosen = getenv("OPENBLAS_CORETYPE");
    if (!strcmp(want, "SKYLAKEX")) return !is_avx512_core(chosen ? chosen : openblas_get_corename());
    return !chosen && is_fallback_core(openblas_get_corename());
}

void weft_blas_fix_coretype(void) {
    const char *want = best_coretype();
    if (!needs_other_core(want)) return; // after our own re-exec, the core is the one we chose
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
