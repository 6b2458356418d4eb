// Elementwise, normalization, embedding, reduction and optimizer kernels of the CUDA backend.
// Storage is bf16; arithmetic is fp32 (reductions that feed metrics in double), so the bf16
// rounding happens once per stored tensor, as in the PyTorch bf16 reference.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

// ------------------------------------------------------------------------------- embedding ----

// One block per token, its threads over the row VEC columns at a time: a decode step's one row
// of 2,048 columns is then one 16-byte copy per thread rather than eight 2-byte copies in a row.
template <int VEC>
__global__ void embedding_forward_kernel(const int32_t *ids, const bf16 *table, bf16 *out, int C) {
    wait_for_earlier_kernels();
    int t = blockIdx.x;
    const bf16 *src = table + (size_t)ids[t] * C;
    bf16 *dst = out + (size_t)t * C;
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
        bf16_vec<VEC> v;
        v.load(src + c);
        v.store(dst + c);
    }
}

// One block per token t. A token whose id occurred earlier leaves; the first occurrence of an id
// sums the dout rows of all its occurrences, in token order, and adds the sum to the id's table
// row. Every row then has one writer and one order of addition, so the gradient is the same bits
// on every run (atomics would add in whatever order the blocks ran). Finding the occurrences
// reads all T ids per block (T^2 / 2 compares in all), and an id's block adds its rows one after
// another: a token that occurs n times costs one block n dependent steps (not yet timed on a GPU).
enum { EMBED_THREADS = 256, EMBED_COLS = 8 }; // columns per thread per pass over the occurrences

__global__ void embedding_backward_kernel(const int32_t *ids, const bf16 *dout, float *dtable,
                                          int T, int C) {
    wait_for_earlier_kernels();
    __shared__ unsigned hits[EMBED_THREADS / 32];
    int t = blockIdx.x, id = ids[t], lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int base = 0; base < t; base += blockDim.x) {
        int u = base + threadIdx.x;
        if (__syncthreads_or(u < t && ids[u] == id)) return;
    }
    float *dst = dtable + (size_t)id * C;
    for (int c0 = 0; c0 < C; c0 += blockDim.x * EMBED_COLS) {
        float acc[EMBED_COLS] = {};
        for (int base = t; base < T; base += blockDim.x) {
            int u = base + threadIdx.x;
            unsigned mask = warp_ballot(u < T && ids[u] == id);
            if (lane == 0) hits[warp] = mask;
            __syncthreads();
            for (int w = 0; w < (int)blockDim.x / 32; w++)
                for (unsigned m = hits[w]; m; m &= m - 1) {
                    const bf16 *src = dout + (size_t)(base + w * 32 + __ffs(m) - 1) * C;
#pragma unroll
                    for (int k = 0; k < EMBED_COLS; k++) {
                        int c = c0 + k * blockDim.x + threadIdx.x;
                        if (c < C) acc[k] += to_f32(src[c]);
                    }
                }
            __syncthreads(); // hits is rewritten next
        }
#pragma unroll
        for (int k = 0; k < EMBED_COLS; k++) {
            int c = c0 + k * blockDim.x + threadIdx.x;
            if (c < C) dst[c] += acc[k];
        }
    }
}

extern "C" void weft_cuda_embedding_forward(weft_cuda_stream s, const int32_t *ids,
                                            const void *table, void *out, int T, int C) {
    if (T == 0) return;
    int vec = vector_width(C, table, out);
    WEFT_LAUNCH_VECTORIZED(embedding_forward_kernel, vec, T, 256, 0, s, ids, (const bf16 *)table,
                           (bf16 *)out, C);
}

extern "C" void weft_cuda_embedding_backward(weft_cuda_stream s, const int32_t *ids,
                                             const void *dout, float *dtable, int T, int C) {
    if (T == 0) return;
    WEFT_LAUNCH(embedding_backward_kernel, T, EMBED_THREADS, 0, s, ids, (const bf16 *)dout, dtable,
                T, C);
}

// --------------------------------------------------------------------------------- rmsnorm ----

