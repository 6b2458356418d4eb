// CPU backend: fp32 everywhere, GEMMs through OpenBLAS, the rest OpenMP loops.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/blas_setup.h"
#include "backend/cpu/internal.h"

// ---------------------------------------------------------------------------------- memory ----

// Per-thread scratch that outlives op calls: attention's score tiles would otherwise be fresh
// pages, zero-filled by the kernel, on every call.
typedef struct cpu_state {
    int n_threads;
    bool pad_small_products; // see rows_for_regular_kernel
    weft_cpu_few_rows_kind few_rows; // products of up to FEW_ROWS rows through few_rows.c
    const char *fixed_lo, *fixed_hi; // the parameters params_fixed holds, or NULL
    bool rounding;                   // round_fixed_weights: products read them as bf16
    struct packed_weight *packed;    // (n_packed) weights in them, packed for few_rows.c or bf16
    int n_packed, cap_packed;
    struct rope_angles *rope;        // the last rotation's cos and sin
    float **scratch;   // (n_threads * WEFT_CPU_SCRATCH_SLOTS) buffers
    size_t *capacity;  // (n_threads * WEFT_CPU_SCRATCH_SLOTS) floats
} cpu_state;

float *weft_cpu_scratch(weft_backend *self, int slot, size_t floats) {
    cpu_state *st = self->impl;
    int t = omp_get_thread_num() * WEFT_CPU_SCRATCH_SLOTS + slot;
    WEFT_CHECK(t < st->n_threads * WEFT_CPU_SCRATCH_SLOTS,
               "internal: more OpenMP threads than the backend was built for");
    if (st->capacity[t] < floats) {
        weft_free(st->scratch[t]);
        st->scratch[t] = weft_alloc(floats * sizeof(float));
        st->capacity[t] = floats;
    }
    return st->scratch[t];
}

// Blocks of a megabyte or more are mapped from the kernel: its pages are zero and cost time and
// memory only once written, so a KV pool sized for the worst case (by default up to half the
// free memory) costs what its sequences use. A header before each block says where it came from.
enum { MAPPED_FROM = 1 << 20, BLOCK_HEADER = 64 }; // the header keeps 64-byte alignment

typedef struct block_header {
    size_t bytes;  // header included
    bool mapped;   // from mmap, else from weft_alloc
} block_header;

