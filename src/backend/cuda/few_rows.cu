// y = alpha x W^T + beta c for a few rows of x: the decode step's projections (one row per
// sequence, or per drafted token). A GEMM kernel tiles y in column blocks, typically 128 wide:
// at N = 2048 that is 16 blocks for the GPU's 132 SMs unless it also splits K, too few to stream
// the weights at HBM bandwidth, which is all a decode step at batch 1 has to do (on an H100 the
// 1B model's batch-1 steps ran at a quarter of it). Here a block owns R columns (R rows of W) and
// its T threads walk K in 16-byte chunks (thread t takes chunks t, t + T, ...; T is 256, or fewer
// where K has fewer chunks: K alone fixes it), each W chunk read once and multiplied into every
// row of x, and the block sums its threads in a fixed order: warp shuffles, then the warps in
// turn. Row m's result depends on row m and K alone (not on how many rows come with it, nor on
// R): the same bits whatever the batch holds.
//
// The same kernel serves a forward-only pass's MLP input, swiglu(x W^T) with W the gate rows then
// the up rows (weft_cuda_few_rows_swiglu): a block owns R gate rows and the R up rows that go
// with them, rounds both sums to bf16 as the product would be stored, and writes only the
// activation: the bits of the product followed by swiglu_forward, one launch fewer and the
// product never written.
//
// And a decode step's q|k|v product, with its norm folded in, can store its rows where
// split_store would (weft_cuda_few_rows_normed_store): a block then owns R / 2 RoPE pairs of one
// head (columns p .. and the same D / 2 further), rounds its sums to bf16 as the product would be
// stored, turns the q and k heads' pairs with RoPE's own factors and rotation, and writes q to
// its rows and k and v to the pool's slots: the bits of the product followed by split_store, one
// launch fewer a layer.
#include "backend/cuda/common.cuh"

namespace {
namespace few {

constexpr int MAX_THREADS = 256, CHUNK = 8; // bf16 per 16-byte chunk

// What a block does with its sums: store y (alpha, beta, bias), store swiglu of each gate and
// up pair (W's gate rows then its up rows, N further), or store q|k|v as split_store would.
enum epilogue { STORE, SWIGLU, ROPE_STORE };

// ROPE_STORE's destination: q|k|v rows whose first rope.H heads turn, stored where split_store
// puts them (common.cuh's stored_parts).
struct rope_store {
    rope_rows rope;
    column_parts parts;
};

// Output column r (0 .. R) of this block: R consecutive columns, or for ROPE_STORE the R / 2
// consecutive RoPE pairs of one head that the block owns, first halves then second halves.
template <int R, int EPI> __device__ __forceinline__ int block_column(int r, int D) {
    if constexpr (EPI == ROPE_STORE) {
        constexpr int P = R / 2;
        int half = D / 2, per_head = half / P, head = blockIdx.x / per_head;
        return head * D + blockIdx.x % per_head * P + r % P + r / P * half;
    }
    return blockIdx.x * R + r;
}

// Threads a block: one per chunk of a row of K, in whole warps, at most MAX_THREADS.
inline int threads_for(int K) {
    int warps = (K / CHUNK + 31) / 32;
    return 32 * (warps < 1 ? 1 : warps > MAX_THREADS / 32 ? MAX_THREADS / 32 : warps);
}

// The block's R rows of W, which it asks L2 for before it waits for the kernels before it, as
// two runs: SWIGLU, its R gate rows and the R ups `N` further; ROPE_STORE, the pairs' first
// halves and their second halves; else all R, and no second run.
template <int R, int EPI>
__device__ __forceinline__ fixed_rows block_weights(const bf16 *w, int ldw, int K, int N, int D,
                                                    int part, bool prefetch) {
    int first = block_column<R, EPI>(EPI == ROPE_STORE ? part * (R / 2) : 0, D);
    int rows = EPI == ROPE_STORE ? R / 2 : EPI == SWIGLU || part == 0 ? min(R, N - first) : 0;
    if (EPI == SWIGLU) first += part * N;
    return fixed_rows{w + (size_t)first * ldw, (size_t)ldw, prefetch ? rows : 0, K};
}

// x normalized on the way in (a forward-only pass's RMSNorm folded into the product that reads
// it): w (K) the norm's weights, NULL for x as it is.
struct row_norm {
    const bf16 *w;
    float eps;
};

// The RMSNorm factor 1 / sqrt(mean(x^2) + eps) of each of the MR rows into rstd (shared), in the
// exact order of kernels.cu's rmsnorm_forward_kernel, so that the normalized rows have its bits:
// its NORM_THREADS threads' sums of squares (thread t: 16-byte vectors t, t + NORM_THREADS, ..),
// each warp's by warp_sum, the warps' in turn. Those threads are virtual here: this block's
// threads take them in turn, and its warps take the (row, virtual warp) sums.
template <int MR>
__device__ void norm_factors(const bf16 *const *xr, int K, float eps, float *rstd) {
    constexpr int NORM_THREADS = 256, NORM_WARPS = NORM_THREADS / 32; // kernels.cu's
    __shared__ float thread_sums[MR][NORM_THREADS], warp_sums[MR][NORM_WARPS];
    for (int t = threadIdx.x; t < NORM_THREADS; t += blockDim.x)
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float ss = 0.0f;
            for (int c = t * CHUNK; c < K; c += NORM_THREADS * CHUNK) {
                bf16_vec<CHUNK> v;
                v.load(xr[m] + c);
#pragma unroll
                for (int k = 0; k < CHUNK; k++) ss += v.x[k] * v.x[k];
            }
            thread_sums[m][t] = ss;
        }
    __syncthreads();
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int i = threadIdx.x >> 5; i < MR * NORM_WARPS; i += warps) {
        float v = warp_sum(thread_sums[i / NORM_WARPS][(i % NORM_WARPS) * 32 + lane]);
        if (lane == 0) warp_sums[i / NORM_WARPS][i % NORM_WARPS] = v;
    }
    __syncthreads();
    if (threadIdx.x < MR) {
        float total = 0.0f;
        for (int v = 0; v < NORM_WARPS; v++) total += warp_sums[threadIdx.x][v];
        rstd[threadIdx.x] = rsqrtf(total / K + eps);
    }
    __syncthreads();
}