// Column reductions (norm dw, bias db) without atomics, so their sums are the same bits on every
// run: a block sums its rows' contributions per column into its row of partials (blocks, C), then
// column_partials_kernel adds the blocks' rows in block order. A block takes 16 rows (at 4096
// tokens 256 blocks, two per SM of an H100), more past COLUMN_BLOCKS blocks, which bounds the
// partials and the final pass.
enum { NORM_THREADS = 256, MIN_COLUMN_ROWS = 16, COLUMN_BLOCKS = 512 };

static int column_rows(int T) {
    int rows = (T + COLUMN_BLOCKS - 1) / COLUMN_BLOCKS;
    return rows > MIN_COLUMN_ROWS ? rows : MIN_COLUMN_ROWS;
}

static int column_blocks(int T) { return (T + column_rows(T) - 1) / column_rows(T); }

extern "C" size_t weft_cuda_column_partials_bytes(int T, int C) {
    return sizeof(float) * (size_t)column_blocks(T) * C;
}

// out (C) += the sum over b of partials (blocks, C), in order of b. A block owns 32 columns; its 8
// warps sum every 8th row each, and warp 0 adds the 8 sums in warp order.
enum { PARTIAL_COLUMNS = 32, PARTIAL_GROUPS = 8 };

__global__ void column_partials_kernel(const float *partials, int blocks, int C, float *out) {
    wait_for_earlier_kernels();
    __shared__ float sums[PARTIAL_GROUPS][PARTIAL_COLUMNS];
    int lane = threadIdx.x & 31, group = threadIdx.x >> 5;
    int c = blockIdx.x * PARTIAL_COLUMNS + lane;
    float acc = 0.0f;
    if (c < C)
        for (int b = group; b < blocks; b += PARTIAL_GROUPS) acc += partials[(size_t)b * C + c];
    sums[group][lane] = acc;
    __syncthreads();
    if (group == 0 && c < C) {
        float total = 0.0f;
        for (int g = 0; g < PARTIAL_GROUPS; g++) total += sums[g][lane];
        out[c] += total;
    }
}

static void add_column_partials(weft_cuda_stream s, const float *partials, int T, int C,
                                float *out) {
    WEFT_LAUNCH(column_partials_kernel, (C + PARTIAL_COLUMNS - 1) / PARTIAL_COLUMNS,
                PARTIAL_COLUMNS * PARTIAL_GROUPS, 0, s, partials, column_blocks(T), C, out);
}

// One block per row.
template <int VEC>
__global__ void rmsnorm_forward_kernel(const bf16 *x, const bf16 *w, float eps, bf16 *out,
                                       float *rstd, int C) {
    wait_for_earlier_kernels();
    __shared__ float partial[NORM_THREADS / 32];
    const bf16 *xr = x + (size_t)blockIdx.x * C;
    float ss = 0.0f;
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
        bf16_vec<VEC> v;
        v.load(xr + c);
#pragma unroll
        for (int k = 0; k < VEC; k++) ss += v.x[k] * v.x[k];
    }
    ss = block_sum(ss, partial);
    float r = rsqrtf(ss / C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    bf16 *o = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
        bf16_vec<VEC> v, g;
        v.load(xr + c);
        g.load(w + c);
#pragma unroll
        for (int k = 0; k < VEC; k++) v.x[k] = v.x[k] * r * g.x[k];
        v.store(o + c);
    }
}

// A block owns `rows` rows: it adds their dx, and sums their dw contributions in shared memory
// (each thread its own columns) into its row of partials.
template <int VEC>
__global__ void rmsnorm_backward_kernel(const bf16 *x, const bf16 *w, const float *rstd,
                                        const bf16 *dout, bf16 *dx, float *partials, int T, int C,
                                        int rows) {
    wait_for_earlier_kernels();
    __shared__ float partial[NORM_THREADS / 32];
    float *dw_acc = dynamic_smem<float>(); // (C)
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC)
#pragma unroll
        for (int k = 0; k < VEC; k++) dw_acc[c + k] = 0.0f;
    int t0 = blockIdx.x * rows, t1 = min(t0 + rows, T);
    for (int t = t0; t < t1; t++) {
        const bf16 *xr = x + (size_t)t * C, *dy = dout + (size_t)t * C;
        bf16 *dxr = dx + (size_t)t * C;
        float r = rstd[t], dot = 0.0f;
        for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
            bf16_vec<VEC> g, wv, xv;
            g.load(dy + c);
            wv.load(w + c);
            xv.load(xr + c);
#pragma unroll
            for (int k = 0; k < VEC; k++) dot += g.x[k] * wv.x[k] * xv.x[k];
        }
        dot = block_sum(dot, partial);
        float kc = dot * r * r * r / C;
        for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
            bf16_vec<VEC> g, wv, xv, d;
            g.load(dy + c);
            wv.load(w + c);
            xv.load(xr + c);
            d.load(dxr + c);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                d.x[k] = d.x[k] + r * wv.x[k] * g.x[k] - kc * xv.x[k];
                dw_acc[c + k] += g.x[k] * xv.x[k] * r; // each thread touches only its own columns
            }
            d.store(dxr + c);
        }
    }
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC)
#pragma unroll
        for (int k = 0; k < VEC; k++) partials[(size_t)blockIdx.x * C + c + k] = dw_acc[c + k];
}

