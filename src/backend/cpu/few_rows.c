// Products of a few rows (a decode step's tokens) with the bits of OpenBLAS's own sgemm, without
// its cost. A single-threaded OpenBLAS call repacks its whole B operand (the weights) with scalar
// copies before the kernel reads it: for one to a few dozen rows that copy takes longer than the
// arithmetic, and the packed block does not stay in L2. Here each 16-column panel of the weights
// is packed into L1 (8 x 8 register transposes) and every row is multiplied against it at once;
// while the caller holds the parameters fixed (backend.h params_fixed: the rollout engine, for a
// whole generate call) ops.c packs each weight's panels once and passes them in.
//
// The bits are OpenBLAS's own, which is what keeps a decoded row equal to the same row in a
// training batch (DESIGN.md section 9). Its driver (driver/level3/level3.c, single-threaded) sums
// K in blocks of at most Q, a remainder between Q and 2Q split in two halves rounded up to 16, and
// its kernel sums each block from zero in order, then adds alpha times the block's sum to C, which
// beta has scaled first (zeroed for beta = 0, left for beta = 1). The two kernels weft runs differ
// in how (weft_cpu_few_rows_kind): the Sandybridge one (sgemm_kernel_16x4_sandy.S, Q = 384)
// multiplies then adds, two roundings, alpha times the sum then plus C; the SkylakeX one
// (sgemm_kernel_16x4_skylakex_3.c, Q = 448, or 320 as Cooperlake and Sapphire Rapids set it)
// fuses both, and C + alpha times the sum too. This file is compiled with -ffp-contract=off so
// that the unfused order stays two roundings; the fused one is written as FMAs. Vectors are as
// wide as the CPU's registers: either order gives the same bits at any width.
// weft_cpu_few_rows_agree checks the claim against the library at start-up; tests/backend checks
// it on the test shapes.
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include "backend/cpu/internal.h"
#include "backend/cpu/simd.h"

weft_cpu_few_rows_kind weft_cpu_few_rows_kind_for(const char *corename) {
    weft_cpu_few_rows_kind none = {0};
#ifdef __AVX__
    if (!corename) return none;
    if (!strcasecmp(corename, "sandybridge"))
        return (weft_cpu_few_rows_kind){.available = true, .fused = false, .q = 384,
                                        .untransposed_b = true};
#if defined(__FMA__)
    // SkylakeX's sgemm also has a "direct" kernel for untransposed products, taken by size and by
    // whether the call runs inside a parallel region: only x W^T (every forward product) is ours.
    if (!strcasecmp(corename, "skylakex"))
        return (weft_cpu_few_rows_kind){.available = true, .fused = true, .q = 448};
    if (!strcasecmp(corename, "cooperlake") || !strcasecmp(corename, "sapphirerapids"))
        return (weft_cpu_few_rows_kind){.available = true, .fused = true, .q = 320};
#endif
#endif
    (void)corename;
    return none;
}

#ifdef __AVX__

// A panel row is V vectors. With AVX (16 registers) a tile keeps 8 accumulators busy (3-4
// cycles of latency on 2 pipes): TILE_ROWS rows against one panel, or one or two rows against
// STREAM_PANELS panels. AVX-512's 32 registers hold 24: more rows (WIDE_ROWS) take all
// STREAM_PANELS panels at once where the weights are packed, each broadcast of an x value then
// feeding 4 FMAs (32 rows: 73 against 62 billion multiply-adds a second on a Xeon core).
enum {
    PANEL = 16, MAX_Q = 448, UNROLL_M = 16, V = PANEL / W, TILE_ROWS = 8 / V,
    STREAM_PANELS = 4 / V, WIDE_ROWS = V == 1 ? 6 : 0, MAX_ROWS = 8, MAX_VECS = 4
};

