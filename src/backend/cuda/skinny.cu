// y = alpha x W^T + beta c for 9 to 64 rows of x on the tensor cores: the decode step's
// projections at batches past few_rows.cu's 8 rows. A GEMM's 128-wide column tiles give the 1B
// model's 2,048-column projections 16 blocks a row tile, too few to stream W (the whole cost of
// such a product) at HBM bandwidth: on an H200 a batch-64 decode step ran at a sixth of the
// bandwidth bound on cuBLASLt. Here a block owns BN = 16 columns (16 rows of W) and all the
// rows of x, and its 8 warps split K: warp w multiplies the 32-wide chunks w, w + 8, .. of K
// with mma.sync (bf16 in, fp32 sums), then the block adds the warps' sums in warp order. So N =
// 2,048 makes 128 blocks, each W element is read once, and the result is the same bits on every
// run (no atomics, no split-K across blocks).
//
// The fragments come straight from global memory, 16 bytes a lane: for chunk k0, lane (g, t) =
// (lane / 4, lane % 4) loads columns k0 + 8t .. 8t + 7 of W rows n0 + g and n0 + 8 + g and of x
// rows g and g + 8 of each 16-row tile. The two mma of the chunk then take, as their logical
// columns 2t, 2t + 1 and 2t + 8, 2t + 9 (mma.cuh), the loaded columns 8t + 0..3 and 8t + 4..7:
// A and B are permuted alike along K, so each mma still sums products of matching columns, and
// the two together cover all 32.
#include "backend/cuda/common.cuh"
#include "backend/cuda/mma.cuh"

namespace {
namespace skinny {

constexpr int WARPS = 8, THREADS = 32 * WARPS;
constexpr int BN = 16; // columns (rows of W) a block
constexpr int KC = 32; // K per chunk: two mma of k 16
constexpr int MAX_TILES = WEFT_CUDA_SKINNY_ROWS / 16;

__device__ __forceinline__ uint4 load16(const bf16 *p) {
    return *reinterpret_cast<const uint4 *>(p);
}

// One chunk's products for one lane: acc[mt][nt] (16 x 8 fp32) += x rows (g, g + 8) of row
// tile mt times W rows (8 nt + g) w[nt], their columns k .. k + 31 as the file's comment says.
// x_at[mt][h]: where this lane's x row 16 mt + 8 h + g starts (element offsets past x_lane).
template <int MT>
__device__ __forceinline__ void multiply_chunk(const uint4 *w, const bf16 *x_lane,
                                               const int (*x_at)[2], int k, float (*acc)[2][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        uint4 lo = load16(x_lane + x_at[mt][0] + k), hi = load16(x_lane + x_at[mt][1] + k);
        uint32_t first[4] = {lo.x, hi.x, lo.y, hi.y}, second[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            mma(acc[mt][nt], first, w[nt].x, w[nt].y);
            mma(acc[mt][nt], second, w[nt].z, w[nt].w);
        }
    }
}

// MT row tiles of 16 (rows past M read row M - 1 and are not stored). The next chunk's W (the
// stream from HBM) is loaded before this chunk's products; x, which every block reads and the L2
// holds, is loaded as it is used: so registers allow two blocks an SM (16 warps) without spills.
template <int MT>
__global__ void __launch_bounds__(THREADS, 2)
    skinny_kernel(const bf16 *__restrict__ x, int ldx, const bf16 *__restrict__ w, int ldw, int M,
                  int N, int K, float alpha, float beta, const bf16 *c_in, const bf16 *bias,
                  bf16 *y, int ldc) {
    wait_for_earlier_kernels();
    __shared__ float partial[WARPS][MT * 16][BN + 1]; // + 1: the epilogue's column walk
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int n0 = blockIdx.x * BN;
    const bf16 *wr[2], *x_lane = x + 8 * t;
#pragma unroll
    for (int nt = 0; nt < 2; nt++) wr[nt] = w + (size_t)min(n0 + 8 * nt + g, N - 1) * ldw + 8 * t;
    int x_at[MT][2]; // 32-bit offsets: M <= 64 rows, so they fit, in half the registers
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) x_at[mt][h] = min(16 * mt + 8 * h + g, M - 1) * ldx;

