// weft needs a row-stable sgemm: every row of a product gets the same bits whatever other rows
// share the call, or a micro-batch split, a prefill in pieces or a decode batch would change the
// forward pass's bits (DESIGN.md section 9 and 11). Debian 12's OpenBLAS 0.3.21 gives that with
// its SkylakeX kernels (with the padding in ops.c) and its Sandybridge (AVX) kernels, but not with
// the Haswell/Zen (AVX2 + FMA) sgemm kernel, which sums a row's products in an order that depends
// on where the row falls in its block of rows (measured: logits 5e-6 apart between 1 and 2
// micro-batches on a Zen 5; on a Zen 3 rows 6-11 of every 12 differ from rows 0-5 in some
// columns). It also misdetects recent CPUs: some Xeons fall back to "Prescott" kernels, about 5x
// slower, and AMD Zen 4 and Zen 5 get the Haswell kernels. So weft always runs the SkylakeX
// kernels on an AVX-512 CPU and the Sandybridge ones on an AVX/AVX2 CPU without AVX-512 (about 80%
// of the Haswell kernel's sgemm speed on a Zen 3: the price of the contract). The core type can
// only be chosen through OPENBLAS_CORETYPE before the library initialises, which happens before
// main(), so when the choice differs we set the variable and re-execute the same program once.
#include "backend/cpu/blas_setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

char *openblas_get_corename(void);

// The fastest row-stable core type this CPU runs; NULL where OpenBLAS's own choice stands.
static const char *row_stable_coretype(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SKYLAKEX";
    if (__builtin_cpu_supports("avx")) return "SANDYBRIDGE";
    return NULL;
}

// Whether the core OpenBLAS runs (chosen by the environment or by its own detection) is the
// wanted one; for SkylakeX, any of OpenBLAS's AVX-512 core types, which share its sgemm kernel.
static bool runs_core(const char *want, const char *name) {
    if (!name) return false;
    if (!strcasecmp(want, "SKYLAKEX"))
        return !strcasecmp(name, "skylakex") || !strcasecmp(name, "cooperlake") ||
               !strcasecmp(name, "sapphirerapids");
    return !strcasecmp(name, want);
}

// Whether OpenBLAS must be restarted on another core type. A value from the environment is
// overridden too: some machines set OPENBLAS_CORETYPE=Haswell for every program.
static bool needs_other_core(const char *want) {
    if (!want) return false;
    const char *chosen = getenv("OPENBLAS_CORETYPE");
    return !runs_core(want, chosen ? chosen : openblas_get_corename());
}

void weft_blas_fix_coretype(void) {
    const char *want = row_stable_coretype();
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
    // exec failed: carry on with OpenBLAS's own kernels rather than stop.
}

const char *weft_blas_corename(void) { return openblas_get_corename(); }

bool weft_blas_rows_stable_unpadded(void) {
    return !strcasecmp(openblas_get_corename(), "sandybridge");
}