// The length of the K block starting where `left` products remain (level3.c's min_l).
static int k_block(int left, int q) {
    if (left >= 2 * q) return q;
    if (left > q) return (left / 2 + UNROLL_M - 1) / UNROLL_M * UNROLL_M;
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
// its stores were the bottleneck). With 8 accumulators (R P V = 8) a step keeps the pipes busy;
// one row against one panel waits on its adds' latency.
//
// Each step also asks for one line (a PANEL row) of `ask`: the weights a later call reads, on their
// way from memory while these rows compute (see rows_against_panels).
typedef struct asks {
    const float *at[2]; // two runs of lines, PANEL floats apart: n[0] from at[0], then n[1]
    int n[2];
} asks;

static inline __attribute__((always_inline)) void tile(const float *a, int lda, int R,
                                                       const float *panel, size_t next, int P,
                                                       int kb, bool fused, float alpha, float *c,
                                                       int ldc, int cols, asks ask) {
    vec acc[MAX_ROWS][MAX_VECS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < P * V; v++) acc[r][v] = VZERO();
    for (int k = 0; k < kb; k++) {
        if (k < ask.n[0]) __builtin_prefetch(ask.at[0] + (size_t)k * PANEL, 0, 2);
        else if (k - ask.n[0] < ask.n[1])
            __builtin_prefetch(ask.at[1] + (size_t)(k - ask.n[0]) * PANEL, 0, 2);
        vec w[MAX_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < P * V; v++) {
            w[v] = VLOAD(panel + (v / V) * next + k * PANEL + (v % V) * W);
            // Held in registers: GCC would reload them for every row, and loads, not arithmetic,
            // then bound the loop (12 loads a step against 6).
            __asm__("" : "+x"(w[v]));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            vec xr = VSET1(a[(size_t)r * lda + k]);
#pragma GCC unroll 4
            for (int v = 0; v < P * V; v++)
                acc[r][v] = fused ? VFMA(xr, w[v], acc[r][v]) : VADD(acc[r][v], VMUL(xr, w[v]));
        }
    }
    vec al = VSET1(alpha);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < P * V; v++) {
            float *cv = c + (size_t)r * ldc + W * v, part[W];
            if (W * v + W <= cols) {
                vec old = VLOAD(cv);
                VSTORE(cv, fused ? VFMA(acc[r][v], al, old) : VADD(VMUL(al, acc[r][v]), old));
            } else { // the columns of a partial panel
                VSTORE(part, acc[r][v]);
                for (int j = 0; j < cols - W * v; j++)
                    cv[j] = fused ? __builtin_fmaf(part[j], alpha, cv[j]) : alpha * part[j] + cv[j];
            }
        }
}

// One tile of R rows (up to TILE_ROWS) against one panel: tile's R made constant. With AVX
// (TILE_ROWS 4) the switch's value is clamped to 4, so the wider cases compile to nothing.
static void rows_tile(const float *a, int lda, int R, const float *panel, int kb, bool fused,
                      float alpha, float *c, int ldc, int cols, asks ask) {
#define ROWS_TILE(r, f) tile(a, lda, r, panel, 0, 1, kb, f, alpha, c, ldc, cols, ask)
#define ROWS_TILES(f)                                                                          \
    do {                                                                                       \
        switch (TILE_ROWS >= 8 ? R : R > 4 ? 4 : R) {                                          \
        case 8: ROWS_TILE(8, f); break;                                                        \
        case 7: ROWS_TILE(7, f); break;                                                        \
        case 6: ROWS_TILE(6, f); break;                                                        \
        case 5: ROWS_TILE(5, f); break;                                                        \
        case 4: ROWS_TILE(4, f); break;                                                        \
        case 3: ROWS_TILE(3, f); break;                                                        \
        case 2: ROWS_TILE(2, f); break;                                                        \
        default: ROWS_TILE(1, f);                                                              \
        }                                                                                      \
    } while (0)
    if (fused) ROWS_TILES(true);
    else ROWS_TILES(false);
#undef ROWS_TILES
#undef ROWS_TILE
}

// R rows (1 or 2, or up to WIDE_ROWS) against the P (1 to STREAM_PANELS) panels a step of packed
// weights covers: tile's R and P made constant.
static void panels_tile(const float *a, int lda, int R, const float *panel, size_t next, int P,
                        int kb, bool fused, float alpha, float *c, int ldc, int cols, asks ask) {
#define PANELS_TILE(r, p, f) tile(a, lda, r, panel, next, p, kb, f, alpha, c, ldc, cols, ask)
#define PANELS(r, f)                                                                           \
    do {                                                                                       \
        if (STREAM_PANELS >= 4 && P == 4) PANELS_TILE(r, 4, f);                                \
        else if (STREAM_PANELS >= 4 && P == 3) PANELS_TILE(r, 3, f);                           \
        else if (P == 2) PANELS_TILE(r, 2, f);                                                 \
        else PANELS_TILE(r, 1, f);                                                             \
    } while (0)
#define ROWS(f)                                                                                \
    do {                                                                                       \
        if (WIDE_ROWS == 6 && R == 6) PANELS(6, f);                                            \
        else if (WIDE_ROWS == 6 && R == 5) PANELS(5, f);                                       \
        else if (WIDE_ROWS == 6 && R == 4) PANELS(4, f);                                       \
        else if (WIDE_ROWS == 6 && R == 3) PANELS(3, f);                                       \
        else if (R == 2) PANELS(2, f);                                                         \
        else PANELS(1, f);                                                                     \
    } while (0)
    if (fused) ROWS(true);
    else ROWS(false);
#undef ROWS
#undef PANELS
#undef PANELS_TILE
}

