// y = alpha x W^T + beta c for 9 to 64 rows of x on the tensor cores: the decode step's
// projections at batches past few_rows.cu's 8 rows; and, for generation that must not depend
// on its batching (the backend's batch_invariant), for any number of rows. A GEMM's 128-wide
// column tiles give the 1B model's 2,048-column projections 16 blocks a row tile, too few to
// stream W (the whole cost of such a product) at HBM bandwidth: on an H200 a batch-64 decode
// step ran at a sixth of the bandwidth bound on cuBLASLt.
//
// A block owns BN = 64 columns (64 rows of W), all the rows of x, and one of S contiguous ranges
// of K (split-K across blocks, S chosen so that some 264 blocks run: 8 for N = 2,048, 1 for the
// output head). Its 8 warps are 4 column groups of 16 times 2 halves of the range's 32-wide
// chunks; each multiplies with mma.sync (bf16 in, fp32 sums). So each W element is read once,
// and x once per block (as many bytes as W at 64 rows, where 16-column blocks read it 4 times
// over). The block adds its two halves, and with S > 1 writes the fp32 sum to `partials`; the
// last block of a column block to arrive (a counter per column block, reset by that block) adds
// the S sums in split order and writes y. Every sum has one order: runs repeat bit for bit.
//
// Past 64 rows the rows go in blocks of 64 along the grid's y, each such row block a copy of the
// 64-row product; launches take as many row blocks as the counters allow (S > 1). There the
// block stages x in shared memory, a pair of chunks at a time (cp.async, double-buffered), for
// its 4 column groups to read, where they would read it from L2 4 times over: at 256 rows x
// costs 4 times W's bytes a block, and L2's bandwidth, not HBM's, is what bounds. A row's sums
// are those of its 16-row tile's mma, which add each output of the tile from its own row of x
// alone, in an order fixed by N and K (S, the halves, the chunks): so a row has the same bits
// whatever rows share the call, from 1 row to thousands.
//
// A forward-only pass's MLP input (weft_cuda_skinny_swiglu, W the gate rows then the up rows)
// runs the same product with each block's 64 columns 32 gates and their 32 ups, and writes only
// swiglu of each pair, rounded as the product and then swiglu_forward would round: the same
// bits, as K splits by the same rule (N = 2 width) and each column's sums are alike wherever the
// column sits.
//
// The fragments come straight from global memory, 16 bytes a lane: for chunk k0, lane (g, t) =
// (lane / 4, lane % 4) loads columns k0 + 8t .. 8t + 7 of W rows g and 8 + g of its column group
// and of x rows g and g + 8 of each 16-row tile. The two mma of the chunk then take, as their
// logical columns 2t, 2t + 1 and 2t + 8, 2t + 9 (mma.cuh), the loaded columns 8t + 0..3 and
// 8t + 4..7: A and B are permuted alike along K, so each mma still sums products of matching
// columns, and the two together cover all 32.
#include "backend/cuda/common.cuh"
#include "backend/cuda/mma.cuh"