// Turns the pair (a, b) at columns col and col + D / 2 of row t where its head is one of the
// first rope.H, and stores both where split_store puts them.
__device__ __forceinline__ void store_pair(const rope_store &st, int t, int col, bf16 a, bf16 b) {
    int D = st.rope.D, half = D / 2;
    if (col / D < st.rope.H) {
        float c, sn;
        rope_factors(st.rope, t, col % D, &c, &sn);
        rotate_pair(to_f32(a), to_f32(b), c, sn, &a, &b);
    }
    bf16 *to = part_at(st.parts, t, col); // col + half: the same head, so the same part
    if (!to) return;                      // a padding row's keys and values
    to[0] = a;
    to[half] = b;
}

// MR rows of x (the first `rows` real; the rest read the last real row and are not stored) times
// the block's R rows of W (block_column); with SWIGLU also the R rows `N` further (the ups),
// y = swiglu of the pair (N the activation's width, alpha 1, beta 0); with ROPE_STORE (alpha 1,
// beta 0) the rows go where `st` says. With norm.w, x's rows are normalized first, rounded to
// bf16 as rmsnorm_forward stores them.
template <int MR, int R, int EPI>
__global__ void __launch_bounds__(MAX_THREADS)
    few_rows_kernel(const bf16 *__restrict__ x, int ldx, const bf16 *__restrict__ w, int ldw,
                    int K, int N, float alpha, float beta, const bf16 *c_in, const bf16 *bias,
                    bf16 *y, int ldc, int rows, bool prefetch, row_norm norm, rope_store st) {
    wait_for_earlier_kernels(block_weights<R, EPI>(w, ldw, K, N, st.rope.D, 0, prefetch),
                             block_weights<R, EPI>(w, ldw, K, N, st.rope.D, 1, prefetch));
    int D = st.rope.D;
    constexpr int WR = EPI == SWIGLU ? 2 * R : R; // rows of W a block reads
    __shared__ float partial[MAX_THREADS / 32][MR * WR];
    __shared__ float rstd[MR];
    const bf16 *xr[MR], *wr[WR];
#pragma unroll
    for (int m = 0; m < MR; m++) xr[m] = x + (size_t)min(m, rows - 1) * ldx;
#pragma unroll
    for (int r = 0; r < WR; r++)
        wr[r] = w + ((size_t)min(block_column<R, EPI>(r % R, D), N - 1) + (r >= R ? N : 0)) * ldw;
    if (norm.w) norm_factors<MR>(xr, K, norm.eps, rstd);
    float acc[MR][WR] = {};
    for (int c = threadIdx.x * CHUNK; c < K; c += blockDim.x * CHUNK) {
        bf16_vec<CHUNK> wv[WR], g;
#pragma unroll
        for (int r = 0; r < WR; r++) wv[r].load(wr[r] + c);
        if (norm.w) g.load(norm.w + c);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            bf16_vec<CHUNK> xv;
            xv.load(xr[m] + c);
            if (norm.w)
#pragma unroll
                for (int k = 0; k < CHUNK; k++)
                    xv.x[k] = to_f32(to_bf16(xv.x[k] * rstd[m] * g.x[k]));
#pragma unroll
            for (int r = 0; r < WR; r++)
#pragma unroll
                for (int k = 0; k < CHUNK; k++) acc[m][r] = fmaf(xv.x[k], wv[r].x[k], acc[m][r]);
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int r = 0; r < WR; r++) {
            float v = warp_sum(acc[m][r]);
            if (lane == 0) partial[warp][m * WR + r] = v;
        }
    __syncthreads();
    int i = threadIdx.x, m = i / R, r = i % R, n = block_column<R, EPI>(r, D);
    float sum = 0.0f, up = 0.0f;
    if (i < MR * R)
        for (int v = 0; v < (int)blockDim.x / 32; v++) sum += partial[v][m * WR + r];
    if constexpr (EPI == ROPE_STORE) { // the pair's halves meet in shared memory
        __shared__ bf16 stored[MR][R];
        if (i < MR * R) stored[m][r] = projection_output(sum, 1.0f, 0.0f, NULL, bias, 0, n);
        __syncthreads();
        constexpr int P = R / 2;
        if (i < MR * P && i / P < rows)
            store_pair(st, i / P, block_column<R, EPI>(i % P, D), stored[i / P][i % P],
                       stored[i / P][i % P + P]);
        return;
    }
    if (i >= MR * R || m >= rows || n >= N) return;
    if constexpr (EPI == SWIGLU) {
        for (int v = 0; v < (int)blockDim.x / 32; v++) up += partial[v][m * WR + R + r];
        y[(size_t)m * ldc + n] = swiglu_output(sum, up);
        return;
    }
    size_t at = (size_t)m * ldc + n;
    y[at] = projection_output(sum, alpha, beta, c_in, bias, at, n);
}

