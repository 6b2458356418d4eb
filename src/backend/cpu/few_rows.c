// Products of a few rows (a decode step's tokens) with the bits of OpenBLAS's Sandybridge sgemm,
// without its cost. A single-threaded OpenBLAS call repacks its whole B operand (the weights) with
// scalar copies before the kernel reads it: for one to a few dozen rows that copy takes longer
// than the arithmetic, and the packed block (768 x 384 floats) does not stay in L2. Here each
// 16-column panel of the weights is packed into L1 (8 x 8 register transposes) and every row is
// multiplied against it at once; while the caller holds the parameters fixed (backend.h
// params_fixed: the rollout engine, for a whole generate call) ops.c packs each weight's panels
// once and passes them in.
//
// The bits are OpenBLAS's own, which is what keeps a decoded row equal to the same row in a
// training batch (DESIGN.md section 9): its driver (driver/level3/level3.c, single-threaded) sums
// K in blocks of at most Q = 384, a remainder between Q and 2Q split in two halves rounded up to
// 16, and its kernel (sgemm_kernel_16x4_sandy.S) sums each block from zero in order, a multiply
// then an add (no FMA), then adds alpha times the block's sum to C, which beta has scaled first
// (zeroed for beta = 0, left for beta = 1). This file is compiled with -ffp-contract=off so the
// multiply and the add stay two roundings. weft_cpu_few_rows_agree checks the claim against the
// library at start-up; tests/backend checks it on the test shapes.
#include <cblas.h>
#include <stdbool.h>
#include <string.h>
#ifdef __AVX__
#include <immintrin.h>
#endif

#include "backend/cpu/internal.h"

#ifdef __AVX__

enum { PANEL = 16, SANDY_Q = 384, SANDY_UNROLL_M = 16, TILE_ROWS = 4 };

// The length of the K block starting where `left` products remain (level3.c's min_l).
static int k_block(int left) {
    if (left >= 2 * SANDY_Q) return SANDY_Q;
    if (left > SANDY_Q) return (left / 2 + SANDY_UNROLL_M - 1) / SANDY_UNROLL_M * SANDY_UNROLL_M;
    return left;
}

// panel (kb, PANEL) = columns [j0, j0 + cols) of op(B) over K rows [k0, k0 + kb), zero past cols:
// panel[k * PANEL + c] = op(B)[k0 + k][j0 + c]. B is (n, K) for a transposed B, else (K, n).
static void pack_panel(const float *b, int ldb, bool tb, int j0, int cols, int k0, int kb,
                       float *panel) {
    if (!tb) {
        for (int k = 0; k < kb; k++) {
            memcpy(panel + k * PANEL, b + (size_t)(k0 + k) * ldb + j0, sizeof(float) * cols);
            memset(panel + k * PANEL + cols, 0, sizeof(float) * (PANEL - cols));
        }
        return;
    }
    int k = 0;
    if (cols == PANEL)
        for (; k + 8 <= kb; k += 8)
            for (int half = 0; half < PANEL; half += 8) {
                const float *r[8];
                for (int i = 0; i < 8; i++) r[i] = b + (size_t)(j0 + half + i) * ldb + k0 + k;
                weft_cpu_transpose8(r, panel + k * PANEL + half, PANEL);
            }
    for (; k < kb; k++)
        for (int c = 0; c < PANEL; c++)
            panel[k * PANEL + c] = c < cols ? b[(size_t)(j0 + c) * ldb + k0 + k] : 0.0f;
}

