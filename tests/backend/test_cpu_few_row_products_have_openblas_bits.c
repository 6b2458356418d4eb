// The CPU backend's own kernel for products of a few rows (backend/cpu/few_rows.c, a decode step's
// matmuls) gives the bits of OpenBLAS's regular kernel on one thread, element for element, on the
// shapes of the tests' and benchmarks' models: K of one block, of Q to 2Q (split in two) and of
// many blocks, N in whole and partial 16-column panels, 1 to 64 rows, B either way (x W^T only
// where OpenBLAS runs its SkylakeX kernels), alpha and beta other than 1 and 0; B's panels packed
// per call and packed ahead. That is what keeps a decoded token's log-prob equal to the trainer's.
// Where OpenBLAS runs kernels whose order the kernel does not know, or in a build without AVX, it
// is not used and the test is skipped (exit 77).
#include <omp.h>

#include "backend/cpu/blas_setup.h"
#include "backend/cpu/internal.h"
#include "finite_difference.h"

// OpenBLAS's regular kernel on one thread (inside a parallel region it never threads), padded
// past its small-matrix kernels: what few_rows.c replaces. Its threaded driver splits K
// otherwise, which is why weft never uses it. On thread 0: the padding uses the backend's
// per-thread scratch, of which there are OMP_NUM_THREADS.
static void openblas_one_thread(bool tb, int m, int n, int k, float alpha, const float *a,
                                const float *b, float beta, float *c) {
#pragma omp parallel num_threads(2)
#pragma omp master
    weft_cpu_openblas_product(B, tb, m, n, k, alpha, a, k, b, tb ? k : n, beta, c, n);
}

static size_t elements_differing(const float *x, const float *y, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(x + i, y + i, sizeof(float)) != 0;
    return d;
}

static void check_shape(const weft_cpu_few_rows_kind *kind, int n, int k, bool tb, float alpha,
                        float beta) {
    const int rows[] = {1, 2, 3, 4, 5, 7, 12, 33, 64};
    enum { ROW_COUNTS = sizeof rows / sizeof *rows, MAX_ROWS = 64 };
    float *a = host_normal((size_t)MAX_ROWS * k, 0, 1), *b = host_normal((size_t)n * k, 0, 1);
    float *c0 = host_normal((size_t)MAX_ROWS * n, 0, 1);
    float *want = weft_alloc(sizeof(float) * MAX_ROWS * n), *got = weft_alloc(sizeof(float) * MAX_ROWS * n);
    size_t differing = 0;
    float *panels = weft_alloc(sizeof(float) * weft_cpu_few_rows_panel_floats(n, k));
    weft_cpu_few_rows_pack(tb, n, k, b, tb ? k : n, panels);
    for (int i = 0; i < ROW_COUNTS; i++) {
        size_t nc = (size_t)rows[i] * n;
        memcpy(want, c0, sizeof(float) * nc), memcpy(got, c0, sizeof(float) * nc);
        openblas_one_thread(tb, rows[i], n, k, alpha, a, b, beta, want);
        weft_cpu_few_rows_product(kind, tb, rows[i], n, k, alpha, a, k, b, tb ? k : n,
                                  (weft_cpu_panels){0}, beta, got, n);
        differing += elements_differing(got, want, nc);
        memcpy(got, c0, sizeof(float) * nc); // and from panels packed ahead (the same next)
        weft_cpu_few_rows_product(kind, tb, rows[i], n, k, alpha, a, k, b, tb ? k : n,
                                  (weft_cpu_panels){panels, panels, n}, beta, got, n);
        differing += elements_differing(got, want, nc);
    }
    char what[224];
    snprintf(what, sizeof what, "few-row product (panels packed per call, and ahead) vs OpenBLAS "
             "%s, 1-64 rows, N=%d K=%d trans_b=%d alpha=%g beta=%g: elements differing",
             weft_blas_corename(), n, k, tb, alpha, beta);
    report(what, (double)differing, 0);
    weft_free(a), weft_free(b), weft_free(c0), weft_free(want), weft_free(got), weft_free(panels);
}

int main(void) {
    fd_begin();
    double t0 = weft_now_seconds();
    weft_cpu_few_rows_kind kind = weft_cpu_few_rows_kind_for(weft_blas_corename());
    if (!kind.available) {
        printf("OpenBLAS runs its %s kernels here, whose order few_rows.c does not reproduce (or "
               "this build has no AVX): the backend leaves these products to OpenBLAS; skipped\n",
               weft_blas_corename());
        weft_backend_destroy(B);
        return 77;
    }
    report("start-up agreement check (weft_cpu_few_rows_agree) says no",
           !weft_cpu_few_rows_agree(B, &kind), 0);
    const int shapes[][2] = {{64, 128}, {257, 128}, {256, 688}, {688, 256}, {1408, 512},
                             {512, 1408}, {2048, 256}, {96, 3000}, {80, 900}};
    int last_tb = kind.untransposed_b ? 0 : 1;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tb = 1; tb >= last_tb; tb--) check_shape(&kind, shapes[s][0], shapes[s][1], tb, 1.0f, 0.0f);
    check_shape(&kind, 257, 688, true, 0.5f, 1.0f);
    check_shape(&kind, 257, 688, !kind.untransposed_b, -2.0f, 0.75f);
    return fd_end(t0);
}