extern "C" void weft_cuda_rmsnorm_forward(weft_cuda_stream s, const void *x, const void *w,
                                          float eps, void *out, float *rstd, int T, int C) {
    if (T == 0) return;
    WEFT_LAUNCH_VECTORIZED(rmsnorm_forward_kernel, vector_width(C, x, w, out), T, NORM_THREADS, 0,
                           s, (const bf16 *)x, (const bf16 *)w, eps, (bf16 *)out, rstd, C);
}

extern "C" void weft_cuda_rmsnorm_backward(weft_cuda_stream s, const void *x, const void *w,
                                           const float *rstd, const void *dout, void *dx, float *dw,
                                           int T, int C, float *partials) {
    if (T == 0) return;
    WEFT_LAUNCH_VECTORIZED(rmsnorm_backward_kernel, vector_width(C, x, w, dout, dx),
                           column_blocks(T), NORM_THREADS, sizeof(float) * C, s, (const bf16 *)x,
                           (const bf16 *)w, rstd, (const bf16 *)dout, (bf16 *)dx, partials, T, C,
                           column_rows(T));
    add_column_partials(s, partials, T, C, dw);
}

// ------------------------------------------------------------------------------------ bias ----

template <int VEC> __global__ void bias_forward_kernel(bf16 *x, const bf16 *bias, size_t N, int C) {
    wait_for_earlier_kernels();
    for (size_t i = global_index() * VEC; i < N; i += global_stride() * VEC) {
        bf16_vec<VEC> a, b;
        a.load(x + i);
        b.load(bias + i % C); // C is a multiple of VEC: the vector stays in one row
#pragma unroll
        for (int k = 0; k < VEC; k++) a.x[k] += b.x[k];
        a.store(x + i);
    }
}

__global__ void column_sums_kernel(const bf16 *x, float *partials, int T, int C, int rows) {
    wait_for_earlier_kernels();
    int t0 = blockIdx.x * rows, t1 = min(t0 + rows, T);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int t = t0; t < t1; t++) acc += to_f32(x[(size_t)t * C + c]);
        partials[(size_t)blockIdx.x * C + c] = acc;
    }
}

extern "C" void weft_cuda_bias_forward(weft_cuda_stream s, void *x, const void *bias, int T,
                                       int C) {
    size_t N = (size_t)T * C;
    if (N == 0) return;
    int vec = vector_width(C, x, bias);
    WEFT_LAUNCH_VECTORIZED(bias_forward_kernel, vec, grid_for(N / vec), 256, 0, s, (bf16 *)x,
                           (const bf16 *)bias, N, C);
}

extern "C" void weft_cuda_bias_backward(weft_cuda_stream s, const void *dout, float *dbias, int T,
                                        int C, float *partials) {
    if (T == 0) return;
    WEFT_LAUNCH(column_sums_kernel, column_blocks(T), 256, 0, s, (const bf16 *)dout, partials, T, C,
                column_rows(T));
    add_column_partials(s, partials, T, C, dbias);
}

// ------------------------------------------------------------------------------------ rope ----

// One thread per (row, pair), looping over the heads: the factors are formed once per row and
// pair instead of once per head.
__global__ void rope_kernel(bf16 *x, int ld, rope_rows r, int T) {
    wait_for_earlier_kernels();
    int half = r.D / 2;
    size_t N = (size_t)T * half;
    for (size_t i = global_index(); i < N; i += global_stride()) {
        int pair = (int)(i % half), t = (int)(i / half);
        float c, sn;
        rope_factors(r, t, pair, &c, &sn);
        bf16 *v = x + (size_t)t * ld + pair;
        for (int h = 0; h < r.H; h++, v += r.D)
            rotate_pair(to_f32(v[0]), to_f32(v[half]), c, sn, &v[0], &v[half]);
    }
}