namespace {
namespace skinny {

constexpr int WARPS = 8, THREADS = 32 * WARPS;
constexpr int GROUP = 16;                   // columns a warp: two mma n-tiles
constexpr int GROUPS = 4, HALVES = WARPS / GROUPS;
constexpr int BN = GROUP * GROUPS;          // columns a block
constexpr int KC = 32;                      // K per chunk: two mma of k 16
constexpr int TARGET_BLOCKS = 264;          // two an SM of an H100 or H200 (132 SMs)
constexpr int MIN_SPLIT_CHUNKS = 4;         // a split gives each warp at least two chunks

__device__ __forceinline__ uint4 load16(const bf16 *p) {
    return load_vector<uint4>(p);
}

// One chunk's products for one lane: acc[mt][nt] (16 x 8 fp32) += x rows (g, g + 8) of row
// tile mt times W rows (8 nt + g of the group) w[nt], their columns k .. k + 31 as the file's
// comment says. x_at[mt][h]: where this lane's x row 16 mt + 8 h + g starts, past x_lane.
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

// x_at for the lane's rows of x, `stride` apart: rows past the row block's last real one (rows)
// read it. 32-bit offsets within a block of 64 rows, in half the registers.
template <int MT> __device__ __forceinline__ void lane_rows(int stride, int rows, int (*x_at)[2]) {
    int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) x_at[mt][h] = min(16 * mt + 8 * h + g, rows - 1) * stride;
}

// The warp's sums over its chunks of [c0, c1): chunks c0 + half, + HALVES, .. The next chunk's
// W (the stream from HBM) is loaded before this chunk's products; x (rows ldx apart, `rows` of
// them real), which the L2 holds, as it is used: so registers allow two blocks an SM (16 warps)
// without spills.
template <int MT>
__device__ __forceinline__ void warp_sums(const bf16 *const *wr, const bf16 *x, int ldx, int rows,
                                          int c0, int c1, int half, float (*acc)[2][4]) {
    int x_at[MT][2];
    lane_rows<MT>(ldx, rows, x_at);
    const bf16 *x_lane = x + 8 * (threadIdx.x & 3);
    uint4 now[2], next[2];
    int c = c0 + half;
    if (c < c1) now[0] = load16(wr[0] + c * KC), now[1] = load16(wr[1] + c * KC);
#pragma unroll 1 // the products unroll; the chunks need not (unrolled, ptxas spilled)
    for (; c < c1; c += HALVES) {
        int k_next = (c + HALVES) * KC;
        if (c + HALVES < c1) next[0] = load16(wr[0] + k_next), next[1] = load16(wr[1] + k_next);
        multiply_chunk<MT>(now, x_lane, x_at, c * KC, acc);
        now[0] = next[0], now[1] = next[1];
    }
}

// Stages x's columns of chunks c and c + 1 (those below c1) for the block's 16 MT rows into xs
// (HALVES, 16 MT, KC): rows past the row block's last real one (rows) repeat it, as the reads
// from global memory do.
template <int MT>
__device__ __forceinline__ void stage_x_pair(const bf16 *x, int ldx, int rows, int c, int c1,
                                             bf16 *xs) {
    constexpr int PIECES = KC / 8, TILE_ROWS = 16 * MT; // 16-byte pieces a row of a chunk
    for (int i = threadIdx.x; i < HALVES * TILE_ROWS * PIECES; i += THREADS) {
        int h = i / (TILE_ROWS * PIECES), r = i / PIECES % TILE_ROWS, q = i % PIECES;
        if (c + h >= c1) continue;
        const bf16 *src = x + (size_t)min(r, rows - 1) * ldx + (size_t)(c + h) * KC + 8 * q;
        cp_async16(xs + ((size_t)h * TILE_ROWS + r) * KC + 8 * q, src, true);
    }
    cp_async_commit();
}

// warp_sums with x from shared memory: the block walks its chunks of [c0, c1) a pair at a time
// (a chunk for each half, as there), staging the next pair's x while it multiplies this one's.
// The same loads of W and the same products in the same order: the same sums.
template <int MT>
__device__ __forceinline__ void block_sums_shared_x(const bf16 *const *wr, const bf16 *x,
                                                    int ldx, int rows, int c0, int c1, int half,
                                                    bf16 *xs, float (*acc)[2][4]) {
    constexpr int TILE = HALVES * 16 * MT * KC; // bf16 of one pair's x
    int x_at[MT][2];
    lane_rows<MT>(KC, 16 * MT, x_at); // every staged row: stage_x_pair repeated the last real one
    const bf16 *x_lane = xs + half * 16 * MT * KC + 8 * (threadIdx.x & 3);
    uint4 now[2], next[2];
    int c = c0 + half, pairs = (c1 - c0 + HALVES - 1) / HALVES;
    if (c < c1) now[0] = load16(wr[0] + c * KC), now[1] = load16(wr[1] + c * KC);
    stage_x_pair<MT>(x, ldx, rows, c0, c1, xs);
#pragma unroll 1
    for (int i = 0; i < pairs; i++, c += HALVES) {
        if (i + 1 < pairs) {
            stage_x_pair<MT>(x, ldx, rows, c0 + HALVES * (i + 1), c1, xs + ((i + 1) & 1) * TILE);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); // this pair's x has landed, every thread's copies
        if (c < c1) {
            int k_next = (c + HALVES) * KC;
            if (c + HALVES < c1) next[0] = load16(wr[0] + k_next), next[1] = load16(wr[1] + k_next);
            multiply_chunk<MT>(now, x_lane + (i & 1) * TILE, x_at, 0, acc);
            now[0] = next[0], now[1] = next[1];
        }
        __syncthreads(); // every warp is done with this buffer before it is staged again
    }
}

struct product {
    const bf16 *x, *w;
    int ldx, ldw, M, N, K, ldc;
    float alpha, beta;
    const bf16 *c_in, *bias;
    bf16 *y;
    int splits;       // S
    float *partials;  // (row blocks, column blocks, S, MT * 16, BN) fp32 where S > 1
    int *arrived;     // a counter per (row block, column block), zero between launches
    bool prefetch;    // the queue's prefetch_weights
};

// Where column col (0 .. BN) of column block `block` reads W: its row. With SWIGLU (N = 2 width:
// the gate rows, then the up rows) the block's first BN / 2 columns are gates and the rest the
// ups that go with them, width rows further.
template <bool SWIGLU> __device__ __forceinline__ int w_row(const product &p, int block, int col) {
    if (!SWIGLU) return min(block * BN + col, p.N - 1);
    constexpr int HALF = BN / 2;
    int width = p.N / 2;
    return col / HALF * width + min(block * HALF + col % HALF, width - 1);
}

// The product at (m, col) of the block: its two halves' sums; with tiles (S > 1) every split's
// such sum, added in split order.
template <int ROWS>
__device__ __forceinline__ float column_total(const float (*sums)[ROWS][BN + 1],
                                              const float *tiles, int splits, int m, int col) {
    if (!tiles) return sums[0][m][col] + sums[1][m][col];
    float sum = 0.0f;
    for (int s = 0; s < splits; s++) sum += __ldcg(&tiles[((size_t)s * ROWS + m) * BN + col]);
    return sum;
}

// The block's outputs: y = the epilogue of each product, or with SWIGLU swiglu of each gate and
// up, both rounded to bf16 as the product would be stored (the bits of the product followed by
// swiglu_forward).
template <int ROWS, bool SWIGLU>
__device__ void write_outputs(const product &p, int block, const float (*sums)[ROWS][BN + 1],
                              const float *tiles) {
    constexpr int COLS = SWIGLU ? BN / 2 : BN; // outputs a row of the block
    int row0 = ROWS * blockIdx.y;
    for (int i = threadIdx.x; i < ROWS * COLS; i += THREADS) {
        int m = i / COLS, col = i % COLS, n = block * COLS + col;
        if (row0 + m >= p.M || n >= (SWIGLU ? p.N / 2 : p.N)) continue;
        float total = column_total<ROWS>(sums, tiles, p.splits, m, col);
        size_t at = (size_t)(row0 + m) * p.ldc + n;
        if constexpr (SWIGLU) {
            float up = column_total<ROWS>(sums, tiles, p.splits, m, col + COLS);
            p.y[at] = swiglu_output(total, up);
        } else {
            p.y[at] = projection_output(total, p.alpha, p.beta, p.c_in, p.bias, at, n);
        }
    }
}

// Block blockIdx.x's share: its column block, and chunks [c0, c1) of K (its split).
struct share {
    int block, c0, c1;
};
__device__ __forceinline__ share share_of(const product &p) {
    int split = blockIdx.x % p.splits;
    int chunks = p.K / KC, per_split = (chunks + p.splits - 1) / p.splits;
    int c0 = split * per_split;
    return share{(int)blockIdx.x / p.splits, c0, min(chunks, c0 + per_split)};
}

// The weights the block reads over its split of K: its columns' rows of W (with SWIGLU, part 0
// the gates and part 1 the ups that go with them), asked for before the kernel waits.
template <bool SWIGLU>
__device__ __forceinline__ fixed_rows block_weights(const product &p, int part) {
    share s = share_of(p);
    int block = s.block, c0 = s.c0, c1 = s.c1;
    int cols = SWIGLU ? BN / 2 : BN, width = SWIGLU ? p.N / 2 : p.N;
    int first = block * cols;
    int rows = !p.prefetch || (part == 1 && !SWIGLU) ? 0 : min(cols, width - first);
    return fixed_rows{p.w + ((size_t)first + (size_t)part * width) * p.ldw + (size_t)c0 * KC,
                      (size_t)p.ldw, rows, (c1 - c0) * KC};
}

// MT row tiles of 16 (rows past M read row M - 1 and are not stored). blockIdx.x = column block
// * S + split; blockIdx.y = row block (of MT * 16 rows: 64 wherever there is more than one).
// SHARED_X: x staged in shared memory (block_sums_shared_x), which the sums reuse afterwards.
template <int MT, bool SWIGLU, bool SHARED_X>
__global__ void __launch_bounds__(THREADS, 2) skinny_kernel(product p) {
    wait_for_earlier_kernels(block_weights<SWIGLU>(p, 0), block_weights<SWIGLU>(p, 1));
    constexpr int ROWS = MT * 16;
    constexpr size_t SUMS = sizeof(float) * HALVES * ROWS * (BN + 1); // + 1: the epilogue's walk
    constexpr size_t X = SHARED_X ? sizeof(bf16) * 2 * HALVES * ROWS * KC : 0; // two pairs
    __shared__ __align__(16) unsigned char shared[SUMS > X ? SUMS : X];
    auto sums = reinterpret_cast<float (*)[ROWS][BN + 1]>(shared);
    __shared__ bool last;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int group = warp % GROUPS, half = warp / GROUPS;
    share s = share_of(p);
    int block = s.block, split = blockIdx.x % p.splits;

    int row0 = ROWS * blockIdx.y, rows = p.M - row0;
    const bf16 *wr[2], *x = p.x + (size_t)row0 * p.ldx; // the row block's rows
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
        wr[nt] = p.w + (size_t)w_row<SWIGLU>(p, block, GROUP * group + 8 * nt + g) * p.ldw + 8 * t;
    float acc[MT][2][4] = {};
    if constexpr (SHARED_X)
        block_sums_shared_x<MT>(wr, x, p.ldx, rows, s.c0, s.c1, half,
                                reinterpret_cast<bf16 *>(shared), acc);
    else
        warp_sums<MT>(wr, x, p.ldx, rows, s.c0, s.c1, half, acc);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = 16 * mt + g + 8 * (e >> 1);
                sums[half][row][GROUP * group + 8 * nt + 2 * t + (e & 1)] = acc[mt][nt][e];
            }
    __syncthreads();
    if (p.splits == 1) {
        write_outputs<ROWS, SWIGLU>(p, block, sums, nullptr);
        return;
    }
    int column_blocks = gridDim.x / p.splits, group_at = blockIdx.y * column_blocks + block;
    float *tiles = p.partials + (size_t)group_at * p.splits * ROWS * BN; // (S, ROWS, BN)
    for (int i = threadIdx.x; i < ROWS * BN; i += THREADS)
        tiles[(size_t)split * ROWS * BN + i] = sums[0][i / BN][i % BN] + sums[1][i / BN][i % BN];
    __threadfence(); // this block's tile is visible before it counts itself in
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&p.arrived[group_at], 1) == p.splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence(); // the other blocks' tiles, which they made visible before counting
    write_outputs<ROWS, SWIGLU>(p, block, sums, tiles);
    if (threadIdx.x == 0) p.arrived[group_at] = 0; // for the next launch
}