// C rows [0, R) x columns [0, cols) += alpha * (A rows . panels) over kb, the kernel's order, for
// P consecutive panels (`next` floats apart). R and P are constants once inlined, so that the
// accumulators are registers (with a variable count GCC keeps a copy of them on the stack, and
// its stores were the bottleneck). A step of R rows and P panels is 4 R P vector operations on
// the 4 floating-point pipes, and each accumulator's add waits 3 cycles for the previous one:
// R P = 2 (one row, two panels) is latency-bound at 3 cycles, R P >= 3 runs at the pipes' rate.
//
// Each step also asks for one line (a PANEL row) of `ahead`, for the first `n_ahead` steps: the
// weights a later call reads, on their way from memory while these rows compute (see
// rows_against_panels).
static inline __attribute__((always_inline)) void tile(const float *a, int lda, int R,
                                                       const float *panel, size_t next, int P,
                                                       int kb, float alpha, float *c, int ldc,
                                                       int cols, const float *ahead,
                                                       int n_ahead) {
    __m256 acc[TILE_ROWS][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 2 * P; v++) acc[r][v] = _mm256_setzero_ps();
    for (int k = 0; k < kb; k++) {
        if (k < n_ahead) __builtin_prefetch(ahead + (size_t)k * PANEL, 0, 2);
        __m256 w[4];
#pragma GCC unroll 4
        for (int v = 0; v < 2 * P; v++) {
            w[v] = _mm256_loadu_ps(panel + (v / 2) * next + k * PANEL + (v % 2) * 8);
            // Held in registers: GCC would reload them for every row, and loads, not arithmetic,
            // then bound the loop (12 loads a step against 6).
            __asm__("" : "+x"(w[v]));
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 xr = _mm256_broadcast_ss(a + (size_t)r * lda + k);
#pragma GCC unroll 4
            for (int v = 0; v < 2 * P; v++)
                acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_mul_ps(xr, w[v]));
        }
    }
    __m256 al = _mm256_set1_ps(alpha);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 2 * P; v++) {
            __m256 sum = _mm256_mul_ps(al, acc[r][v]);
            float *cv = c + (size_t)r * ldc + 8 * v, part[8];
            if (8 * v + 8 <= cols) {
                _mm256_storeu_ps(cv, _mm256_add_ps(sum, _mm256_loadu_ps(cv)));
            } else { // the columns of a partial panel
                _mm256_storeu_ps(part, sum);
                for (int j = 0; j < cols - 8 * v; j++) cv[j] = part[j] + cv[j];
            }
        }
}

// Of kb lines shared `share` to a tile, how many tile t asks for.
static int tail_lines(int kb, int t, int share) {
    int left = kb - t * share;
    return left < 0 ? 0 : left < share ? left : share;
}

// C columns [0, cols) of panel (and, with two_panels, cols - 16 more of the panel `next` floats
// further) for all m rows, over K block kb: 1 or 2 rows (a decode step, a verification) take two
// panels at a time, more rows 4 at a time on one panel, whose 24 KB stay in L1 while they pass.
//
// Packed weights are read in address order, and a decode step's weights come from memory (a
// model's do not fit in the caches): with several row tiles the kb lines that follow the block
// (the next block's) are asked for into L2 while its rows compute, spread over the tiles, so
// that memory and arithmetic overlap instead of taking turns (the hardware prefetcher stops at
// the block's end while the later tiles reread it from L1): 32 rows, 10-20% faster.
static void rows_against_panels(const float *a, int lda, int m, const float *panel, size_t next,
                                bool two_panels, int kb, float alpha, float *c, int ldc,
                                int cols, bool prefetch) {
    if (two_panels) { // one pass, streaming: the hardware prefetcher keeps up (asking slowed it)
        if (m == 2) tile(a, lda, 2, panel, next, 2, kb, alpha, c, ldc, cols, NULL, 0);
        else tile(a, lda, 1, panel, next, 2, kb, alpha, c, ldc, cols, NULL, 0);
        return;
    }
    const float *ahead = panel + (size_t)kb * PANEL;
    int tiles = (m + TILE_ROWS - 1) / TILE_ROWS, share = (kb + tiles - 1) / tiles, i = 0, t = 0;
    if (!prefetch) share = 0;
    for (; i + TILE_ROWS <= m; i += TILE_ROWS, t++)
        tile(a + (size_t)i * lda, lda, TILE_ROWS, panel, next, 1, kb, alpha, c + (size_t)i * ldc,
             ldc, cols, ahead + (size_t)t * share * PANEL, tail_lines(kb, t, share));
    a += (size_t)i * lda, c += (size_t)i * ldc;
    const float *pf = ahead + (size_t)t * share * PANEL;
    int n = tail_lines(kb, t, share);
    switch (m - i) {
    case 3: tile(a, lda, 3, panel, next, 1, kb, alpha, c, ldc, cols, pf, n); break;
    case 2: tile(a, lda, 2, panel, next, 1, kb, alpha, c, ldc, cols, pf, n); break;
    case 1: tile(a, lda, 1, panel, next, 1, kb, alpha, c, ldc, cols, pf, n); break;
    }
}