extern "C" void weft_cuda_rope(weft_cuda_stream s, void *x, int ld, const int32_t *positions,
                               const float *inv_freq, float scale, int T, int H, int D,
                               float sign) {
    size_t N = (size_t)T * (D / 2);
    if (N == 0 || H == 0) return;
    rope_rows r = {positions, inv_freq, scale, sign, H, D};
    WEFT_LAUNCH(rope_kernel, grid_for(N), 256, 0, s, (bf16 *)x, ld, r, T);
}

// ------------------------------------------------------------------------------- columns ----

// The fused rows (rows, width) to or from their parts. With r.H > 0 the row's first r.H heads
// turn on the way, after the join as rope with r.sign -1 turns them, before the split as rope
// with +1 (written back to fused too, so fused ends as rope would leave it): threads i < pairs
// take one RoPE pair of one row through `per` consecutive turned heads (a group); the rest take
// VEC columns of the columns past the turned ones (every part's width, and theirs, a multiple
// of VEC).
template <int VEC>
__global__ void split_columns_kernel(bf16 *fused, column_parts parts, int rows, int width,
                                     bool join, rope_rows r, int per) {
    wait_for_earlier_kernels();
    int half = r.D / 2, turned = r.H * r.D, vectors = (width - turned) / VEC;
    int groups = r.H > 0 ? (r.H + per - 1) / per : 0;
    size_t pairs = (size_t)rows * groups * half, N = pairs + (size_t)rows * vectors;
    for (size_t i = global_index(); i < N; i += global_stride()) {
        if (i < pairs) {
            int pair = (int)(i % half), group = (int)(i / half % groups);
            int t = (int)(i / half / groups), h_end = min(r.H, (group + 1) * per);
            float c, sn;
            rope_factors(r, t, pair, &c, &sn);
            bf16 *row = fused + (size_t)t * width;
            for (int h = group * per, col = pair + h * r.D; h < h_end; h++, col += r.D) {
                bf16 *a = part_at(parts, t, col), *b = part_at(parts, t, col + half);
                const bf16 *from_a = join ? a : row + col, *from_b = join ? b : row + col + half;
                rotate_pair(to_f32(*from_a), to_f32(*from_b), c, sn, &row[col], &row[col + half]);
                if (!join && a) *a = row[col], *b = row[col + half];
            }
            continue;
        }
        size_t j = i - pairs, t = j / vectors;
        int col = turned + (int)(j % vectors) * VEC;
        bf16 *part = part_at(parts, t, col), *at = fused + t * width + col;
        if (!part) continue; // a padding row's keys and values
        bf16_vec<VEC> v;
        v.load(join ? part : at);
        v.store(join ? at : part);
    }
}

// How many heads one RoPE thread of split_columns_kernel turns. One thread per (row, pair)
// through every head forms the factors (a double sincos) once per row and pair, but a decode
// step's few rows then leave a thread 36 heads of dependent loads and stores one after another
// (20 us a layer at batch 1 on an H200); so the heads are split into groups until some 64K
// threads run, each group's thread forming the same factors (the same bits).
static int heads_per_thread(int rows, int pairs, int heads) {
    long per_group = (long)rows * pairs;
    long groups = per_group > 0 ? (65536 + per_group - 1) / per_group : 1;
    if (heads <= 0 || groups >= heads) return 1;
    return (int)((heads + groups - 1) / groups);
}

// The launch of split_columns_kernel for parts p (theirs, or with p.pool the cache's slots).
static void split_parts(weft_cuda_stream s, void *fused, column_parts p, int n, int rows,
                        bool join, const int32_t *positions, const float *inv_freq, float scale,
                        int heads, int D) {
    int width = 0, vec = vector_width(heads * D, fused, p.pool);
    for (int i = 0; i < n && i < 3; i++) {
        width += p.width[i];
        vec = vec == 8 ? vector_width(p.width[i], p.part[i]) : 1;
    }
    rope_rows r = {positions, inv_freq, scale, join ? -1.0f : 1.0f, heads, D};
    int per = heads_per_thread(rows, D / 2, heads);
    int groups = heads > 0 ? (heads + per - 1) / per : 0;
    size_t N = (size_t)rows * groups * (D / 2) + (size_t)rows * (width - heads * D) / vec;
    if (N == 0) return;
    WEFT_LAUNCH_VECTORIZED(split_columns_kernel, vec, grid_for(N), 256, 0, s, (bf16 *)fused, p,
                           rows, width, join, r, per);
}