// One call's product: y (rows, N) = alpha x W^T + beta c_in (+ bias), or what the epilogue
// makes of it.
struct product {
    const bf16 *x, *w, *c_in, *bias;
    bf16 *y;
    int ldx, ldw, ldc, K, N, rows;
    float alpha, beta;
    row_norm norm;
    rope_store st;
};

// Launches the kernel for rows rounded up to MR, R columns a block.
template <int MR, int R, int EPI> void launch(weft_cuda_stream s, const product &p) {
    static constexpr auto kernel = few_rows_kernel<MR, R, EPI>;
    WEFT_LAUNCH(kernel, (unsigned)((p.N + R - 1) / R), threads_for(p.K), 0, s, p.x, p.ldx, p.w,
                p.ldw, p.K, p.N, p.alpha, p.beta, p.c_in, p.bias, p.y, p.ldc, p.rows,
                s->prefetch_weights, p.norm, p.st);
}

// Columns a block: 4 where that still leaves the GPU a few blocks per SM, one for the small
// projections (k and v, N = 256 in the 1B model), fewer for many rows (registers: MR x R sums,
// twice that with SWIGLU). ROPE_STORE: two RoPE pairs (4 columns) where half a head holds an
// even number of pairs and the sums allow, else one.
template <int MR, int EPI> void launch_rows(weft_cuda_stream s, const product &p) {
    constexpr int WIDE = MR <= 4 ? 4 : 2;
    if constexpr (EPI == ROPE_STORE) {
        if constexpr (WIDE == 4)
            if (p.st.rope.D % 4 == 0) return launch<MR, 4, EPI>(s, p);
        launch<MR, 2, EPI>(s, p);
    } else if (p.N < 1024) {
        launch<MR, 1, EPI>(s, p);
    } else {
        launch<MR, WIDE, EPI>(s, p);
    }
}

