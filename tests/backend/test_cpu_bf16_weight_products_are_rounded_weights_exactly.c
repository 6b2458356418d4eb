// The CPU backend's products against weights rounded to bf16 (backend/cpu/bf16_weights.c, what
// speculative drafts read with rollout.draft_bf16): against a float64 product of the same inputs
// with B rounded to bf16 by an independent rounding (frexp and nearbyint, ties to even), within
// fp32 accumulation; a row's bits the same whatever the rows beside it (1 to 64) and whichever
// column slice computes it; and through the backend's matmul, the bf16 path taken exactly for
// x W^T against fixed parameters while rounding is on, fp32 before, after and outside them. A
// build without AVX2 has no bf16 path (exit 77).
#include <math.h>

#include "backend/cpu/internal.h"
#include "finite_difference.h"

static const double TOL_BF16_PRODUCT = 1e-5; // fp32 sums of up to 384 terms against float64

static double bf16_of(float x) {
    int e;
    double m = frexp((double)x, &e); // x = m 2^e, 0.5 <= |m| < 1: 8 significant bits kept
    return ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

static size_t elements_differing(const float *x, const float *y, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(x + i, y + i, sizeof(float)) != 0;
    return d;
}

// C = alpha A B~^T + beta C0 in float64, B~ = B rounded to bf16: (m, n).
static void reference(int m, int n, int k, float alpha, const float *a, const float *b,
                      float beta, const float *c0, double *want) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int t = 0; t < k; t++) s += (double)a[(size_t)i * k + t] * bf16_of(b[(size_t)j * k + t]);
            want[(size_t)i * n + j] = alpha * s + (beta == 0.0f ? 0.0 : beta * (double)c0[(size_t)i * n + j]);
        }
}

static void check_shape(int n, int k, float alpha, float beta) {
    const int rows[] = {1, 2, 3, 4, 5, 6, 7, 13, 64};
    enum { ROW_COUNTS = sizeof rows / sizeof *rows, MAX_ROWS = 64 };
    float *a = host_normal((size_t)MAX_ROWS * k, 0, 1), *b = host_normal((size_t)n * k, 0, 1);
    float *c0 = host_normal((size_t)MAX_ROWS * n, 0, 1);
    float *got = weft_alloc(sizeof(float) * MAX_ROWS * n), *alone = weft_alloc(sizeof(float) * n);
    double *want = weft_alloc(sizeof(double) * MAX_ROWS * n);
    uint16_t *halves = weft_alloc(sizeof(uint16_t) * weft_cpu_bf16_halves(n, k));
    weft_cpu_bf16_pack(n, k, b, k, halves);
    reference(MAX_ROWS, n, k, alpha, a, b, beta, c0, want);
    double err = 0;
    size_t differing = 0;
    for (int r = 0; r < ROW_COUNTS; r++) {
        int m = rows[r];
        memcpy(got, c0, sizeof(float) * m * n);
        weft_cpu_bf16_product(m, n, k, alpha, a, k, halves, beta, got, n);
        double e = rel_err_d(got, want, (size_t)m * n);
        err = isnan(e) || e > err ? e : err;
        for (int i = 0; i < m; i += m > 8 ? 5 : 1) { // each row against itself alone
            memcpy(alone, c0 + (size_t)i * n, sizeof(float) * n);
            weft_cpu_bf16_product(1, n, k, alpha, a + (size_t)i * k, k, halves, beta, alone, n);
            differing += elements_differing(alone, got + (size_t)i * n, n);
        }
        if (n > 64) { // columns from 64 on, as a thread's slice computes them
            memcpy(got, c0, sizeof(float) * m * n);
            weft_cpu_bf16_product(m, n - 64, k, alpha, a, k, halves + (size_t)64 * k, beta,
                                  got + 64, n);
            for (int i = 0; i < m; i++) {
                memcpy(alone, c0 + (size_t)i * n, sizeof(float) * n);
                weft_cpu_bf16_product(1, n, k, alpha, a + (size_t)i * k, k, halves, beta, alone, n);
                differing += elements_differing(alone + 64, got + (size_t)i * n + 64, n - 64);
            }
        }
    }
    char what[160];
    snprintf(what, sizeof what, "bf16-weight product vs float64 on rounded B, 1-64 rows, N=%d "
             "K=%d alpha=%g beta=%g", n, k, alpha, beta);
    report(what, err, TOL_BF16_PRODUCT);
    snprintf(what, sizeof what, "  rows alone and column slices against the whole product, N=%d "
             "K=%d: elements differing", n, k);
    report(what, (double)differing, 0);
    weft_free(a), weft_free(b), weft_free(c0), weft_free(got), weft_free(alone), weft_free(want);
    weft_free(halves);
}

