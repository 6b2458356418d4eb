// The CPU backend's own kernel for products of a few rows (backend/cpu/few_rows.c, a decode step's
// matmuls) gives the bits of OpenBLAS's single-threaded call, element for element, on the shapes
// of the tests' and benchmarks' models: K of one block, of 384 to 768 (split in two) and of many
// blocks, N in whole and partial 16-column panels, 1 to 64 rows, B either way, alpha and beta
// other than 1 and 0; B's panels packed per call and packed ahead. That is what keeps a decoded
// token's log-prob equal to the trainer's. Where OpenBLAS runs other kernels than the Sandybridge
// ones (AVX-512 CPUs) the kernel is not used and the test is skipped (exit 77), as in a build
// without AVX.
#include <cblas.h>
#include <omp.h>

#include "backend/cpu/blas_setup.h"
#include "backend/cpu/internal.h"
#include "finite_difference.h"

// OpenBLAS on one thread (inside a parallel region it never threads): the driver whose K blocks
// few_rows.c reproduces. Its threaded driver splits K otherwise, which is why weft never uses it.
static void openblas_one_thread(bool tb, int m, int n, int k, float alpha, const float *a,
                                const float *b, float beta, float *c) {
#pragma omp parallel num_threads(2)
#pragma omp single
    cblas_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, k,
                b, tb ? k : n, beta, c, n);
}

static size_t elements_differing(const float *x, const float *y, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(x + i, y + i, sizeof(float)) != 0;
    return d;
}

static void check_shape(int n, int k, bool tb, float alpha, float beta) {
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
        weft_cpu_few_rows_product(tb, rows[i], n, k, alpha, a, k, b, tb ? k : n, NULL, beta, got,
                                  n);
        differing += elements_differing(got, want, nc);
        memcpy(got, c0, sizeof(float) * nc); // and from panels packed ahead
        weft_cpu_few_rows_product(tb, rows[i], n, k, alpha, a, k, b, tb ? k : n, panels, beta, got,
                                  n);
        differing += elements_differing(got, want, nc);
    }
    char what[192];
    snprintf(what, sizeof what, "few-row product (panels packed per call, and ahead) vs OpenBLAS, "
             "1-64 rows, N=%d K=%d trans_b=%d alpha=%g beta=%g: elements differing", n, k, tb,
             alpha, beta);
    report(what, (double)differing, 0);
    weft_free(a), weft_free(b), weft_free(c0), weft_free(want), weft_free(got), weft_free(panels);
}

int main(void) {
    fd_begin();
    double t0 = weft_now_seconds();
    if (!weft_blas_rows_stable_unpadded()) {
        printf("OpenBLAS runs its %s kernels here, not the Sandybridge ones the kernel reproduces: "
               "skipped\n", weft_blas_corename());
        weft_backend_destroy(B);
        return 77;
    }
#ifndef __AVX__
    printf("built without AVX (the kernel is AVX code; the backend then leaves these products to "
           "OpenBLAS): skipped\n");
    weft_backend_destroy(B);
    return 77;
#endif
    report("start-up agreement check (weft_cpu_few_rows_agree) says no", !weft_cpu_few_rows_agree(), 0);
    const int shapes[][2] = {{64, 128}, {257, 128}, {256, 688}, {688, 256}, {1408, 512},
                             {512, 1408}, {2048, 256}, {96, 3000}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tb = 1; tb >= 0; tb--) check_shape(shapes[s][0], shapes[s][1], tb, 1.0f, 0.0f);
    check_shape(257, 688, true, 0.5f, 1.0f);
    check_shape(257, 688, false, -2.0f, 0.75f);
    return fd_end(t0);
}