// The launch for p.rows rows (rounded up to 1, 2, 4 or 8).
template <int EPI> void launch_any(weft_cuda_stream s, const product &p) {
    if (p.rows == 0 || p.N == 0) return;
    if (p.rows == 1) launch_rows<1, EPI>(s, p);
    else if (p.rows == 2) launch_rows<2, EPI>(s, p);
    else if (p.rows <= 4) launch_rows<4, EPI>(s, p);
    else launch_rows<8, EPI>(s, p);
}

} // namespace few
} // namespace

extern "C" bool weft_cuda_few_rows_covers(int M, int K, const void *x, int ldx, const void *w,
                                          int ldw) {
    uintptr_t bits = (uintptr_t)x | (uintptr_t)w;
    return M >= 1 && M <= WEFT_CUDA_FEW_ROWS && K % few::CHUNK == 0 && ldx % few::CHUNK == 0 &&
           ldw % few::CHUNK == 0 && bits % 16 == 0;
}

extern "C" void weft_cuda_few_rows(weft_cuda_stream s, int M, int N, int K, float alpha,
                                   const void *x, int ldx, const void *w, int ldw, float beta,
                                   const void *c_in, const void *bias, void *y, int ldc) {
    few::product p = {(const bf16 *)x, (const bf16 *)w, (const bf16 *)c_in, (const bf16 *)bias,
                      (bf16 *)y, ldx, ldw, ldc, K, N, M, alpha, beta, {}, {}};
    few::launch_any<few::STORE>(s, p);
}

extern "C" void weft_cuda_few_rows_swiglu(weft_cuda_stream s, int M, int width, int K,
                                          const void *x, int ldx, const void *w, int ldw, void *y,
                                          int ldy) {
    few::product p = {(const bf16 *)x, (const bf16 *)w, NULL, NULL, (bf16 *)y, ldx, ldw, ldy,
                      K, width, M, 1.0f, 0.0f, {}, {}};
    few::launch_any<few::SWIGLU>(s, p);
}

extern "C" void weft_cuda_few_rows_normed(weft_cuda_stream s, int M, int N, int K, const void *x,
                                          const void *norm_w, float eps, const void *w,
                                          const void *bias, void *y, bool swiglu) {
    few::product p = {(const bf16 *)x, (const bf16 *)w, NULL, (const bf16 *)bias, (bf16 *)y,
                      K, K, N, K, N, M, 1.0f, 0.0f, {(const bf16 *)norm_w, eps}, {}};
    if (swiglu) few::launch_any<few::SWIGLU>(s, p);
    else few::launch_any<few::STORE>(s, p);
}

extern "C" void weft_cuda_few_rows_normed_store(weft_cuda_stream s, int M, int K, const void *x,
                                                const void *norm_w, float eps, const void *w,
                                                const void *bias, void *q, int q_width,
                                                int kv_width, const int32_t *positions,
                                                const float *inv_freq, float scale, int heads,
                                                int D, void *pool, int layers, int block_size,
                                                int layer, const int32_t *slot) {
    column_parts parts =
        stored_parts(q, q_width, kv_width, pool, slot, layers, block_size, layer);
    few::rope_store st = {{positions, inv_freq, scale, 1.0f, heads, D}, parts};
    few::product p = {(const bf16 *)x, (const bf16 *)w, NULL, (const bf16 *)bias, NULL,
                      K, K, 0, K, q_width + 2 * kv_width, M, 1.0f, 0.0f,
                      {(const bf16 *)norm_w, eps}, st};
    few::launch_any<few::ROPE_STORE>(s, p);
}