static void *cpu_alloc(weft_backend *self, size_t bytes) {
    size_t total = bytes + BLOCK_HEADER;
    bool mapped = total >= MAPPED_FROM;
    char *base;
    if (mapped) {
        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        WEFT_CHECK(base != MAP_FAILED, "out of host memory allocating %zu bytes", bytes);
    } else {
        base = weft_alloc(total);
    }
    *(block_header *)base = (block_header){total, mapped};
    weft_backend_count_bytes(self, (long long)total);
    return base + BLOCK_HEADER;
}
static void cpu_free(weft_backend *self, void *p) {
    if (!p) return;
    char *base = (char *)p - BLOCK_HEADER;
    block_header h = *(block_header *)base;
    weft_backend_count_bytes(self, -(long long)h.bytes);
    if (h.mapped) munmap(base, h.bytes);
    else weft_free(base);
}
static void cpu_copy(weft_backend *self, void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}
static void cpu_zero(weft_backend *self, void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
}
static void cpu_synchronize(weft_backend *self) {}
static size_t cpu_memory_available(weft_backend *self) {
    return (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
}

static void cpu_from_f32(weft_backend *self, void *dst, weft_dtype t, const float *src, size_t n) {
    WEFT_CHECK(t == WEFT_F32, "cpu backend holds fp32 tensors only");
    cpu_copy(self, dst, src, n * sizeof(float));
}
static void cpu_to_f32(weft_backend *self, float *dst, const void *src, weft_dtype t, size_t n) {
    WEFT_CHECK(t == WEFT_F32, "cpu backend holds fp32 tensors only");
    cpu_copy(self, dst, src, n * sizeof(float));
}

// ---------------------------------------------------------------------------------- matmul ----

// OpenBLAS 0.3.21 sends small products (M*N*K up to about 1e6, or M*N below a few thousand) to
// special kernels whose summation order differs from its regular one, so a row's result would
// depend on how many rows share the call: a micro-batch split would change the forward pass.
// Such calls get their rows padded with zeros up to a size the regular kernel takes; rows of a
// product are then the same bits in any micro-batch. The cost is bounded (a few MFLOP per call)
// and only tiny models ever pay it, and only where OpenBLAS runs kernels with such a path (the
// Sandybridge kernels weft runs on CPUs without AVX-512 have none: blas_setup.c).
// A product with B transposed (a linear layer's forward, X W^T) takes the small kernel only
// while M*N <= 1200, K >= 32 and M*N*K <= 1e6 (OpenBLAS's SkylakeX permit for its "TN" case, and
// what tests/rollout checks bit for bit): it is padded just past that, which keeps a decode step's
// few rows cheap. Other products keep the conservative bound.
static int rows_for_regular_kernel(bool tb, int n, int k) {
    long by_mnk = 1000000L / ((long)n * k) + 1;
    if (tb) {
        long by_mn = 1200L / n + 1;
        return k < 32 ? 1 : (int)(by_mn < by_mnk ? by_mn : by_mnk);
    }
    long by_mn = (8192L + n - 1) / n;
    return (int)(by_mn > by_mnk ? by_mn : by_mnk);
}

// Up to this many rows a product goes through few_rows.c where that has OpenBLAS's bits: its
// operand of A rows (FEW_ROWS x Q floats, 96 to 115 KB) stays in L2 while every panel of B passes.
enum { FEW_ROWS = 64 };

// A weight of the fixed parameters, packed on its first use into few_rows.c's panels, or
// rounded to bf16 for bf16_weights.c (a weight both exact and drafting passes read has both).
typedef struct packed_weight {
    const float *b;
    int n, k, ldb;
    bool tb, bf16;
    void *panels; // float for few_rows.c, uint16_t for bf16
} packed_weight;

// While the caller holds the parameters fixed, every weight among them is packed once and a
// decode step reads its panels, instead of repacking it on every call.
static const packed_weight *held_panels(weft_backend *self, bool tb, int n, int k, const float *b,
                                        int ldb, bool bf16) {
    cpu_state *st = self->impl;
    if (!st->fixed_lo || (const char *)b < st->fixed_lo || (const char *)b >= st->fixed_hi)
        return NULL;
    for (int i = 0; i < st->n_packed; i++) {
        const packed_weight *p = &st->packed[i];
        if (p->b == b && p->n == n && p->k == k && p->ldb == ldb && p->tb == tb && p->bf16 == bf16)
            return p;
    }
    if (st->n_packed == st->cap_packed) {
        st->cap_packed = st->cap_packed ? 2 * st->cap_packed : 64;
        packed_weight *grown = weft_alloc(sizeof *grown * st->cap_packed);
        if (st->n_packed) memcpy(grown, st->packed, sizeof *grown * st->n_packed);
        weft_free(st->packed);
        st->packed = grown;
    }
    void *panels;
    if (bf16) {
        panels = cpu_alloc(self, sizeof(uint16_t) * weft_cpu_bf16_halves(n, k));
        weft_cpu_bf16_pack(n, k, b, ldb, panels);
    } else {
        panels = cpu_alloc(self, sizeof(float) * weft_cpu_few_rows_panel_floats(n, k));
        weft_cpu_few_rows_pack(tb, n, k, b, ldb, panels);
    }
    st->packed[st->n_packed] = (packed_weight){b, n, k, ldb, tb, bf16, panels};
    return &st->packed[st->n_packed++];
}

static void cpu_params_released(weft_backend *self) {
    cpu_state *st = self->impl;
    for (int i = 0; i < st->n_packed; i++) cpu_free(self, st->packed[i].panels);
    st->n_packed = 0;
    st->fixed_lo = st->fixed_hi = NULL;
    st->rounding = false;
}

static void cpu_params_fixed(weft_backend *self, const void *params, size_t bytes) {
    cpu_params_released(self);
    cpu_state *st = self->impl;
    st->fixed_lo = params, st->fixed_hi = (const char *)params + bytes;
}

static void cpu_round_fixed_weights(weft_backend *self, bool rounded) {
    cpu_state *st = self->impl;
    st->rounding = rounded && st->fixed_lo && weft_cpu_bf16_available();
}

// Whether a product of m rows goes through few_rows.c.
static bool few_rows_take(const cpu_state *st, bool tb, int m) {
    return st->few_rows.available && m <= FEW_ROWS && (tb || st->few_rows.untransposed_b);
}

// The packed weight a product x W^T of m rows reads: bf16 for every m while rounding (a draft
// row's bits then never depend on its batch), else few_rows.c's panels for few rows; NULL when
// the weight is not among the fixed parameters or OpenBLAS does the product.
static const packed_weight *packed_for(weft_backend *self, bool tb, int m, int n, int k,
                                       const float *b, int ldb) {
    cpu_state *st = self->impl;
    if (st->rounding && tb) return held_panels(self, tb, n, k, b, ldb, true);
    return few_rows_take(st, tb, m) ? held_panels(self, tb, n, k, b, ldb, false) : NULL;
}

void weft_cpu_openblas_product(weft_backend *self, bool tb, int m, int n, int k, float alpha,
                               const float *a, int lda, const float *b, int ldb, float beta,
                               float *c, int ldc) {
    CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
    cpu_state *st = self->impl;
    int padded = st->pad_small_products ? rows_for_regular_kernel(tb, n, k) : m;
    if (m >= padded) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    float *ap = weft_cpu_scratch(self, 0, (size_t)padded * k);
    float *cp = weft_cpu_scratch(self, 1, (size_t)padded * n);
    memset(ap, 0, sizeof(float) * (size_t)padded * k);
    memset(cp, 0, sizeof(float) * (size_t)padded * n);
    for (int i = 0; i < m; i++) {
        memcpy(ap + (size_t)i * k, a + (size_t)i * lda, sizeof(float) * k);
        if (beta != 0.0f) memcpy(cp + (size_t)i * n, c + (size_t)i * ldc, sizeof(float) * n);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, opb, padded, n, k, alpha, ap, k, b, ldb, beta, cp, n);
    for (int i = 0; i < m; i++) memcpy(c + (size_t)i * ldc, cp + (size_t)i * n, sizeof(float) * n);
}

// C columns [j0, j1) of one product on this thread: against B rounded to bf16 where `packed`
// is, few rows through few_rows.c (B's packed panels from `packed` when it has them), the rest in
// one single-threaded OpenBLAS call.
static void product_columns(weft_backend *self, bool tb, int m, int j0, int j1, int k,
                            float alpha, const float *a, int lda, const float *b, int ldb,
                            const packed_weight *packed, int j_after, float beta, float *c,
                            int ldc) {
    int n = j1 - j0;
    b += tb ? (size_t)j0 * ldb : (size_t)j0, c += j0;
    cpu_state *st = self->impl;
    if (packed && packed->bf16) {
        weft_cpu_bf16_product(m, n, k, alpha, a, lda, (const uint16_t *)packed->panels +
                              (size_t)j0 * k, beta, c, ldc);
        return;
    }
    if (few_rows_take(st, tb, m)) {
        weft_cpu_panels panels = {0};
        if (packed) {
            const float *at = packed->panels;
            panels = (weft_cpu_panels){at + (size_t)j0 * k,
                                       j_after < packed->n ? at + (size_t)j_after * k : NULL,
                                       packed->n - j_after < n ? packed->n - j_after : n};
        }
        weft_cpu_few_rows_product(&st->few_rows, tb, m, n, k, alpha, a, lda, b, ldb, panels, beta,
                                  c, ldc);
        return;
    }
    weft_cpu_openblas_product(self, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Products whose rows are C's rows (A not transposed) run on slices of C's columns (multiples of
// COLUMN_ALIGN, so that single-threaded OpenBLAS calls on them tile C as one call would), through
// few_rows.c or one single-threaded OpenBLAS call per run of slices. OpenBLAS threads a product
// only above about 262,144 multiply-adds, and its threaded driver splits K otherwise than its
// single-threaded one (K = 688: 344 + 344 against 352 + 336), so with 2+ threads a decoded row
// would get other bits than the same row in a training batch. Single-threaded calls split K by
// K alone.
enum { COLUMN_ALIGN = 64 };

// A few-row product's column slices on `threads` threads: a decode step's products read the
// weights from memory, in address order. Each thread walks its own contiguous run of slices in
// order, asking for the next slice's packed weights while it computes one (with the slices dealt
// out in turn, each thread's stream broke at every slice: 20% slower on a Xeon); a thread done
// with its run then claims slices of the others' runs, so that a thread the machine slows does not
// hold the rest at the barrier.
static void few_row_slices(weft_backend *self, bool tb, int m, int n, int k, float alpha,
                           const float *a, int lda, const float *b, int ldb,
                           const packed_weight *packed, float beta, float *c, int ldc,
                           int threads) {
    int slices = (n + COLUMN_ALIGN - 1) / COLUMN_ALIGN, claimed[threads];
    for (int r = 0; r < threads; r++) claimed[r] = slices * r / threads;
#pragma omp parallel num_threads(threads)
    for (int i = 0, me = omp_get_thread_num(); i < threads; i++) {
        int r = (me + i) % threads, end = slices * (r + 1) / threads;
        for (;;) {
            int s;
#pragma omp atomic capture
            s = claimed[r]++;
            if (s >= end) break;
            int j0 = s * COLUMN_ALIGN, j1 = j0 + COLUMN_ALIGN;
            product_columns(self, tb, m, j0, j1 < n ? j1 : n, k, alpha, a, lda, b, ldb, packed,
                            s + 1 < end ? j1 : n, beta, c, ldc);
        }
    }
}

// matmul's C = alpha op(A) op(B) + beta C_in, its threads over column slices.
static void product(weft_backend *self, bool ta, bool tb, int m, int n, int k, float alpha,
                    const void *a, int lda, const void *b, int ldb, float beta, const void *c_in,
                    void *c, int ldc) {
    if (c_in && c_in != c && beta != 0.0f) // OpenBLAS accumulates in place
        for (int i = 0; i < m; i++)
            memcpy((float *)c + (size_t)i * ldc, (const float *)c_in + (size_t)i * ldc,
                   sizeof(float) * n);
    if (ta) { // with A transposed its rows are not C's rows; nothing to keep stable
        cblas_sgemm(CblasRowMajor, CblasTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                    lda, b, ldb, beta, c, ldc);
        return;
    }
    cpu_state *st = self->impl;
    const packed_weight *packed = packed_for(self, tb, m, n, k, b, ldb);
    int slices = (n + COLUMN_ALIGN - 1) / COLUMN_ALIGN, threads = omp_get_max_threads();
    if (threads > slices) threads = slices;
    if (!weft_cpu_on_team((size_t)m * n * k)) threads = 1;
    if (threads == 1) {
        product_columns(self, tb, m, 0, n, k, alpha, a, lda, b, ldb, packed, n, beta, c, ldc);
        return;
    }
    // An OpenBLAS call repacks A: those take one run of slices a thread, handed out as threads
    // come free. Few-row products (few_rows.c reads A in place) go a slice at a time.
    if (packed || few_rows_take(st, tb, m)) {
        few_row_slices(self, tb, m, n, k, alpha, a, lda, b, ldb, packed, beta, c, ldc, threads);
        return;
    }
    int run = (slices + threads - 1) / threads;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int s0 = 0; s0 < slices; s0 += run) {
        int j0 = s0 * COLUMN_ALIGN, j1 = (s0 + run) * COLUMN_ALIGN;
        product_columns(self, tb, m, j0, j1 < n ? j1 : n, k, alpha, a, lda, b, ldb, packed, n,
                        beta, c, ldc);
    }
}

static void add_bias_rows(float *x, const float *b, int T, int C, int ld) {
#pragma omp for schedule(static) nowait
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) x[(size_t)t * ld + c] += b[c];
}

static void cpu_matmul(weft_backend *self, bool ta, bool tb, int m, int n, int k, float alpha,
                       const void *a, int lda, const void *b, int ldb, float beta,
                       const void *c_in, const void *bias, void *c, int ldc,
                       weft_matmul_types types) {
    WEFT_CHECK(types.a == WEFT_F32 && types.b == WEFT_F32 && types.c == WEFT_F32,
               "cpu backend multiplies fp32 matrices only");
    if (m == 0 || n == 0) return;
    product(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c_in, c, ldc);
    if (bias) WEFT_CPU_PARALLEL((size_t)m * n, add_bias_rows(c, bias, m, n, ldc));
}

// Sums rows of a (T, C) matrix into out (C) f32 (+=). Threads own disjoint column ranges, so the
// result does not depend on the thread count.
static void column_sums(const float *x, float *out, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        double acc[16] = {0};
        for (int t = 0; t < T; t++)
            for (int c = c0; c < c1; c++) acc[c - c0] += x[(size_t)t * C + c];
        for (int c = c0; c < c1; c++) out[c] += (float)acc[c - c0];
    }
}

// -------------------------------------------------------------------------------- embedding ----

static void gather_rows(const int32_t *ids, const float *table, float *out, int T, int C) {
#pragma omp for schedule(static) nowait
    for (int t = 0; t < T; t++)
        memcpy(out + (size_t)t * C, table + (size_t)ids[t] * C, C * sizeof(float));
}

static void cpu_embedding_forward(weft_backend *self, const int32_t *ids, const void *table,
                                  void *out, int T, int C) {
    WEFT_CPU_PARALLEL((size_t)T * C, gather_rows(ids, table, out, T, C));
}

static void cpu_embedding_backward(weft_backend *self, const int32_t *ids, const void *dout,
                                   float *dtable, int T, int C) {
    const float *d = dout;
    // Column slices per thread: repeated ids never race.
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        for (int t = 0; t < T; t++)
            for (int c = c0; c < c1; c++) dtable[(size_t)ids[t] * C + c] += d[(size_t)t * C + c];
    }
}