// The panel lines a product's next call reads: P panels `next` floats apart from `first`, `lines`
// PANEL rows each.
typedef struct panel_lines {
    const float *first;
    size_t next;
    int P, lines;
} panel_lines;

// Tile t of `tiles` (kb steps each) asks for an even share of the lines `then` holds, taken in
// order: at most one panel's run and the start of the next, and no more lines than it has steps.
static asks share_of(const panel_lines *then, int t, int tiles, int kb) {
    asks ask = {{NULL, NULL}, {0, 0}};
    if (!then) return ask;
    int total = then->P * then->lines, share = (total + tiles - 1) / tiles;
    if (share > kb) share = kb;
    if (share > then->lines) share = then->lines;
    int from = t * share, count = total - from < share ? total - from : share;
    if (count <= 0) return ask;
    int panel = from / then->lines, line = from % then->lines;
    ask.at[0] = then->first + (size_t)panel * then->next + (size_t)line * PANEL;
    ask.n[0] = then->lines - line < count ? then->lines - line : count;
    ask.at[1] = then->first + (size_t)(panel + 1) * then->next;
    ask.n[1] = count - ask.n[0];
    return ask;
}

// C columns [0, cols) of the P panels from `panel` for all m rows, over K block kb: 1 or 2 rows
// (a decode step, a verification) take all P panels in one pass, streaming; more rows take
// WIDE_ROWS at a time against all P panels (AVX-512: the rest as one tile), or TILE_ROWS at a time
// on one panel (P = 1), whose lines stay in L1 while they pass.
//
// Packed weights are read in address order, and a decode step's weights come from memory (a
// model's do not fit in the caches): while the tiles compute, the lines of the product's next
// call (`then`, when packed panels have one) are asked for into L2, spread evenly over the tiles,
// so that memory and arithmetic overlap instead of taking turns (the hardware prefetcher stops at
// a block's end while the later tiles reread it from L1 or L2): 32 rows, 10-20% faster on a Zen
// 3 and on a Xeon.
static void rows_against_panels(const float *a, int lda, int m, const float *panel, size_t next,
                                int P, int kb, bool fused, float alpha, float *c, int ldc,
                                int cols, const panel_lines *then) {
    bool streaming = m <= 2 || (WIDE_ROWS && P > 1);
    int rows = streaming ? (m <= 2 ? m : WIDE_ROWS) : TILE_ROWS, tiles = (m + rows - 1) / rows;
    for (int i = 0, t = 0; i < m; i += rows, t++) {
        int R = m - i < rows ? m - i : rows;
        asks ask = share_of(then, t, tiles, kb);
        if (streaming)
            panels_tile(a + (size_t)i * lda, lda, R, panel, next, P, kb, fused, alpha,
                        c + (size_t)i * ldc, ldc, cols, ask);
        else
            rows_tile(a + (size_t)i * lda, lda, R, panel, kb, fused, alpha, c + (size_t)i * ldc,
                      ldc, cols, ask);
    }
}

// The lines of packed panels the call after the one ending at K row k_end of columns j0 reads:
// those columns' next K block, the next columns' first, or the first of the columns after
// (packed->after); false when there is none.
static bool next_call(const weft_cpu_panels *packed, int n, int k, int q, int step, int j0,
                      int k_end, panel_lines *then) {
    int j1 = k_end < k ? j0 : j0 + step, k1 = k_end < k ? k_end : 0;
    const float *first = j1 < n ? packed->at + (size_t)j1 * k + (size_t)k1 * PANEL : packed->after;
    int cols = j1 < n ? n - j1 : packed->after_cols;
    if (!first) return false;
    int P = ((cols < step ? cols : step) + PANEL - 1) / PANEL;
    *then = (panel_lines){first, (size_t)PANEL * k, P, k_block(k - k1, q)};
    return true;
}

size_t weft_cpu_few_rows_panel_floats(int n, int k) {
    return (size_t)(n + PANEL - 1) / PANEL * PANEL * k;
}