    float acc[MT][2][4] = {};
    int chunks = K / KC;
    uint4 now[2], next[2];
    if (warp < chunks) now[0] = load16(wr[0] + warp * KC), now[1] = load16(wr[1] + warp * KC);
#pragma unroll 1 // the products unroll; the chunks need not (unrolled, ptxas spilled)
    for (int c = warp; c < chunks; c += WARPS) {
        int k = c * KC, k_next = k + WARPS * KC;
        if (c + WARPS < chunks) next[0] = load16(wr[0] + k_next), next[1] = load16(wr[1] + k_next);
        multiply_chunk<MT>(now, x_lane, x_at, k, acc);
        now[0] = next[0], now[1] = next[1];
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                partial[warp][16 * mt + g + 8 * (e >> 1)][8 * nt + 2 * t + (e & 1)] =
                    acc[mt][nt][e];
    __syncthreads();
    for (int i = threadIdx.x; i < MT * 16 * BN; i += THREADS) {
        int m = i / BN, n = n0 + i % BN;
        if (m >= M || n >= N) continue;
        float sum = 0.0f;
        for (int v = 0; v < WARPS; v++) sum += partial[v][m][i % BN];
        float out = alpha * sum;
        if (beta != 0.0f) out += beta * to_f32(c_in[(size_t)m * ldc + n]);
        bf16 stored = to_bf16(out); // a bias as a separate add would: to the stored product
        y[(size_t)m * ldc + n] = bias ? to_bf16(to_f32(stored) + to_f32(bias[n])) : stored;
    }
}

template <int MT>
void launch(weft_cuda_stream s, int M, int N, int K, float alpha, const bf16 *x, int ldx,
            const bf16 *w, int ldw, float beta, const bf16 *c_in, const bf16 *bias, bf16 *y,
            int ldc) {
    static constexpr auto kernel = skinny_kernel<MT>;
    WEFT_LAUNCH(kernel, (unsigned)((N + BN - 1) / BN), THREADS, 0, s, x, ldx, w, ldw, M, N, K,
                alpha, beta, c_in, bias, y, ldc);
}

} // namespace skinny
} // namespace

extern "C" bool weft_cuda_skinny_covers(int M, int K, const void *x, int ldx, const void *w,
                                        int ldw) {
    uintptr_t bits = (uintptr_t)x | (uintptr_t)w;
    return M > WEFT_CUDA_FEW_ROWS && M <= WEFT_CUDA_SKINNY_ROWS && K % skinny::KC == 0 &&
           ldx % 8 == 0 && ldw % 8 == 0 && bits % 16 == 0;
}

extern "C" void weft_cuda_skinny(weft_cuda_stream s, int M, int N, int K, float alpha,
                                 const void *x, int ldx, const void *w, int ldw, float beta,
                                 const void *c_in, const void *bias, void *y, int ldc) {
    if (M == 0 || N == 0) return;
    const bf16 *xb = (const bf16 *)x, *wb = (const bf16 *)w, *cb = (const bf16 *)c_in;
    const bf16 *bb = (const bf16 *)bias;
    bf16 *yb = (bf16 *)y;
    switch ((M + 15) / 16) {
    case 1: skinny::launch<1>(s, M, N, K, alpha, xb, ldx, wb, ldw, beta, cb, bb, yb, ldc); break;
    case 2: skinny::launch<2>(s, M, N, K, alpha, xb, ldx, wb, ldw, beta, cb, bb, yb, ldc); break;
    case 3: skinny::launch<3>(s, M, N, K, alpha, xb, ldx, wb, ldw, beta, cb, bb, yb, ldc); break;
    default:
        static_assert(skinny::MAX_TILES == 4, "a launch per row-tile count");
        skinny::launch<4>(s, M, N, K, alpha, xb, ldx, wb, ldw, beta, cb, bb, yb, ldc);
    }
}