// ---------------------------------------------------------------------------------- rmsnorm ----

enum { NORM_ROWS = 4 }; // rows whose sums of squares run side by side

// ss[i] = the sum over c of x[i][c]^2 in double, in order of c, for `rows` (up to NORM_ROWS) rows
// C apart. Each row's sum is one chain of C dependent adds; rows side by side overlap their
// latencies (32 rows of 512, a decode step's norm: 13 us one row at a time, 4 us four at a time
// on a Xeon core), and every row keeps its own order, so its bits.
static void sums_of_squares(const float *x, int C, int rows, double *ss) {
    if (rows == NORM_ROWS) {
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        const float *x0 = x, *x1 = x + C, *x2 = x + 2 * (size_t)C, *x3 = x + 3 * (size_t)C;
        for (int c = 0; c < C; c++) {
            s0 += (double)x0[c] * x0[c], s1 += (double)x1[c] * x1[c];
            s2 += (double)x2[c] * x2[c], s3 += (double)x3[c] * x3[c];
        }
        ss[0] = s0, ss[1] = s1, ss[2] = s2, ss[3] = s3;
        return;
    }
    for (int i = 0; i < rows; i++) {
        double s = 0;
        for (int c = 0; c < C; c++) s += (double)x[(size_t)i * C + c] * x[(size_t)i * C + c];
        ss[i] = s;
    }
}