// S: enough splits of K for TARGET_BLOCKS blocks, each of at least MIN_SPLIT_CHUNKS chunks, and
// none where the column blocks outnumber the counters.
inline int splits_for(int N, int K) {
    int blocks = (N + BN - 1) / BN, chunks = K / KC;
    if (blocks > WEFT_CUDA_ARRIVAL_COUNTERS) return 1;
    int want = (TARGET_BLOCKS + blocks - 1) / blocks, most = chunks / MIN_SPLIT_CHUNKS;
    int splits = max(1, min(want, most)), per_split = (chunks + splits - 1) / splits;
    return (chunks + per_split - 1) / per_split; // none left empty
}

// Row blocks of 64 that one launch takes past 64 rows: all of them without splits; with splits,
// as many as the arrival counters serve (a counter per row block and column block) and at most
// 16, which bounds the partials (4 MB a row block at N = K = 2,048).
inline int row_blocks_per_launch(int N, int splits, int row_blocks) {
    int most = splits == 1 ? 65535 : min(16, WEFT_CUDA_ARRIVAL_COUNTERS / ((N + BN - 1) / BN));
    return max(1, min(most, row_blocks));
}

template <int MT, bool SWIGLU, bool SHARED_X = false>
void launch(weft_cuda_stream s, const product &p, int row_blocks) {
    static constexpr auto kernel = skinny_kernel<MT, SWIGLU, SHARED_X>;
    dim3 grid((unsigned)((p.N + BN - 1) / BN * p.splits), (unsigned)row_blocks);
    WEFT_LAUNCH(kernel, grid, THREADS, 0, s, p);
}

