// backend/cpu (private): what the CPU backend's files share.
#pragma once
#include <omp.h>

#include "backend/backend.h"
#ifdef __AVX__
#include <immintrin.h>
#endif

enum { WEFT_CPU_SCRATCH_SLOTS = 4 }; // per-thread scratch buffers an op may hold at once

// A parallel region costs about a microsecond to wake and join the OpenMP team, and half that for
// a team of one (libgomp's join still makes a futex call): more than a decode step's norms,
// biases, rotations and small products of a few rows take. An op with less work than this (in
// multiply-adds or elements touched) runs on the calling thread. Every op splits rows, columns or
// sequences over its threads, never a sum, so no result depends on which way it ran.
enum { WEFT_CPU_TEAM_MIN_WORK = 1 << 15 };

static inline bool weft_cpu_on_team(size_t work) {
    return work >= WEFT_CPU_TEAM_MIN_WORK && omp_get_max_threads() > 1;
}

// Runs `call`, a function whose loops are orphaned `omp for ... nowait` loops, on the OpenMP team
// when `work` is worth waking it for, else on this thread alone (the loops then run whole).
#define WEFT_CPU_PARALLEL(work, call)                                                          \
    do {                                                                                       \
        if (weft_cpu_on_team(work)) {                                                          \
            _Pragma("omp parallel") call;                                                      \
        } else {                                                                               \
            call;                                                                              \
        }                                                                                      \
    } while (0)

// This thread's scratch buffer `slot` of at least `floats` floats, kept across calls.
float *weft_cpu_scratch(weft_backend *self, int slot, size_t floats);

// vector_math.c, for softmaxes and gates: out[j] = exp(sign x[j] - shift) for j < n (out may be
// x, or NULL to only sum), returning their sum in double; the sum over j of e[j] (x[j] - shift)
// in double; a row's max (-inf for n = 0). Every result depends on its inputs and n alone, never
// on where a row was cut into vectors or threads.
double weft_cpu_exp_sum(const float *x, float sign, float shift, float *out, size_t n);
double weft_cpu_dot_shifted(const float *e, const float *x, float shift, size_t n);
float weft_cpu_row_max(const float *x, int n);

// attention.c: the backend's attention ops.
void weft_cpu_attention_forward(weft_backend *self, const void *q, const void *k, const void *v,
                                const weft_attention_layout *layout, void *out, float *lse, int H,
                                int KV, int D);
void weft_cpu_attention_backward(weft_backend *self, const void *q, const void *k, const void *v,
                                 const weft_attention_layout *layout, const void *out,
                                 const float *lse, const void *dout, void *dq, void *dk, void *dv,
                                 int H, int KV, int D);
void weft_cpu_kv_store(weft_backend *self, const weft_kv_pool *pool, int layer,
                       const int32_t *slot, const void *k, const void *v, int T);
void weft_cpu_paged_attention(weft_backend *self, const void *q, const weft_kv_pool *pool,
                              int layer, const weft_paged_layout *layout, void *out, float *lse,
                              int H, int KV, int D);

// heads.c: the output-head ops (backend.h's cross_entropy, logprobs, logits_backward).
void weft_cpu_cross_entropy(weft_backend *self, void *logits, const int32_t *targets, float scale,
                            float *row_loss, float *correct, int T, int V);
void weft_cpu_logprobs(weft_backend *self, const void *logits, const int32_t *targets,
                       float *logprob, float *entropy, float *correct, int T, int V);
void weft_cpu_logits_backward(weft_backend *self, void *logits, const int32_t *targets,
                              const float *d_logprob, const float *d_entropy, int T, int V);

#ifdef __AVX__
// Rows r[0..8) (8 floats each) transposed into out[0..8) (ld apart): out[c][i] = r[i][c].
static inline void weft_cpu_transpose8(const float *const r[8], float *out, size_t ld) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        __m256 a = _mm256_loadu_ps(r[i]), b = _mm256_loadu_ps(r[i + 1]);
        t[i] = _mm256_unpacklo_ps(a, b), t[i + 1] = _mm256_unpackhi_ps(a, b);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_ps(out + c * ld, _mm256_permute2f128_ps(u[c], u[c + 4], 0x20));
        _mm256_storeu_ps(out + (c + 4) * ld, _mm256_permute2f128_ps(u[c], u[c + 4], 0x31));
    }
}
#endif

// C (m, n) = alpha A op(B) + beta C for rows of A (not transposed) by OpenBLAS's regular kernel
// on this thread, rows padded where OpenBLAS would take a small-matrix kernel (ops.c): a row's bits
// then depend on that row alone, and they are what few_rows.c must reproduce.
void weft_cpu_openblas_product(weft_backend *self, bool tb, int m, int n, int k, float alpha,
                               const float *a, int lda, const float *b, int ldb, float beta,
                               float *c, int ldc);

// few_rows.c: C (m, n) = alpha A op(B) + beta C for a few rows of A (not transposed), with the
// bits of weft_cpu_openblas_product, for the OpenBLAS kernels whose order it knows (`kind`, from
// the core OpenBLAS runs), which weft_cpu_few_rows_agree checks on this machine's library (false
// where they differ or the CPU has no AVX: then OpenBLAS does the product). B's columns go
// through 16-column panels, packed per call, or read from `packed.at` that
// weft_cpu_few_rows_pack made from the same B, weft_cpu_few_rows_panel_floats(n, k) floats.
typedef struct weft_cpu_few_rows_kind {
    bool available;      // an OpenBLAS kernel few_rows.c reproduces
    bool fused;          // the kernel's multiply-adds are FMAs (SkylakeX), else two roundings
    int q;               // its K block (GEMM_Q)
    bool untransposed_b; // products with B as stored too, not only x W^T
} weft_cpu_few_rows_kind;
weft_cpu_few_rows_kind weft_cpu_few_rows_kind_for(const char *openblas_corename);
// B's packed panels for a product: `at` (NULL: packed per call); with them, the panels of the
// `after_cols` columns (same K) the thread will likely multiply next, or NULL: their first K block
// is asked for from memory while the product's last one computes.
typedef struct weft_cpu_panels {
    const float *at, *after;
    int after_cols;
} weft_cpu_panels;
void weft_cpu_few_rows_product(const weft_cpu_few_rows_kind *kind, bool tb, int m, int n, int k,
                               float alpha, const float *a, int lda, const float *b, int ldb,
                               weft_cpu_panels packed, float beta, float *c, int ldc);
size_t weft_cpu_few_rows_panel_floats(int n, int k);
void weft_cpu_few_rows_pack(bool tb, int n, int k, const float *b, int ldb, float *panels);
bool weft_cpu_few_rows_agree(weft_backend *self, const weft_cpu_few_rows_kind *kind);

// bf16_weights.c: C (m, n) = alpha A B^T + beta C with B (n, K) rounded to bf16 and packed by
// weft_cpu_bf16_pack into weft_cpu_bf16_halves(n, k) values, for products whose results only
// propose (speculative drafts: backend.h round_fixed_weights). Columns from j0, a multiple of 64,
// start at halves + j0 * k. Each element is one chain over K, so a row's bits depend on that row
// alone. Needs AVX2 (weft_cpu_bf16_available).
bool weft_cpu_bf16_available(void);
size_t weft_cpu_bf16_halves(int n, int k);
void weft_cpu_bf16_pack(int n, int k, const float *b, int ldb, uint16_t *halves);
void weft_cpu_bf16_product(int m, int n, int k, float alpha, const float *a, int lda,
                           const uint16_t *halves, float beta, float *c, int ldc);