static void rmsnorm_rows(const float *x, const float *w, float eps, float *out, float *rstd, int T,
                         int C) {
#pragma omp for schedule(static) nowait
    for (int t0 = 0; t0 < T; t0 += NORM_ROWS) {
        int rows = T - t0 < NORM_ROWS ? T - t0 : NORM_ROWS;
        double ss[NORM_ROWS];
        sums_of_squares(x + (size_t)t0 * C, C, rows, ss);
        for (int i = 0; i < rows; i++) {
            const float *xr = x + (size_t)(t0 + i) * C;
            float *o = out + (size_t)(t0 + i) * C;
            float r = (float)(1.0 / sqrt(ss[i] / C + eps));
            rstd[t0 + i] = r;
            for (int c = 0; c < C; c++) o[c] = xr[c] * r * w[c];
        }
    }
}

static void cpu_rmsnorm_forward(weft_backend *self, const void *x, const void *w, float eps,
                                void *out, float *rstd, int T, int C) {
    WEFT_CPU_PARALLEL((size_t)T * C, rmsnorm_rows(x, w, eps, out, rstd, T, C));
}

static void cpu_rmsnorm_backward(weft_backend *self, const void *xv, const void *wv,
                                 const float *rstd, const void *doutv, void *dxv, float *dw, int T,
                                 int C) {
    const float *x = xv, *w = wv, *dout = doutv;
    float *dx = dxv;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * C, *dy = dout + (size_t)t * C;
        float *dxr = dx + (size_t)t * C;
        float r = rstd[t];
        double dot = 0; // sum_c dy * w * x
        for (int c = 0; c < C; c++) dot += (double)dy[c] * w[c] * xr[c];
        float k = (float)(dot * r * r * r / C);
        for (int c = 0; c < C; c++) dxr[c] += r * w[c] * dy[c] - k * xr[c];
    }
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        double acc[16] = {0};
        for (int t = 0; t < T; t++)
            for (int c = c0; c < c1; c++)
                acc[c - c0] += (double)dout[(size_t)t * C + c] * x[(size_t)t * C + c] * rstd[t];
        for (int c = c0; c < c1; c++) dw[c] += (float)acc[c - c0];
    }
}

