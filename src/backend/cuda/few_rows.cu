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
#include "backend/cuda/common.cuh"

namespace {
namespace few {

constexpr int MAX_THREADS = 256, CHUNK = 8; // bf16 per 16-byte chunk

// Threads a block: one per chunk of a row of K, in whole warps, at most MAX_THREADS.
inline int threads_for(int K) {
    int warps = (K / CHUNK + 31) / 32;
    return 32 * (warps < 1 ? 1 : warps > MAX_THREADS / 32 ? MAX_THREADS / 32 : warps);
}

// The block's R rows of W (part 1: the ups `N` further that go with them, for SWIGLU), which it
// asks L2 for before it waits for the kernels before it.
template <int R>
__device__ __forceinline__ fixed_rows block_weights(const bf16 *w, int ldw, int K, int N, int part,
                                                    bool prefetch) {
    int n0 = blockIdx.x * R;
    return fixed_rows{w + ((size_t)n0 + (size_t)part * N) * ldw, (size_t)ldw,
                      prefetch ? min(R, N - n0) : 0, K};
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

// MR rows of x (the first `rows` real; the rest read the last real row and are not stored) times
// R rows of W, from column n0 = blockIdx.x * R; with SWIGLU also the R rows `N` further (the ups),
// y = swiglu of the pair (N the activation's width, alpha 1, beta 0). With norm.w, x's rows are
// normalized first, rounded to bf16 as rmsnorm_forward stores them.
template <int MR, int R, bool SWIGLU>
__global__ void __launch_bounds__(MAX_THREADS)
    few_rows_kernel(const bf16 *__restrict__ x, int ldx, const bf16 *__restrict__ w, int ldw,
                    int K, int N, float alpha, float beta, const bf16 *c_in, const bf16 *bias,
                    bf16 *y, int ldc, int rows, bool prefetch, row_norm norm) {
    wait_for_earlier_kernels(block_weights<R>(w, ldw, K, N, 0, prefetch),
                             block_weights<R>(w, ldw, K, N, 1, SWIGLU && prefetch));
    constexpr int WR = SWIGLU ? 2 * R : R; // rows of W a block reads
    __shared__ float partial[MAX_THREADS / 32][MR * WR];
    __shared__ float rstd[MR];
    int n0 = blockIdx.x * R;
    const bf16 *xr[MR], *wr[WR];
#pragma unroll
    for (int m = 0; m < MR; m++) xr[m] = x + (size_t)min(m, rows - 1) * ldx;
#pragma unroll
    for (int r = 0; r < WR; r++)
        wr[r] = w + ((size_t)min(n0 + r % R, N - 1) + (r >= R ? N : 0)) * ldw;
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
    int i = threadIdx.x, m = i / R, r = i % R, n = n0 + r;
    if (i >= MR * R || m >= rows || n >= N) return;
    float sum = 0.0f, up = 0.0f;
    for (int v = 0; v < (int)blockDim.x / 32; v++) sum += partial[v][m * WR + r];
    if constexpr (SWIGLU) {
        for (int v = 0; v < (int)blockDim.x / 32; v++) up += partial[v][m * WR + R + r];
        y[(size_t)m * ldc + n] = swiglu_output(sum, up);
        return;
    }
    size_t at = (size_t)m * ldc + n;
    y[at] = projection_output(sum, alpha, beta, c_in, bias, at, n);
}

// Launches the kernel for rows rounded up to MR, R columns a block.
template <int MR, int R, bool SWIGLU>
void launch(weft_cuda_stream s, const bf16 *x, int ldx, const bf16 *w, int ldw, int K, int N,
            float alpha, float beta, const bf16 *c_in, const bf16 *bias, bf16 *y, int ldc,
            int rows, row_norm norm) {
    static constexpr auto kernel = few_rows_kernel<MR, R, SWIGLU>;
    WEFT_LAUNCH(kernel, (unsigned)((N + R - 1) / R), threads_for(K), 0, s, x, ldx, w, ldw, K, N,
                alpha, beta, c_in, bias, y, ldc, rows, s->prefetch_weights, norm);
}

// Columns a block: 4 where that still leaves the GPU a few blocks per SM, one for the small
// projections (k and v, N = 256 in the 1B model), fewer for many rows (registers: MR x R sums,
// twice that with SWIGLU).
template <int MR, bool SWIGLU>
void launch_rows(weft_cuda_stream s, const bf16 *x, int ldx, const bf16 *w, int ldw, int K, int N,
                 float alpha, float beta, const bf16 *c_in, const bf16 *bias, bf16 *y, int ldc,
                 int rows, row_norm norm) {
    constexpr int WIDE = MR <= 4 ? 4 : 2;
    if (N < 1024)
        launch<MR, 1, SWIGLU>(s, x, ldx, w, ldw, K, N, alpha, beta, c_in, bias, y, ldc, rows,
                              norm);
    else launch<MR, WIDE, SWIGLU>(s, x, ldx, w, ldw, K, N, alpha, beta, c_in, bias, y, ldc, rows,
                                  norm);
}

// The launch for M rows (rounded up to 1, 2, 4 or 8).
template <bool SWIGLU>
void launch_any(weft_cuda_stream s, int M, int N, int K, float alpha, const void *x, int ldx,
                const void *w, int ldw, float beta, const void *c_in, const void *bias, void *y,
                int ldc, row_norm norm) {
    if (M == 0 || N == 0) return;
    const bf16 *xb = (const bf16 *)x, *wb = (const bf16 *)w, *cb = (const bf16 *)c_in;
    const bf16 *bb = (const bf16 *)bias;
    bf16 *yb = (bf16 *)y;
    if (M == 1)
        launch_rows<1, SWIGLU>(s, xb, ldx, wb, ldw, K, N, alpha, beta, cb, bb, yb, ldc, M, norm);
    else if (M == 2)
        launch_rows<2, SWIGLU>(s, xb, ldx, wb, ldw, K, N, alpha, beta, cb, bb, yb, ldc, M, norm);
    else if (M <= 4)
        launch_rows<4, SWIGLU>(s, xb, ldx, wb, ldw, K, N, alpha, beta, cb, bb, yb, ldc, M, norm);
    else launch_rows<8, SWIGLU>(s, xb, ldx, wb, ldw, K, N, alpha, beta, cb, bb, yb, ldc, M, norm);
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
    few::launch_any<false>(s, M, N, K, alpha, x, ldx, w, ldw, beta, c_in, bias, y, ldc, {});
}

extern "C" void weft_cuda_few_rows_swiglu(weft_cuda_stream s, int M, int width, int K,
                                          const void *x, int ldx, const void *w, int ldw, void *y,
                                          int ldy) {
    few::launch_any<true>(s, M, width, K, 1.0f, x, ldx, w, ldw, 0.0f, NULL, NULL, y, ldy, {});
}

extern "C" void weft_cuda_few_rows_normed(weft_cuda_stream s, int M, int N, int K, const void *x,
                                          const void *norm_w, float eps, const void *w,
                                          const void *bias, void *y, bool swiglu) {
    few::row_norm norm = {(const bf16 *)norm_w, eps};
    if (swiglu) few::launch_any<true>(s, M, N, K, 1.0f, x, K, w, K, 0.0f, NULL, NULL, y, N, norm);
    else few::launch_any<false>(s, M, N, K, 1.0f, x, K, w, K, 0.0f, NULL, bias, y, N, norm);
}