// matmul x W^T of m rows into out (m, n).
static void matmul(int m, int n, int k, const float *x, const float *w, float *out) {
    weft_matmul_types f32 = {WEFT_F32, WEFT_F32, WEFT_F32};
    B->matmul(B, false, true, m, n, k, 1.0f, x, k, w, k, 0.0f, NULL, NULL, out, n, f32);
}

// The backend takes the bf16 path only for fixed parameters while rounding is on.
static void check_backend_switch(void) {
    enum { M = 3, N = 200, K = 128 };
    float *params = host_normal((size_t)2 * N * K, 0, 1), *loose = host_normal((size_t)N * K, 0, 1);
    float *x = host_normal((size_t)M * K, 0, 1);
    float *fp32 = weft_alloc(sizeof(float) * M * N), *got = weft_alloc(sizeof(float) * M * N);
    float *rounded = weft_alloc(sizeof(float) * M * N), *loose32 = weft_alloc(sizeof(float) * M * N);
    const float *w = params + (size_t)N * K; // the second weight of the buffer
    uint16_t *halves = weft_alloc(sizeof(uint16_t) * weft_cpu_bf16_halves(N, K));
    weft_cpu_bf16_pack(N, K, w, K, halves);
    weft_cpu_bf16_product(M, N, K, 1.0f, x, K, halves, 0.0f, rounded, N);
    matmul(M, N, K, x, w, fp32);
    matmul(M, N, K, x, loose, loose32);
    size_t wrong = elements_differing(fp32, rounded, M * N) == 0; // the test would see nothing
    B->params_fixed(B, params, sizeof(float) * 2 * N * K);
    matmul(M, N, K, x, w, got);
    wrong += elements_differing(got, fp32, M * N);
    B->round_fixed_weights(B, true);
    matmul(M, N, K, x, w, got);
    wrong += elements_differing(got, rounded, M * N);
    matmul(M, N, K, x, loose, got); // not among the fixed parameters
    wrong += elements_differing(got, loose32, M * N);
    B->round_fixed_weights(B, false);
    matmul(M, N, K, x, w, got);
    wrong += elements_differing(got, fp32, M * N);
    B->params_released(B);
    report("backend matmul: bf16 exactly for fixed weights while rounding, else fp32 (elements "
           "differing)", (double)wrong, 0);
    weft_free(params), weft_free(loose), weft_free(x), weft_free(fp32), weft_free(got);
    weft_free(rounded), weft_free(loose32), weft_free(halves);
}

int main(void) {
    fd_begin();
    double t0 = weft_now_seconds();
    if (!weft_cpu_bf16_available()) {
        printf("this build has no AVX2: the backend has no bf16-weight products; skipped\n");
        weft_backend_destroy(B);
        return 77;
    }
    const int shapes[][2] = {{64, 128}, {257, 128}, {384, 128}, {128, 384}, {100, 37}, {16, 5}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        check_shape(shapes[s][0], shapes[s][1], 1.0f, 0.0f);
    check_shape(257, 128, 0.5f, 1.0f);
    check_shape(130, 64, -2.0f, 0.75f);
    check_backend_switch();
    return fd_end(t0);
}