// ------------------------------------------------------------------------------------- bias ----

static void cpu_bias_backward(weft_backend *self, const void *dout, float *dbias, int T, int C) {
    column_sums(dout, dbias, T, C);
}

// ------------------------------------------------------------------------------------- rope ----

// The scaled cos and sin of every row's angles, kept for the next rotation by the same positions:
// q and k of every layer rotate by the same angles, so a forward computes them once rather than
// twice a layer (a double sincos a pair is most of a rotation's cost). Angles in double:
// positions reach the tens of thousands, where fp32 angles lose the 1e-5 agreement we test for.
typedef struct rope_angles {
    int T, half;         // rows, pairs a row
    int cap_T, cap_half; // what the buffers hold
    double scale;
    int32_t *positions;  // (T)
    float *inv_freq;     // (half)
    float *cs;           // (T, 2 half): scale cos, then scale sin (unsigned)
} rope_angles;

static void angle_rows(rope_angles *r) {
    int half = r->half;
#pragma omp for schedule(static) nowait
    for (int t = 0; t < r->T; t++)
        for (int i = 0; i < half; i++) {
            double angle = r->positions[t] * (double)r->inv_freq[i];
            r->cs[(size_t)t * 2 * half + i] = (float)(r->scale * cos(angle));
            r->cs[(size_t)t * 2 * half + half + i] = (float)(r->scale * sin(angle));
        }
}