// The launch for p.M rows (in row tiles of 16; past 64, launches of row blocks of 64), p.splits
// set. From 3 row tiles on x is staged in shared memory where the queue says so (at 64 rows the
// column groups' reads of x from L2 are 4 times W's bytes; at 32, twice), past 64 always.
template <bool SWIGLU> void launch_rows(weft_cuda_stream s, const product &p) {
    if (p.M == 0 || p.N == 0) return;
    static_assert(WEFT_CUDA_SKINNY_ROWS == 64, "a launch per row-tile count, up to 4");
    bool shared_x = s->skinny_shared_x;
    switch ((p.M + 15) / 16) {
    case 1: return launch<1, SWIGLU>(s, p, 1);
    case 2: return launch<2, SWIGLU>(s, p, 1);
    case 3: return shared_x ? launch<3, SWIGLU, true>(s, p, 1) : launch<3, SWIGLU>(s, p, 1);
    case 4: return shared_x ? launch<4, SWIGLU, true>(s, p, 1) : launch<4, SWIGLU>(s, p, 1);
    }
    constexpr int ROWS = 64;
    int total = (p.M + ROWS - 1) / ROWS, per = row_blocks_per_launch(p.N, p.splits, total);
    for (int first = 0; first < total; first += per) { // the partials serve one launch at a time
        size_t r0 = (size_t)first * ROWS;
        product part = p;
        part.x += r0 * p.ldx;
        part.y += r0 * p.ldc;
        if (p.c_in) part.c_in += r0 * p.ldc;
        part.M = min(per * ROWS, p.M - (int)r0);
        launch<4, SWIGLU, true>(s, part, min(per, total - first));
    }
}

} // namespace skinny
} // namespace