extern "C" void weft_cuda_split_columns(weft_cuda_stream s, void *fused, void *const *parts,
                                        const int *widths, int n, int rows, bool join,
                                        const int32_t *positions, const float *inv_freq,
                                        float scale, int heads, int D) {
    column_parts p = {};
    for (int i = 0; i < n && i < 3; i++) p.part[i] = (bf16 *)parts[i], p.width[i] = widths[i];
    split_parts(s, fused, p, n, rows, join, positions, inv_freq, scale, heads, D);
}

extern "C" void weft_cuda_split_store(weft_cuda_stream s, void *fused, void *q, int q_width,
                                      int kv_width, int rows, const int32_t *positions,
                                      const float *inv_freq, float scale, int heads, int D,
                                      void *pool, int layers, int block_size, int layer,
                                      const int32_t *slot) {
    column_parts p = stored_parts(q, q_width, kv_width, pool, slot, layers, block_size, layer);
    split_parts(s, fused, p, 3, rows, false, positions, inv_freq, scale, heads, D);
}

// ---------------------------------------------------------------------------------- swiglu ----

// Element i of the (rows, width) output: its gate's offset in gate_up (rows, 2 width); its up
// is width further. VEC elements never cross a row (vector_width asks width % VEC == 0).
__device__ __forceinline__ size_t gate_at(size_t i, size_t width) {
    return i / width * 2 * width + i % width;
}

template <int VEC>
__global__ void swiglu_forward_kernel(const bf16 *gate_up, bf16 *out, size_t N, size_t width) {
    wait_for_earlier_kernels();
    for (size_t i = global_index() * VEC; i < N; i += global_stride() * VEC) {
        bf16_vec<VEC> g, u;
        size_t at = gate_at(i, width);
        g.load(gate_up + at);
        u.load(gate_up + at + width);
#pragma unroll
        for (int k = 0; k < VEC; k++) u.x[k] = swiglu(g.x[k], u.x[k]);
        u.store(out + i);
    }
}

template <int VEC>
__global__ void swiglu_backward_kernel(const bf16 *gate_up, const bf16 *dout, bf16 *d_gate_up,
                                       size_t N, size_t width) {
    wait_for_earlier_kernels();
    for (size_t i = global_index() * VEC; i < N; i += global_stride() * VEC) {
        bf16_vec<VEC> g, u, d, dg, du;
        size_t at = gate_at(i, width);
        g.load(gate_up + at);
        u.load(gate_up + at + width);
        d.load(dout + i);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float sg = sigmoid(g.x[k]);
            dg.x[k] = d.x[k] * u.x[k] * sg * (1.0f + g.x[k] * (1.0f - sg));
            du.x[k] = d.x[k] * g.x[k] * sg;
        }
        dg.store(d_gate_up + at);
        du.store(d_gate_up + at + width);
    }
}

extern "C" void weft_cuda_swiglu_forward(weft_cuda_stream s, const void *gate_up, void *out,
                                         int rows, int width) {
    size_t N = (size_t)rows * width;
    if (N == 0) return;
    int vec = vector_width((size_t)width, gate_up, out);
    WEFT_LAUNCH_VECTORIZED(swiglu_forward_kernel, vec, grid_for(N / vec), 256, 0, s,
                           (const bf16 *)gate_up, (bf16 *)out, N, (size_t)width);
}

extern "C" void weft_cuda_swiglu_backward(weft_cuda_stream s, const void *gate_up,
                                          const void *dout, void *d_gate_up, int rows,
                                          int width) {
    size_t N = (size_t)rows * width;
    if (N == 0) return;
    int vec = vector_width((size_t)width, gate_up, dout, d_gate_up);
    WEFT_LAUNCH_VECTORIZED(swiglu_backward_kernel, vec, grid_for(N / vec), 256, 0, s,
                           (const bf16 *)gate_up, (const bf16 *)dout, (bf16 *)d_gate_up, N,
                           (size_t)width);
}