// The table for T > 0 rows at `positions`: the kept one when the call repeats the last one's.
static const rope_angles *angles_for(weft_backend *self, const int32_t *positions,
                                     const float *inv_freq, double scale, int T, int half) {
    rope_angles *r = ((cpu_state *)self->impl)->rope;
    if (r->T == T && r->half == half && r->scale == scale &&
        !memcmp(r->positions, positions, sizeof(int32_t) * T) &&
        !memcmp(r->inv_freq, inv_freq, sizeof(float) * half))
        return r;
    if (T > r->cap_T || half > r->cap_half) {
        weft_free(r->cs), weft_free(r->positions), weft_free(r->inv_freq);
        r->cap_T = T > r->cap_T ? T : r->cap_T, r->cap_half = half > r->cap_half ? half : r->cap_half;
        r->cs = weft_alloc(sizeof(float) * r->cap_T * 2 * r->cap_half);
        r->positions = weft_alloc(sizeof(int32_t) * r->cap_T);
        r->inv_freq = weft_alloc(sizeof(float) * r->cap_half);
    }
    r->T = T, r->half = half, r->scale = scale;
    memcpy(r->positions, positions, sizeof(int32_t) * T);
    memcpy(r->inv_freq, inv_freq, sizeof(float) * half);
    WEFT_CPU_PARALLEL((size_t)T * half * 16, angle_rows(r));
    return r;
}

// Rotates pairs (i, i + D/2) of every head by sign * positions[t] * inv_freq[i], scaled: the
// table's sin negated for sign -1, which is exact, so the bits are the ones computed in place.
static void rotate_rows(float *x, int ld, const rope_angles *r, int H, int D, double sign) {
    int half = D / 2;
    float cs[2 * half];
#pragma omp for schedule(static) nowait
    for (int t = 0; t < r->T; t++) {
        const float *row = r->cs + (size_t)t * 2 * half;
        for (int i = 0; i < half; i++) {
            cs[i] = row[i];
            cs[half + i] = sign < 0 ? -row[half + i] : row[half + i];
        }
        for (int h = 0; h < H; h++) {
            float *v = x + (size_t)t * ld + (size_t)h * D;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[half + i], c = cs[i], s = cs[half + i];
                v[i] = a * c - b * s;
                v[half + i] = b * c + a * s;
            }
        }
    }
}

static void rope_rotate(weft_backend *self, float *x, int ld, const int32_t *positions,
                        const float *inv_freq, double scale, int T, int H, int D, double sign) {
    if (T == 0) return;
    const rope_angles *r = angles_for(self, positions, inv_freq, scale, T, D / 2);
    WEFT_CPU_PARALLEL((size_t)T * H * D, rotate_rows(x, ld, r, H, D, sign));
}

static void cpu_rope_forward(weft_backend *self, void *x, int ld, const int32_t *positions,
                             const float *inv_freq, float scale, int T, int H, int D) {
    rope_rotate(self, x, ld, positions, inv_freq, scale, T, H, D, 1.0);
}

// A scaled rotation's adjoint is the inverse rotation, scaled the same.
static void cpu_rope_backward(weft_backend *self, void *dx, int ld, const int32_t *positions,
                              const float *inv_freq, float scale, int T, int H, int D) {
    rope_rotate(self, dx, ld, positions, inv_freq, scale, T, H, D, -1.0);
}

// ------------------------------------------------------------------------------ columns ----

static void copy_column_blocks(char *fused, const weft_column_parts *parts, int rows, bool join) {
    size_t row_bytes = 0;
    for (int i = 0; i < parts->n; i++) row_bytes += sizeof(float) * parts->width[i];
#pragma omp for schedule(static) nowait
    for (int t = 0; t < rows; t++) {
        char *at = fused + (size_t)t * row_bytes;
        for (int i = 0; i < parts->n; i++) {
            size_t bytes = sizeof(float) * parts->width[i];
            char *part = (char *)parts->part[i] + (size_t)t * bytes;
            memcpy(join ? at : part, join ? part : at, bytes);
            at += bytes;
        }
    }
}

// The q|k|v rows' split with their RoPE (backend.h): the two ops one after the other.
static void cpu_split_columns(weft_backend *self, void *fused, const weft_column_parts *parts,
                              int rows, bool join, const weft_rope_rows *r) {
    int width = 0;
    for (int i = 0; i < parts->n; i++) width += parts->width[i];
    if (r && !join)
        rope_rotate(self, fused, width, r->positions, r->inv_freq, r->scale, rows, r->heads,
                    r->head_dim, 1.0);
    WEFT_CPU_PARALLEL((size_t)rows * width, copy_column_blocks(fused, parts, rows, join));
    if (r && join)
        rope_rotate(self, fused, width, r->positions, r->inv_freq, r->scale, rows, r->heads,
                    r->head_dim, -1.0);
}

