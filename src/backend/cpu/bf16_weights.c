// Products against weights rounded to bf16, for speculative drafts (the rollout engine's MTP
// passes). A draft only proposes tokens that the main model then verifies, and verification keeps
// the output the policy's whatever the drafts are (DESIGN.md section 11), so the drafter need not
// read the trainer's fp32 bits. At batch 1 a decode step reads every weight from L3 or memory and
// its rows are few: half the bytes is nearly half a draft pass's products.
//
// Layout: columns in groups of 2W (two vectors); row k of group g is 2W bf16 values at
// halves + (g K + k) 2W, element 2c holding column c and 2c + 1 column W + c, so that one vector
// load gives both columns' floats with one shift and one mask. Each output element is one FMA
// chain over K in order from zero, whatever the tile, so a row's bits depend on that row alone:
// drafts, and the outputs drawn with them, do not depend on how sequences are batched.
#include <stdint.h>
#include <string.h>

#include "backend/cpu/internal.h"
#include "backend/cpu/simd.h"

#ifdef __AVX2__

#ifdef __AVX512F__
typedef __m512i vint;
#define VILOAD(p) _mm512_loadu_si512((const void *)(p))
#define LOW_COLUMNS(x) _mm512_castsi512_ps(_mm512_slli_epi32(x, 16))
#define HIGH_COLUMNS(x) _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(-65536)))
#else
typedef __m256i vint;
#define VILOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define LOW_COLUMNS(x) _mm256_castsi256_ps(_mm256_slli_epi32(x, 16))
#define HIGH_COLUMNS(x) _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(-65536)))
#endif

// A tile is up to ROWS rows against up to GROUPS groups: AVX-512's 32 registers hold 6 x 4
// accumulators, AVX2's 16 hold 4 x 2.
enum { GROUP = 2 * W, GROUPS = W == 16 ? 2 : 1, ROWS = W == 16 ? 6 : 4 };

bool weft_cpu_bf16_available(void) { return true; }

size_t weft_cpu_bf16_halves(int n, int k) { return (size_t)(n + GROUP - 1) / GROUP * GROUP * k; }

void weft_cpu_bf16_pack(int n, int k, const float *b, int ldb, uint16_t *halves) {
    for (int j0 = 0; j0 < n; j0 += GROUP)
        for (int kk = 0; kk < k; kk++) {
            uint16_t *row = halves + (size_t)j0 * k + (size_t)kk * GROUP;
            for (int col = 0; col < GROUP; col++) {
                int j = j0 + col;
                float x = j < n ? b[(size_t)j * ldb + kk] : 0.0f;
                row[(col % W) * 2 + col / W] = weft_bf16_from_f32(x);
            }
        }
}

// C rows [0, R) x columns [0, cols) = alpha * (A rows . groups) + beta * C over all of k. R and
// G are constants once inlined, so that the accumulators are registers.
static inline __attribute__((always_inline)) void tile(const float *a, int lda, int R,
                                                       const uint16_t *groups, int G, int k,
                                                       float alpha, float beta, float *c,
                                                       int ldc, int cols) {
    vec acc[ROWS][2 * GROUPS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 2 * G; v++) acc[r][v] = VZERO();
    for (int kk = 0; kk < k; kk++) {
        vec w[2 * GROUPS];
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            vint x = VILOAD(groups + ((size_t)g * k + kk) * GROUP);
            w[2 * g] = LOW_COLUMNS(x), w[2 * g + 1] = HIGH_COLUMNS(x);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            vec xr = VSET1(a[(size_t)r * lda + kk]);
#pragma GCC unroll 4
            for (int v = 0; v < 2 * G; v++) acc[r][v] = VFMA(xr, w[v], acc[r][v]);
        }
    }
    vec al = VSET1(alpha), be = VSET1(beta);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 2 * G; v++) {
            int col = (v / 2) * GROUP + (v % 2) * W;
            float *cv = c + (size_t)r * ldc + col, part[W];
            if (col + W <= cols) {
                vec out = VMUL(al, acc[r][v]);
                VSTORE(cv, beta == 0.0f ? out : VFMA(be, VLOAD(cv), out));
                continue;
            }
            VSTORE(part, acc[r][v]); // the columns of a partial group
            for (int j = 0; j < cols - col; j++)
                cv[j] = beta == 0.0f ? alpha * part[j] : beta * cv[j] + alpha * part[j];
        }
}

static void rows_tile(const float *a, int lda, int R, const uint16_t *groups, int G, int k,
                      float alpha, float beta, float *c, int ldc, int cols) {
#define TILE(r, g) tile(a, lda, r, groups, g, k, alpha, beta, c, ldc, cols)
#define TILES(g)                                                                               \
    do {                                                                                       \
        switch (R) {                                                                           \
        case 6: TILE(ROWS >= 6 ? 6 : 1, g); break;                                             \
        case 5: TILE(ROWS >= 5 ? 5 : 1, g); break;                                             \
        case 4: TILE(4, g); break;                                                             \
        case 3: TILE(3, g); break;                                                             \
        case 2: TILE(2, g); break;                                                             \
        default: TILE(1, g);                                                                   \
        }                                                                                      \
    } while (0)
    if (GROUPS >= 2 && G == 2) TILES(GROUPS >= 2 ? 2 : 1);
    else TILES(1);
#undef TILES
#undef TILE
}

void weft_cpu_bf16_product(int m, int n, int k, float alpha, const float *a, int lda,
                           const uint16_t *halves, float beta, float *c, int ldc) {
    for (int j0 = 0; j0 < n; j0 += GROUPS * GROUP) {
        int cols = n - j0 < GROUPS * GROUP ? n - j0 : GROUPS * GROUP;
        int G = (cols + GROUP - 1) / GROUP;
        for (int i = 0; i < m; i += ROWS)
            rows_tile(a + (size_t)i * lda, lda, m - i < ROWS ? m - i : ROWS,
                      halves + (size_t)j0 * k, G, k, alpha, beta, c + (size_t)i * ldc + j0, ldc,
                      cols);
    }
}

#else

bool weft_cpu_bf16_available(void) { return false; }

size_t weft_cpu_bf16_halves(int n, int k) { return 0; }

void weft_cpu_bf16_pack(int n, int k, const float *b, int ldb, uint16_t *halves) {
    WEFT_CHECK(false, "internal: bf16 weights need AVX2 (weft_cpu_bf16_available said no)");
}

void weft_cpu_bf16_product(int m, int n, int k, float alpha, const float *a, int lda,
                           const uint16_t *halves, float beta, float *c, int ldc) {
    WEFT_CHECK(false, "internal: bf16 weights need AVX2 (weft_cpu_bf16_available said no)");
}

#endif