extern "C" bool weft_cuda_skinny_fits(int K, const void *x, int ldx, const void *w, int ldw) {
    uintptr_t bits = (uintptr_t)x | (uintptr_t)w;
    return K % skinny::KC == 0 && ldx % 8 == 0 && ldw % 8 == 0 && bits % 16 == 0;
}

extern "C" size_t weft_cuda_skinny_partials_bytes(int M, int N, int K) {
    int splits = skinny::splits_for(N, K), blocks = (M + 63) / 64;
    if (splits == 1 || M == 0) return 0;
    int rows = M <= 64 ? (M + 15) / 16 * 16
                       : 64 * skinny::row_blocks_per_launch(N, splits, blocks);
    return sizeof(float) * (size_t)(N + skinny::BN - 1) / skinny::BN * splits * rows * skinny::BN;
}

extern "C" void weft_cuda_skinny(weft_cuda_stream s, int M, int N, int K, float alpha,
                                 const void *x, int ldx, const void *w, int ldw, float beta,
                                 const void *c_in, const void *bias, void *y, int ldc,
                                 float *partials, int *arrived) {
    skinny::product p = {(const bf16 *)x, (const bf16 *)w, ldx, ldw, M, N, K, ldc, alpha, beta,
                         (const bf16 *)c_in, (const bf16 *)bias, (bf16 *)y,
                         skinny::splits_for(N, K), partials, arrived, s->prefetch_weights};
    skinny::launch_rows<false>(s, p);
}

extern "C" void weft_cuda_skinny_swiglu(weft_cuda_stream s, int M, int width, int K,
                                        const void *x, int ldx, const void *w, int ldw, void *y,
                                        int ldy, float *partials, int *arrived) {
    skinny::product p = {(const bf16 *)x, (const bf16 *)w, ldx, ldw, M, 2 * width, K, ldy, 1.0f,
                         0.0f, NULL, NULL, (bf16 *)y, skinny::splits_for(2 * width, K),
                         partials, arrived, s->prefetch_weights};
    skinny::launch_rows<true>(s, p);
}