// The split, then the store, from the parts (a GPU's one launch; here no launch to save).
static void cpu_split_store(weft_backend *self, void *fused, const weft_column_parts *parts, int T,
                            const weft_rope_rows *rotate, const weft_kv_pool *pool, int layer,
                            const int32_t *slot) {
    cpu_split_columns(self, fused, parts, T, false, rotate);
    weft_cpu_kv_store(self, pool, layer, slot, parts->part[1], parts->part[2], T);
}

// ----------------------------------------------------------------------------- elementwise ----

// Gates in chunks of up to GATE_CHUNK of a row: exp(-g) through the row exponential first
// (vectorized), then sigmoid(g) = 1 / (1 + exp(-g)) per element. gate_up (rows, 2 width) holds
// each row's gates, then its ups.
enum { GATE_CHUNK = 256 };

// Chunk c: n gates at row * 2 width + col, their outputs at row * width + col.
typedef struct gate_chunk {
    size_t row, col, n;
} gate_chunk;

static gate_chunk chunk_of(size_t c, int width) {
    size_t per_row = ((size_t)width + GATE_CHUNK - 1) / GATE_CHUNK, col = c % per_row * GATE_CHUNK;
    size_t left = (size_t)width - col;
    return (gate_chunk){c / per_row, col, left < GATE_CHUNK ? left : GATE_CHUNK};
}

static size_t chunks_of(int rows, int width) {
    return (size_t)rows * (((size_t)width + GATE_CHUNK - 1) / GATE_CHUNK);
}

static void swiglu_chunks(const float *gate_up, float *out, int rows, int width) {
#pragma omp for schedule(static) nowait
    for (size_t c = 0; c < chunks_of(rows, width); c++) {
        gate_chunk k = chunk_of(c, width);
        const float *g = gate_up + k.row * 2 * width + k.col, *u = g + width;
        float *o = out + k.row * width + k.col;
        weft_cpu_exp_sum(g, -1.0f, 0.0f, o, k.n);
        for (size_t i = 0; i < k.n; i++) o[i] = g[i] * (1.0f / (1.0f + o[i])) * u[i];
    }
}

static void cpu_swiglu_forward(weft_backend *self, const void *gate_up, void *out, int rows,
                               int width) {
    WEFT_CPU_PARALLEL((size_t)rows * width, swiglu_chunks(gate_up, out, rows, width));
}

// The two ops one after the other (on the CPU the product costs the same either way).
static void cpu_swiglu_product(weft_backend *self, const void *x, const void *w, void *gate_up,
                               void *out, int rows, int C, int width) {
    weft_matmul_types types = {self->act_dtype, self->param_dtype, self->act_dtype};
    self->matmul(self, false, true, rows, 2 * width, C, 1.0f, x, C, w, C, 0.0f, NULL, NULL,
                 gate_up, 2 * width, types);
    cpu_swiglu_forward(self, gate_up, out, rows, width);
}

static void cpu_swiglu_backward(weft_backend *self, const void *gate_up, const void *doutv,
                                void *d_gate_up, int rows, int width) {
    const float *dout = doutv;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks_of(rows, width); c++) {
        gate_chunk k = chunk_of(c, width);
        const float *g = (const float *)gate_up + k.row * 2 * width + k.col, *u = g + width;
        const float *d = dout + k.row * width + k.col;
        float *dg = (float *)d_gate_up + k.row * 2 * width + k.col, *du = dg + width;
        weft_cpu_exp_sum(g, -1.0f, 0.0f, dg, k.n);
        for (size_t i = 0; i < k.n; i++) {
            float sg = 1.0f / (1.0f + dg[i]), silu = g[i] * sg;
            dg[i] = d[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
            du[i] = d[i] * silu;
        }
    }
}

static void add_elements(float *y, const float *x, size_t N) {
#pragma omp for simd schedule(static) nowait
    for (size_t i = 0; i < N; i++) y[i] += x[i];
}

static void cpu_add_inplace(weft_backend *self, void *y, const void *x, size_t N) {
    WEFT_CPU_PARALLEL(N, add_elements(y, x, N));
}

// --------------------------------------------------------------------------------- reductions ----

// Per-thread partial sums over fixed ranges, added in thread order: the same bits on every run
// (an OpenMP reduction adds its partials in whatever order the threads finish).
static double sum_in_order(const float *x, size_t N, bool squares) {
    double partial[256] = {0};
    int threads = omp_get_max_threads() < 256 ? omp_get_max_threads() : 256;
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        size_t lo = N * t / n, hi = N * (t + 1) / n;
        double acc = 0;
        for (size_t i = lo; i < hi; i++) acc += squares ? (double)x[i] * x[i] : (double)x[i];
        partial[t] = acc;
    }
    double s = 0;
    for (int t = 0; t < threads; t++) s += partial[t];
    return s;
}