size_t weft_cpu_few_rows_panel_floats(int n, int k) {
    return (size_t)(n + PANEL - 1) / PANEL * PANEL * k;
}

// Panel p holds columns [16p, 16p + 16) over all of K, (K, 16): a K block is a run of its rows.
void weft_cpu_few_rows_pack(bool tb, int n, int k, const float *b, int ldb, float *panels) {
    for (int j0 = 0; j0 < n; j0 += PANEL)
        pack_panel(b, ldb, tb, j0, n - j0 < PANEL ? n - j0 : PANEL, 0, k, panels + (size_t)j0 * k);
}

void weft_cpu_few_rows_product(bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                               const float *b, int ldb, const float *panels, float beta, float *c,
                               int ldc) {
    if (beta != 1.0f)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float *e = c + (size_t)i * ldc + j;
                *e = beta == 0.0f ? 0.0f : beta * *e;
            }
    if (alpha == 0.0f) return;
    float here[SANDY_Q * PANEL] __attribute__((aligned(32))); // 24 KB: stays in L1
    // Packed panels go two at a time for 1 or 2 rows (rows_against_panels).
    int step = panels && m <= 2 ? 2 * PANEL : PANEL;
    for (int j0 = 0; j0 < n; j0 += step) {
        int cols = n - j0 < step ? n - j0 : step;
        for (int k0 = 0, kb; k0 < k; k0 += kb) {
            kb = k_block(k - k0);
            const float *panel = panels ? panels + (size_t)j0 * k + (size_t)k0 * PANEL : here;
            if (!panels) pack_panel(b, ldb, tb, j0, cols, k0, kb, here);
            rows_against_panels(a + k0, lda, m, panel, (size_t)PANEL * k, cols > PANEL, kb, alpha,
                                c + j0, ldc, cols, panels != NULL);
        }
    }
}

// Products small enough that OpenBLAS runs them on one thread (M N K under 262,144), both ways:
// K of one block, of Q to 2Q (split in halves rounded to 16) and of many blocks, columns in whole
// and partial panels, every row-tile size, B either way, alpha and beta other than 1 and 0.
bool weft_cpu_few_rows_agree(void) {
    enum { CASES = 5 };
    const int shape[CASES][3] = {{7, 40, 100}, {3, 33, 688}, {4, 40, 1000}, {2, 17, 3000}, {1, 64, 1408}};
    bool same = true;
    unsigned state = 12345;
    for (int s = 0; s < CASES && same; s++)
        for (int tb = 0; tb < 2 && same; tb++) {
            int m = shape[s][0], n = shape[s][1], k = shape[s][2];
            float alpha = s == 2 ? 0.5f : 1.0f, beta = s == 3 ? 1.0f : s == 4 ? 0.75f : 0.0f;
            size_t na = (size_t)m * k, nb = (size_t)n * k, nc = (size_t)m * n;
            float *x = weft_alloc(sizeof(float) * (na + nb + 2 * nc));
            for (size_t i = 0; i < na + nb + nc; i++) {
                state = state * 1664525u + 1013904223u;
                x[i] = (float)(state >> 8) / (float)(1u << 24) - 0.5f;
            }
            float *a = x, *b = x + na, *want = b + nb, *got = want + nc;
            memcpy(got, want, sizeof(float) * nc);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                        a, k, b, tb ? k : n, beta, want, n);
            weft_cpu_few_rows_product(tb, m, n, k, alpha, a, k, b, tb ? k : n, NULL, beta, got, n);
            same = memcmp(want, got, sizeof(float) * nc) == 0;
            weft_free(x);
        }
    return same;
}

#else

bool weft_cpu_few_rows_agree(void) { return false; }

size_t weft_cpu_few_rows_panel_floats(int n, int k) { return 0; }

void weft_cpu_few_rows_pack(bool tb, int n, int k, const float *b, int ldb, float *panels) {
    WEFT_CHECK(false, "internal: few-row products need AVX (weft_cpu_few_rows_agree said no)");
}

void weft_cpu_few_rows_product(bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                               const float *b, int ldb, const float *panels, float beta, float *c,
                               int ldc) {
    WEFT_CHECK(false, "internal: few-row products need AVX (weft_cpu_few_rows_agree said no)");
}

#endif