// Panel p holds columns [16p, 16p + 16) over all of K, (K, 16): a K block is a run of its rows.
void weft_cpu_few_rows_pack(bool tb, int n, int k, const float *b, int ldb, float *panels) {
    for (int j0 = 0; j0 < n; j0 += PANEL)
        pack_panel(b, ldb, tb, j0, n - j0 < PANEL ? n - j0 : PANEL, 0, k, panels + (size_t)j0 * k);
}

void weft_cpu_few_rows_product(const weft_cpu_few_rows_kind *kind, bool tb, int m, int n, int k,
                               float alpha, const float *a, int lda, const float *b, int ldb,
                               weft_cpu_panels packed, float beta, float *c, int ldc) {
    const float *panels = packed.at;
    if (beta != 1.0f)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float *e = c + (size_t)i * ldc + j;
                *e = beta == 0.0f ? 0.0f : beta * *e;
            }
    if (alpha == 0.0f) return;
    float here[MAX_Q * PANEL] __attribute__((aligned(64))); // 28 KB at most: stays in L1
    WEFT_CHECK(kind->q <= MAX_Q, "internal: a K block longer than few_rows.c holds");
    // Packed panels go STREAM_PANELS at a time for 1 or 2 rows, and for more with AVX-512
    // (rows_against_panels).
    int step = panels && (m <= 2 || WIDE_ROWS) ? STREAM_PANELS * PANEL : PANEL;
    for (int j0 = 0; j0 < n; j0 += step) {
        int cols = n - j0 < step ? n - j0 : step, P = (cols + PANEL - 1) / PANEL;
        for (int k0 = 0, kb; k0 < k; k0 += kb) {
            kb = k_block(k - k0, kind->q);
            const float *panel = panels ? panels + (size_t)j0 * k + (size_t)k0 * PANEL : here;
            if (!panels) pack_panel(b, ldb, tb, j0, cols, k0, kb, here);
            panel_lines then;
            bool ahead = panels && next_call(&packed, n, k, kind->q, step, j0, k0 + kb, &then);
            rows_against_panels(a + k0, lda, m, panel, (size_t)PANEL * k, P, kb, kind->fused,
                                alpha, c + j0, ldc, cols, ahead ? &then : NULL);
        }
    }
}

// Products of few rows: K of one block, of Q to 2Q (split in halves rounded to 16) and of many
// blocks for either Q, columns in whole and partial panels, every row-tile size, B either way
// where the kind takes both, alpha and beta other than 1 and 0; against the product path
// few_rows.c replaces.
bool weft_cpu_few_rows_agree(weft_backend *self, const weft_cpu_few_rows_kind *kind) {
    enum { CASES = 6 };
    const int shape[CASES][3] = {{7, 40, 100},  {3, 33, 688},  {4, 40, 1000},
                                 {2, 17, 3000}, {1, 64, 1408}, {13, 70, 700}};
    bool same = kind->available;
    unsigned state = 12345;
    for (int s = 0; s < CASES && same; s++)
        for (int tb = 1; tb >= (kind->untransposed_b ? 0 : 1) && same; tb--) {
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
            // Inside a parallel region OpenBLAS never threads (its threaded driver splits K
            // otherwise); the padding can take a product past its threshold. With one OpenMP
            // thread OpenBLAS has one too, and no second thread is started for this.
#pragma omp parallel num_threads(2) if (omp_get_max_threads() > 1)
#pragma omp master
            weft_cpu_openblas_product(self, tb, m, n, k, alpha, a, k, b, tb ? k : n, beta, want,
                                      n);
            weft_cpu_few_rows_product(kind, tb, m, n, k, alpha, a, k, b, tb ? k : n,
                                      (weft_cpu_panels){0}, beta, got, n);
            same = memcmp(want, got, sizeof(float) * nc) == 0;
            weft_free(x);
        }
    return same;
}

#else

bool weft_cpu_few_rows_agree(weft_backend *self, const weft_cpu_few_rows_kind *kind) {
    return false;
}

size_t weft_cpu_few_rows_panel_floats(int n, int k) { return 0; }

void weft_cpu_few_rows_pack(bool tb, int n, int k, const float *b, int ldb, float *panels) {
    WEFT_CHECK(false, "internal: few-row products need AVX (weft_cpu_few_rows_agree said no)");
}

void weft_cpu_few_rows_product(const weft_cpu_few_rows_kind *kind, bool tb, int m, int n, int k,
                               float alpha, const float *a, int lda, const float *b, int ldb,
                               weft_cpu_panels packed, float beta, float *c, int ldc) {
    WEFT_CHECK(false, "internal: few-row products need AVX (weft_cpu_few_rows_agree said no)");
}

#endif