static double cpu_sum_f32(weft_backend *self, const float *x, size_t N) {
    return sum_in_order(x, N, false);
}

static double cpu_sumsq_f32(weft_backend *self, const float *x, size_t N) {
    return sum_in_order(x, N, true);
}

static void cpu_accumulate_f32(weft_backend *self, const float *x, size_t N, bool squares,
                               double scale, double *acc) {
    *acc += scale * sum_in_order(x, N, squares);
}

static void cpu_scale_f32(weft_backend *self, float *x, float sc, size_t N) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) x[i] *= sc;
}

// ------------------------------------------------------------------------------------ adamw ----

static void cpu_adamw(weft_backend *self, void *paramv, float *master, const float *grad, float *m,
                      float *v, size_t N, float lr, float beta1, float beta2, float eps,
                      float weight_decay, int step) {
    float *p = master ? master : paramv;
    float bc1 = (float)(1.0 - pow(beta1, step)), bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
    float step_size = lr / bc1, decay = 1.0f - lr * weight_decay;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        float g = grad[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        p[i] = p[i] * decay - step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

// ------------------------------------------------------------------------------------ table ----

static void cpu_destroy(weft_backend *self) {
    cpu_params_released(self);
    cpu_state *st = self->impl;
    weft_free(st->packed);
    weft_free(st->rope->cs), weft_free(st->rope->positions), weft_free(st->rope->inv_freq);
    weft_free(st->rope);
    for (int i = 0; i < WEFT_CPU_SCRATCH_SLOTS * st->n_threads; i++) weft_free(st->scratch[i]);
    weft_free(st->scratch);
    weft_free(st->capacity);
}

weft_backend *weft_backend_cpu_create(void) {
    weft_blas_fix_coretype();
    cpu_state *st = weft_alloc(sizeof *st);
    st->n_threads = omp_get_max_threads();
    st->pad_small_products = !weft_blas_rows_stable_unpadded();
    weft_cpu_few_rows_kind kind = weft_cpu_few_rows_kind_for(weft_blas_corename());
    st->scratch = weft_alloc(sizeof(float *) * WEFT_CPU_SCRATCH_SLOTS * st->n_threads);
    st->capacity = weft_alloc(sizeof(size_t) * WEFT_CPU_SCRATCH_SLOTS * st->n_threads);
    st->rope = weft_alloc(sizeof *st->rope);
    weft_backend *b = weft_alloc(sizeof *b);
    *b = (weft_backend){
        .name = "cpu",
        .act_dtype = WEFT_F32,
        .param_dtype = WEFT_F32,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .to_device = cpu_copy,
        .to_host = cpu_copy,
        .copy = cpu_copy,
        .zero = cpu_zero,
        .synchronize = cpu_synchronize,
        .memory_available = cpu_memory_available,
        .matmul = cpu_matmul,
        .params_fixed = cpu_params_fixed,
        .round_fixed_weights = cpu_round_fixed_weights,
        .params_released = cpu_params_released,
        .embedding_forward = cpu_embedding_forward,
        .embedding_backward = cpu_embedding_backward,
        .rmsnorm_forward = cpu_rmsnorm_forward,
        .rmsnorm_backward = cpu_rmsnorm_backward,
        .bias_backward = cpu_bias_backward,
        .rope_forward = cpu_rope_forward,
        .rope_backward = cpu_rope_backward,
        .attention_forward = weft_cpu_attention_forward,
        .attention_backward = weft_cpu_attention_backward,
        .kv_store = weft_cpu_kv_store,
        .split_store = cpu_split_store,
        .paged_attention = weft_cpu_paged_attention,
        .split_columns = cpu_split_columns,
        .swiglu_forward = cpu_swiglu_forward,
        .swiglu_backward = cpu_swiglu_backward,
        .swiglu_product = cpu_swiglu_product,
        .add_inplace = cpu_add_inplace,
        .cross_entropy = weft_cpu_cross_entropy,
        .logprobs = weft_cpu_logprobs,
        .logits_backward = weft_cpu_logits_backward,
        .sum_f32 = cpu_sum_f32,
        .sumsq_f32 = cpu_sumsq_f32,
        .accumulate_f32 = cpu_accumulate_f32,
        .scale_f32 = cpu_scale_f32,
        .adamw = cpu_adamw,
        .from_f32 = cpu_from_f32,
        .to_f32 = cpu_to_f32,
        .destroy = cpu_destroy,
        .impl = st,
    };
    if (weft_cpu_few_rows_agree(b, &kind)) st->few_rows = kind;
    return b;
}