// ------------------------------------------------------------------------- small arithmetic ----

template <int VEC> __global__ void add_bf16_kernel(bf16 *y, const bf16 *x, size_t N) {
    wait_for_earlier_kernels();
    for (size_t i = global_index() * VEC; i < N; i += global_stride() * VEC) {
        bf16_vec<VEC> a, b;
        a.load(y + i);
        b.load(x + i);
#pragma unroll
        for (int k = 0; k < VEC; k++) a.x[k] += b.x[k];
        a.store(y + i);
    }
}

__global__ void scale_f32_kernel(float *x, float scale, size_t N) {
    wait_for_earlier_kernels();
    for (size_t i = global_index(); i < N; i += global_stride()) x[i] *= scale;
}

// A block's sum into partials[blockIdx.x]; sum_partials_kernel then adds the blocks' sums in a
// fixed order (no atomics: the same bits on every run, as the gradient norm must be).
__global__ void sum_f32_kernel(const float *x, size_t N, bool squares, double *partials) {
    wait_for_earlier_kernels();
    __shared__ double partial[32];
    double acc = 0.0;
    for (size_t i = global_index(); i < N; i += global_stride()) {
        double v = x[i];
        acc += squares ? v * v : v;
    }
    acc = block_sum(acc, partial);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_partials_kernel(const double *partials, int blocks, double scale,
                                    bool accumulate, double *result) {
    wait_for_earlier_kernels();
    __shared__ double partial[32];
    double acc = 0.0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) acc += partials[b];
    acc = block_sum(acc, partial);
    if (threadIdx.x == 0) *result = (accumulate ? *result : 0.0) + scale * acc;
}

extern "C" void weft_cuda_add_bf16(weft_cuda_stream s, void *y, const void *x, size_t N) {
    if (N == 0) return;
    int vec = vector_width(N, y, x);
    WEFT_LAUNCH_VECTORIZED(add_bf16_kernel, vec, grid_for(N / vec), 256, 0, s, (bf16 *)y,
                           (const bf16 *)x, N);
}

extern "C" void weft_cuda_scale_f32(weft_cuda_stream s, float *x, float scale, size_t N) {
    if (N == 0) return;
    WEFT_LAUNCH(scale_f32_kernel, grid_for(N), 256, 0, s, x, scale, N);
}

extern "C" void weft_cuda_sum_f32(weft_cuda_stream s, const float *x, size_t N, bool squares,
                                  double scale, bool accumulate, double *result,
                                  double *partials) {
    if (N == 0) {
        if (!accumulate) cudaMemsetAsync(result, 0, sizeof(double), s->stream);
        return;
    }
    WEFT_LAUNCH(sum_f32_kernel, grid_for(N), 256, 0, s, x, N, squares, partials);
    WEFT_LAUNCH(sum_partials_kernel, 1, 256, 0, s, partials, (int)grid_for(N), scale, accumulate,
                result);
}

// ----------------------------------------------------------------------------------- adamw ----

// The CPU backend's update, element for element (decoupled decay, bias-corrected moments).
__global__ void adamw_kernel(bf16 *param_bf16, float *p, const float *grad, float *m, float *v,
                             size_t N, float beta1, float beta2, float eps, float step_size,
                             float decay, float bc2_sqrt) {
    wait_for_earlier_kernels();
    for (size_t i = global_index(); i < N; i += global_stride()) {
        float g = grad[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        p[i] = pi;
        if (param_bf16) param_bf16[i] = to_bf16(pi);
    }
}

extern "C" void weft_cuda_adamw(weft_cuda_stream s, void *param, float *master, const float *grad,
                                float *m, float *v, size_t N, float lr, float beta1, float beta2,
                                float eps, float weight_decay, int step) {
    if (N == 0) return;
    float bc1 = (float)(1.0 - pow(beta1, step)), bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
    float *p = master ? master : (float *)param;
    WEFT_LAUNCH(adamw_kernel, grid_for(N), 256, 0, s, master ? (bf16 *)param : NULL, p, grad, m, v,
                N, beta1, beta2, eps, lr / bc1, 1.0f - lr * weight_decay, bc2_sqrt);
}
