// Varlen causal attention on the tensor cores (FlashAttention-2 structure, bf16 mma.sync with
// fp32 accumulators). Same contract and masking rule as the fp32 kernels in attention.cu: query
// row i of document d sees keys cu_kv[d] + [0, q_pos[i]].
//
// Every product is a warp-level mma.sync.m16n8k16: A is 16x16 (row-major), B is 16x8, C/D 16x8
// fp32. With g = lane / 4 and t = lane % 4 (PTX ISA, "matrix fragments for mma.m16n8k16"):
//   A regs: {row g, cols 2t..2t+1}, {row g+8, cols 2t..}, {row g, cols 2t+8..}, {row g+8, 2t+8..}
//   B regs: {rows (k) 2t..2t+1, col (n) g}, {rows 2t+8..2t+9, col g}
//   C:      c0,c1 at row g, cols 2t, 2t+1; c2,c3 at row g+8, same cols
// so two neighbouring C tiles of a score product are exactly the A fragment of the next product:
// probabilities never leave registers. Operands in shared memory are loaded with ldmatrix, four
// 8x8 matrices per instruction; its .trans form reads a row-major tile as the B operand of the
// transposed product (V in P V, K in dS K, Q and dO in the dK/dV products), so every tile is
// staged once, row-major, by cp.async. Rows are padded by 8 bf16, so the 8 rows an ldmatrix
// phase reads fall in 32 distinct banks for every head_dim. The forward and dQ kernels double-
// buffer their key tiles: tile j+1 is in flight while tile j is multiplied.
//
// Kernels: forward (a block = 4 warps' query rows of one head, keys in tiles of 64); dQ (same
// split, recomputing P from the forward's lse); dK/dV (a block = 4 warps' keys seen by one query
// head, walking the query rows that can see them, 32 at a time). A warp owns 32 rows (keys) where
// head_dim <= 64, so each B fragment read from shared memory feeds two mma (as in
// FlashAttention-2's forward), else 16; see m_tiles. Under
// grouped-query attention each query head writes fp32 partial dK/dV and a last pass sums the
// group, so the grid has H (not KV) columns of blocks and the work stays balanced. Each output
// element has one writer: no atomics, and runs are bit-reproducible.
#pragma once
#include "backend/cuda/attention.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"

#include <float.h>

#include <limits.h>
#include <math.h>

namespace {

constexpr int WARPS = 4, THREADS = 32 * WARPS;
constexpr int BLOCK_KEYS = 64; // keys per tile of the forward and dQ kernels
constexpr int STEP_ROWS = 32;  // query rows per step of the dK/dV kernel
constexpr int PAD = 8;         // bf16 of padding per shared-memory row
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t load_u32(const bf16 *p) {
    return load_vector<uint32_t>(p);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) { // lo in the low half
    return (uint32_t)__bfloat16_as_ushort(to_bf16(lo)) |
           (uint32_t)__bfloat16_as_ushort(to_bf16(hi)) << 16;
}

// Four 8x8 bf16 matrices from shared memory: lane l names row (l & 15), columns 8 * (l >> 4) ..
// of the 16x16 block at `m` (row stride ld) from (row0, col0), so r[0..3] are the blocks
// (top, left), (bottom, left), (top, right), (bottom, right). Lane l receives, of each block,
// row l/4, columns 2(l%4) and +1 (transposed: rows 2(l%4) and +1 of column l/4).
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16 *m, int ld, int row0,
                                            int col0) {
    int lane = threadIdx.x & 31;
    const bf16 *p = m + (size_t)(row0 + (lane & 15)) * ld + col0 + 8 * (lane >> 4);
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_ldmatrix(r, p, TRANS);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t address = (uint32_t)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(address));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(address));
#else
    __trap();
#endif
}

// A fragment of the 16 rows at `m` (row stride ld), columns k0 .. k0+15; rows >= n_rows read as 0.
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16 *m, size_t ld, int k0,
                                       int n_rows = 16) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const bf16 *r0 = m + (size_t)g * ld + k0 + 2 * t, *r1 = r0 + 8 * ld;
    bool ok0 = g < n_rows, ok1 = g + 8 < n_rows;
    a[0] = ok0 ? load_u32(r0) : 0u;
    a[1] = ok1 ? load_u32(r1) : 0u;
    a[2] = ok0 ? load_u32(r0 + 8) : 0u;
    a[3] = ok1 ? load_u32(r1 + 8) : 0u;
}

// The A fragment for k-chunk kc of a product whose A is the result c (16 x 8·n) of an earlier one.
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float (*c)[4], int kc) {
    a[0] = pack_bf16(c[2 * kc][0], c[2 * kc][1]);
    a[1] = pack_bf16(c[2 * kc][2], c[2 * kc][3]);
    a[2] = pack_bf16(c[2 * kc + 1][0], c[2 * kc + 1][1]);
    a[3] = pack_bf16(c[2 * kc + 1][2], c[2 * kc + 1][3]);
}

// The products below run on MT m-tiles at once (a warp owning 16·MT rows of A): every B fragment
// loaded from shared memory feeds MT mma, which is what bounds mma.sync's rate on Hopper.

// c[mt] (16 x 8·NT) = A[mt] (16 x D, as DK fragments in registers) times B^T, where B (8·NT x D)
// is the row-major tile `m`: scores Q K^T, dP = dO V^T, and their transposes.
template <int MT, int NT, int DK>
__device__ __forceinline__ void product_a_regs(float (*c)[NT][4], const uint32_t (*a)[DK][4],
                                               const bf16 *m, int ld) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) c[mt][nt][e] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2)
#pragma unroll
        for (int kc = 0; kc < DK; kc++) {
            uint32_t b[4]; // b0, b1 of n-tiles nt and nt + 1
            ldmatrix_x4<false>(b, m, ld, nt * 8, kc * 16);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma(c[mt][nt], a[mt][kc], b[0], b[2]);
                mma(c[mt][nt + 1], a[mt][kc], b[1], b[3]);
            }
        }
}

// As above, with A[mt] the rows 16·mt .. 16·mt + 15 of the row-major tile `am`.
template <int MT, int NT, int DK>
__device__ __forceinline__ void product_a_smem(float (*c)[NT][4], const bf16 *am, const bf16 *m,
                                               int ld) {
    uint32_t a[MT][DK][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int kc = 0; kc < DK; kc++) ldmatrix_x4<false>(a[mt][kc], am, ld, 16 * mt, kc * 16);
    product_a_regs<MT, NT, DK>(c, a, m, ld);
}

// acc[mt] (16 x 8·NO) += C-held A[mt] (16 x 16·KC) times B, where B (16·KC x 8·NO) is the
// row-major tile `m` read transposed by ldmatrix: P V, dS K, P^T dO, dS^T Q.
template <int MT, int KC, int NO>
__device__ __forceinline__ void accumulate_c_times(float (*acc)[NO][4], const float (*c)[2 * KC][4],
                                                   const bf16 *m, int ld) {
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) c_to_a(a[mt], c[mt], kc);
#pragma unroll
        for (int no = 0; no < NO; no += 2) {
            uint32_t b[4]; // b0, b1 of n-tile no, then of no + 1
            ldmatrix_x4<true>(b, m, ld, kc * 16, no * 8);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma(acc[mt][no], a[mt], b[0], b[1]);
                mma(acc[mt][no + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// Issues the copies of rows [r0, r0 + ROWS) of a (., D) bf16 matrix with row stride src_ld into
// the row-major tile dst (row stride D + PAD); rows at or past r_end become zeros (0 * garbage
// could be NaN). Consecutive threads take consecutive 16-byte chunks of a row: coalesced reads,
// conflict-free writes. The caller commits and waits.
template <int D, int ROWS>
__device__ void stage_rows(bf16 *dst, const bf16 *src, size_t src_ld, int r0, int r_end) {
    constexpr int CHUNKS = D / 8;
    for (int idx = threadIdx.x; idx < ROWS * CHUNKS; idx += THREADS) {
        int r = idx / CHUNKS, c = idx - r * CHUNKS, row = r0 + r;
        bool valid = row < r_end;
        cp_async16(dst + r * (D + PAD) + 8 * c, valid ? src + (size_t)row * src_ld + 8 * c : src,
                   valid);
    }
}

// How many m-tiles (16 rows of the A operand) each warp of every kernel owns, by head_dim / 16:
// two where the registers allow it (ptxas -v: 255 or fewer at head_dim 64 for all three kernels;
// sm_80's forward spills one register, stored and loaded outside its key loop), one otherwise.
__host__ __device__ constexpr int m_tiles(int DK) { return DK <= 4 ? 2 : 1; }
// Query rows per forward / dQ block, keys per dK/dV block.
__host__ __device__ constexpr int block_rows(int DK) { return WARPS * 16 * m_tiles(DK); }

// Key ranges of the block's ROWS query rows from r0 into shared memory; returns the union of the
// block's ranges and of this warp's WARP_ROWS rows. Ends with a barrier.
struct key_span {
    int lo, hi;
};
template <int ROWS, int WARP_ROWS>
__device__ void block_key_ranges(const weft_cuda_attention_args &a, int r0, int *row_lo,
                                 int *row_hi, key_span *block, key_span *warp) {
    static_assert(ROWS <= THREADS, "a thread per row");
    if (threadIdx.x < ROWS) row_key_range(a, r0 + threadIdx.x, &row_lo[threadIdx.x],
                                          &row_hi[threadIdx.x]);
    __syncthreads();
    *block = {INT_MAX, 0};
    *warp = {INT_MAX, 0};
    int first = (threadIdx.x >> 5) * WARP_ROWS;
    for (int r = 0; r < ROWS; r++) {
        if (row_hi[r] <= row_lo[r]) continue;
        block->lo = min(block->lo, row_lo[r]);
        block->hi = max(block->hi, row_hi[r]);
        if (r >= first && r < first + WARP_ROWS) {
            warp->lo = min(warp->lo, row_lo[r]);
            warp->hi = max(warp->hi, row_hi[r]);
        }
    }
}

// The elementwise work between the products is what bounds these kernels, not the tensor cores:
// one instruction issued per cycle per warp scheduler must cover the masking, the softmax and
// the conversions of every score. So the tiles inside every row's key range skip the mask, the
// scale rides in the exponent's FFMA, and the exponential is the special function unit's alone.

// 2^x on the special function unit (ex2.approx.ftz: relative error about 2^-22, results below
// 2^-126 flushed to zero, exp2(-inf) = 0), without the instructions exp2f adds at every call to
// get subnormal results right: probabilities that small vanish in the row's sum anyway.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(WEFT_CUDA_EMULATION)
    float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}

// Whether this thread's rows g and g + 8 (keys [lo[r], hi[r])) see every key of [j0, j0 + keys).
__device__ __forceinline__ bool rows_see_all(int j0, int keys, const int lo[2], const int hi[2]) {
    return lo[0] <= j0 && j0 + keys <= hi[0] && lo[1] <= j0 && j0 + keys <= hi[1];
}

// Sets the scores of a tile (16 x 8·NT, keys from j0) that the thread's rows g and g + 8 do not
// see (outside [lo[0], hi[0]) and [lo[1], hi[1])) to -inf.
template <int NT>
__device__ __forceinline__ void mask_unseen(float (*s)[4], int j0, const int lo[2],
                                            const int hi[2]) {
    int first = j0 + 2 * (threadIdx.x & 3); // the key of column 0 of this thread's pairs
    int from[2] = {lo[0] - first, lo[1] - first}, to[2] = {hi[0] - first, hi[1] - first};
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = e >> 1, c = nt * 8 + (e & 1); // a constant: the compares take immediates
            s[nt][e] = c >= from[r] && c < to[r] ? s[nt][e] : -INFINITY;
        }
}

// The MT m-tiles' score tiles s[mt] masked (mask_unseen), unless every row of the warp sees all
// of the tile's keys: one decision for the warp.
template <int MT, int NT>
__device__ __forceinline__ void mask_scores(float (*s)[NT][4], int j0, const int (*lo)[2],
                                            const int (*hi)[2]) {
    bool inside = true;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) inside = inside && rows_see_all(j0, 8 * NT, lo[mt], hi[mt]);
    if (!__any_sync(0xffffffffu, !inside)) return;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) mask_unseen<NT>(s[mt], j0, lo[mt], hi[mt]);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ------------------------------------------------------------------------------- forward ----

// The online softmax of one masked score tile s (16 x 8·NT, raw scores: log2 units once times
// scale_log2) of one m-tile: updates the running max m (log2 units) and sum l of this thread's
// rows g and g + 8 (partial over its columns), turns s into probabilities and gives the factor
// corr by which the output so far must be rescaled. The max is taken over the raw scores and then
// scaled, which rounds to the max of the scaled ones (the scale is positive).
template <int NT>
__device__ __forceinline__ void softmax_probabilities(float (*s)[4], float m[2], float l[2],
                                                      float corr[2], float scale_log2) {
    float row_sum[2] = {0.0f, 0.0f}, shift[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            tile_max = fmaxf(tile_max, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
        float m_new = fmaxf(m[r], quad_max(tile_max) * scale_log2);
        corr[r] = m_new == -INFINITY ? 1.0f : fast_exp2(m[r] - m_new); // nothing seen yet: keep 0s
        m[r] = m_new;
        shift[r] = m_new == -INFINITY ? 0.0f : -m_new; // a row that saw nothing: exp2(-inf) = 0
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = e >> 1;
            float p = fast_exp2(fmaf(s[nt][e], scale_log2, shift[r]));
            s[nt][e] = p;
            row_sum[r] += p;
        }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * corr[r] + row_sum[r];
}

// o (16 x 8·NO, C fragments of rows g and g + 8) *= corr of its row.
template <int NO> __device__ __forceinline__ void rescale_rows(float (*o)[4], const float corr[2]) {
#pragma unroll
    for (int no = 0; no < NO; no++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[no][e] *= corr[e >> 1];
}

// Both at once, for an o that no MMA is writing.
template <int NT, int NO>
__device__ __forceinline__ void online_softmax(float (*s)[4], float m[2], float l[2],
                                               float (*o)[4], float scale_log2) {
    float corr[2];
    softmax_probabilities<NT>(s, m, l, corr, scale_log2);
    rescale_rows<NO>(o, corr);
}

// One key tile of the forward for a warp's MT m-tiles: scores, online softmax, o += P V.
template <int MT, int DK>
__device__ __forceinline__ void attend_tile(const uint32_t (*qf)[DK][4], const bf16 *Ks,
                                            const bf16 *Vs, int j0, const int (*lo)[2],
                                            const int (*hi)[2], float scale_log2,
                                            float (*o)[2 * DK][4], float (*m)[2], float (*l)[2]) {
    constexpr int D = 16 * DK, NT = BLOCK_KEYS / 8, NO = D / 8;
    float s[MT][NT][4];
    product_a_regs<MT, NT, DK>(s, qf, Ks, D + PAD);
    mask_scores<MT, NT>(s, j0, lo, hi);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        online_softmax<NT, NO>(s[mt], m[mt], l[mt], o[mt], scale_log2);
    }
    accumulate_c_times<MT, BLOCK_KEYS / 16, NO>(o, s, Vs, D + PAD);
}

// What the forward and dQ kernels share: the block's ROWS query rows of one head (16·MT
// per warp; this thread's rows in m-tile mt are g and g + 8 of it), the keys they see, and a walk
// over those keys' tiles, double-buffered: tile j + 1 is in flight while tile j is used.
template <int DK> struct query_block {
    static constexpr int MT = m_tiles(DK), D = 16 * DK, TILE = BLOCK_KEYS * (D + PAD);
    static constexpr int WARP_ROWS = 16 * MT, ROWS = WARPS * WARP_ROWS;
    weft_cuda_attention_args a; // a copy: kernel parameters are not addressable cheaply
    bf16 *tiles; // K and V of buffer 0, then of buffer 1: (BLOCK_KEYS, D + PAD) each
    int g, t, h, kvh, first_row, lo[MT][2], hi[MT][2];
    key_span block, warp;

    __device__ query_block(const weft_cuda_attention_args &args, bool heads_fastest) : a(args) {
        tiles = dynamic_smem<bf16>();
        int *row_lo = reinterpret_cast<int *>(tiles + 4 * TILE), *row_hi = row_lo + ROWS;
        int w = threadIdx.x >> 5;
        g = (threadIdx.x & 31) >> 2;
        t = threadIdx.x & 3;
        tile_of_head th = block_tile(true, heads_fastest);
        h = th.head;
        kvh = h / (a.H / a.KV);
        int r0 = th.tile * ROWS;
        block_key_ranges<ROWS, WARP_ROWS>(a, r0, row_lo, row_hi, &block, &warp);
        first_row = r0 + WARP_ROWS * w;
        for (int mt = 0; mt < MT; mt++)
            for (int r = 0; r < 2; r++) {
                lo[mt][r] = row_lo[WARP_ROWS * w + 16 * mt + g + 8 * r];
                hi[mt][r] = row_hi[WARP_ROWS * w + 16 * mt + g + 8 * r];
            }
    }

    // A fragments of the warp's rows of a (Tq, H, D) tensor (this head); rows past Tq are 0.
    __device__ void load_rows(uint32_t (*frag)[DK][4], const bf16 *x) const {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kc = 0; kc < DK; kc++) {
                int row0 = first_row + 16 * mt;
                load_a(frag[mt][kc], x + ((size_t)row0 * a.H + h) * D, (size_t)a.H * D, kc * 16,
                       a.Tq - row0);
            }
    }

    // Calls work(j0, Ks, Vs) for every key tile [j0, j0 + BLOCK_KEYS) the warp's rows see.
    template <typename F> __device__ void for_each_key_tile(const bf16 *k, const bf16 *v, F work) {
        size_t ld = (size_t)a.KV * D;
        auto stage = [&](int buffer, int j0) {
            bf16 *Ks = tiles + 2 * buffer * TILE;
            stage_rows<D, BLOCK_KEYS>(Ks, k + (size_t)kvh * D, ld, j0, block.hi);
            stage_rows<D, BLOCK_KEYS>(Ks + TILE, v + (size_t)kvh * D, ld, j0, block.hi);
            cp_async_commit();
        };
        if (block.lo < block.hi) stage(0, block.lo);
        for (int j0 = block.lo, buffer = 0; j0 < block.hi; j0 += BLOCK_KEYS, buffer ^= 1) {
            if (j0 + BLOCK_KEYS < block.hi) {
                stage(buffer ^ 1, j0 + BLOCK_KEYS);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads(); // this buffer has landed, for every thread's copies
            const bf16 *Ks = tiles + 2 * buffer * TILE;
            if (j0 < warp.hi && j0 + BLOCK_KEYS > warp.lo) work(j0, Ks, Ks + TILE);
            __syncthreads(); // every warp is done with this buffer before it is refilled
        }
    }

    // Row r (0: g, 1: g + 8) of the warp's m-tile mt, or -1 past Tq.
    __device__ int row(int mt, int r) const {
        int i = first_row + 16 * mt + g + 8 * r;
        return i < a.Tq ? i : -1;
    }

    // Stores acc[mt] (16 x D, C fragments) times factor[mt][r] as bf16 rows of a (Tq, H, D) tensor.
    __device__ void store_rows(bf16 *x, const float (*acc)[D / 8][4],
                               const float (*factor)[2]) const {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                if (row(mt, r) < 0) continue;
                bf16 *dst = x + ((size_t)row(mt, r) * a.H + h) * D + 2 * t;
                float f = factor[mt][r];
#pragma unroll
                for (int no = 0; no < D / 8; no++)
                    store_vector(dst + no * 8,
                                 pack_bf16(acc[mt][no][2 * r] * f, acc[mt][no][2 * r + 1] * f));
            }
    }
};

template <int DK>
__global__ void __launch_bounds__(THREADS)
    forward_kernel(weft_cuda_attention_args a, const bf16 *q, const bf16 *k, const bf16 *v,
                   bf16 *out, float *lse, float scale_log2) {
    wait_for_earlier_kernels();
    constexpr int MT = m_tiles(DK);
    query_block<DK> b(a, true);
    uint32_t qf[MT][DK][4];
    b.load_rows(qf, q);
    float o[MT][2 * DK][4] = {}, m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
    b.for_each_key_tile(k, v, [&](int j0, const bf16 *Ks, const bf16 *Vs) {
        attend_tile<MT, DK>(qf, Ks, Vs, j0, b.lo, b.hi, scale_log2, o, m, l);
    });
    float inv[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = quad_sum(l[mt][r]);
            inv[mt][r] = sum > 0.0f ? 1.0f / sum : 0.0f;
            if (b.t == 0 && b.row(mt, r) >= 0)
                lse[(size_t)b.h * a.Tq + b.row(mt, r)] = (m[mt][r] + log2f(sum)) * LN2;
        }
    b.store_rows(out, o, inv);
}

// ------------------------------------------------------------------------------------ dQ ----

// dS = P (dP - delta) with P = exp2(s scale_log2 - lse), in place of the masked raw scores s
// (16 x 8·NT) of a thread's rows g and g + 8, whose lse (log2 units) and delta are given.
template <int NT>
__device__ __forceinline__ void scores_to_ds(float (*s)[4], const float (*dp)[4],
                                             const float lse[2], const float delta[2],
                                             float scale_log2) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = e >> 1;
            float p = fast_exp2(fmaf(s[nt][e], scale_log2, -lse[r])); // masked: exp2(-inf) = 0
            s[nt][e] = p * (dp[nt][e] - delta[r]);
        }
}

// dS = P (dO V^T - delta) with P = exp(S - lse), then dQ = scale * dS K. Each key tile is taken
// in parts of PART_KEYS: S and dP of a part, not of the whole tile, are held in registers at once.
constexpr int PART_KEYS = 32;
template <int DK>
__global__ void __launch_bounds__(THREADS)
    dq_kernel(weft_cuda_attention_args a, const bf16 *q, const bf16 *k, const bf16 *v,
              const float *lse, const bf16 *dout, const float *delta, bf16 *dq, float scale,
              float scale_log2) {
    wait_for_earlier_kernels();
    constexpr int MT = m_tiles(DK), D = 16 * DK, NT = PART_KEYS / 8, NO = D / 8;
    query_block<DK> b(a, false);
    uint32_t qf[MT][DK][4], dof[MT][DK][4];
    b.load_rows(qf, q);
    b.load_rows(dof, dout);
    float row_lse[MT][2], row_delta[MT][2], factor[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = b.row(mt, r) >= 0 ? b.row(mt, r) : a.Tq - 1; // rows past Tq see no keys
            row_lse[mt][r] = lse[(size_t)b.h * a.Tq + row] * LOG2E;
            row_delta[mt][r] = delta[(size_t)b.h * a.Tq + row];
            factor[mt][r] = scale;
        }
    float acc[MT][NO][4] = {};
    b.for_each_key_tile(k, v, [&](int j0, const bf16 *Ks, const bf16 *Vs) {
#pragma unroll 1
        for (int part = 0; part < BLOCK_KEYS; part += PART_KEYS) {
            if (j0 + part >= b.warp.hi || j0 + part + PART_KEYS <= b.warp.lo) continue;
            const bf16 *Kp = Ks + part * (D + PAD), *Vp = Vs + part * (D + PAD);
            float s[MT][NT][4], dp[MT][NT][4];
            product_a_regs<MT, NT, DK>(s, qf, Kp, D + PAD);
            product_a_regs<MT, NT, DK>(dp, dof, Vp, D + PAD);
            mask_scores<MT, NT>(s, j0 + part, b.lo, b.hi);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                scores_to_ds<NT>(s[mt], dp[mt], row_lse[mt], row_delta[mt], scale_log2);
            accumulate_c_times<MT, PART_KEYS / 16, NO>(acc, s, Kp, D + PAD);
        }
    });
    b.store_rows(dq, acc, factor);
}

// ---------------------------------------------------------------------------------- dK dV ----

// One step's N query rows in a dK/dV kernel: the keys each sees, [lo, hi), and its lse (log2
// units) and delta; every row sees every key of [lo_max, hi_min) (empty where one row sees none).
template <int N> struct alignas(16) step_rows { // lse, delta read in pairs
    int lo[N], hi[N];
    float lse[N], delta[N];
    int lo_max, hi_min;
};

// Sets m.lo_max and m.hi_min from the lanes' rows (keys [lo[r], hi[r]), r < R), which together are
// the step's N rows (N = 32 R): by one warp, after which lane 0 writes them.
template <int N, int R>
__device__ __forceinline__ void step_common_keys(step_rows<N> &m, const int lo[R],
                                                 const int hi[R]) {
    int lo_max = lo[0], hi_min = hi[0];
#pragma unroll
    for (int r = 1; r < R; r++) lo_max = max(lo_max, lo[r]), hi_min = min(hi_min, hi[r]);
    lo_max = warp_max(lo_max);
    hi_min = -warp_max(-hi_min);
    if ((threadIdx.x & 31) == 0) m.lo_max = lo_max, m.hi_min = hi_min;
}

// For transposed tiles (keys as rows: this thread's keys key[0] and key[1] = key[0] + 8, at C rows
// g and g + 8; the step's 8·NT query rows m as columns): S^T (raw scores) becomes P^T = exp(S^T
// scale_log2 - lse), masked where MASKED, and dP^T becomes dS^T = P^T (dP^T - delta).
template <int NT, int N, bool MASKED>
__device__ __forceinline__ void transposed_ds_tile(float (*st)[4], float (*dpt)[4],
                                                   const int key[2], const step_rows<N> &m,
                                                   float scale_log2) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int i0 = nt * 8 + 2 * t; // this thread's columns i0 and i0 + 1: one 8-byte load each
        float2 lse = load_vector<float2>(&m.lse[i0]);
        float2 delta = load_vector<float2>(&m.delta[i0]);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = i0 + (e & 1), j = key[e >> 1];
            float x = fmaf(st[nt][e], scale_log2, -((e & 1) ? lse.y : lse.x));
            if (MASKED) x = j >= m.lo[i] && j < m.hi[i] ? x : -INFINITY;
            float p = fast_exp2(x);
            st[nt][e] = p;
            dpt[nt][e] = p * (dpt[nt][e] - ((e & 1) ? delta.y : delta.x));
        }
    }
}

// The above, with the mask skipped where every row of the step sees all of the warp's keys.
template <int NT, int N>
__device__ __forceinline__ void transposed_ds(float (*st)[4], float (*dpt)[4], const int key[2],
                                              const step_rows<N> &m, float scale_log2) {
    if (__any_sync(0xffffffffu, !(m.lo_max <= key[0] && key[1] < m.hi_min)))
        transposed_ds_tile<NT, N, true>(st, dpt, key, m, scale_log2);
    else
        transposed_ds_tile<NT, N, false>(st, dpt, key, m, scale_log2);
}

// Key j's rows of dK and dV from this thread's C fragments of them (half r: row g or g + 8):
// bf16 into dk, dv (Tkv, KV, D), or under grouped heads fp32 into query head h's partials
// dk_part, dv_part (Tkv, H, D), which group_sum_kernel adds up.
template <int NO>
__device__ __forceinline__ void store_key_row(const weft_cuda_attention_args &a, int j, int h,
                                              int r, const float (*dk_acc)[4],
                                              const float (*dv_acc)[4], float scale, bf16 *dk,
                                              bf16 *dv, float *dk_part, float *dv_part) {
    constexpr int D = 8 * NO;
    int t = threadIdx.x & 3, kvh = h / (a.H / a.KV);
#pragma unroll
    for (int no = 0; no < NO; no++) {
        float2 dk2 = {dk_acc[no][2 * r] * scale, dk_acc[no][2 * r + 1] * scale};
        float2 dv2 = {dv_acc[no][2 * r], dv_acc[no][2 * r + 1]};
        if (dk_part) {
            size_t at = ((size_t)j * a.H + h) * D + no * 8 + 2 * t;
            store_vector(dk_part + at, dk2);
            store_vector(dv_part + at, dv2);
        } else {
            size_t at = ((size_t)j * a.KV + kvh) * D + no * 8 + 2 * t;
            store_vector(dk + at, pack_bf16(dk2.x, dk2.y));
            store_vector(dv + at, pack_bf16(dv2.x, dv2.y));
        }
    }
}

// For one tile of keys of kv head `kvh`: transposed products, keys as the rows of A.
//   S^T = K Q^T, dP^T = V dO^T, P^T = exp(S^T - lse), dS^T = P^T (dP^T - delta)
//   dV += P^T dO, dK += scale * dS^T Q, for one query head (block_tile).
// Without grouping (H == KV) the results go to dk, dv (bf16); with it, to dk_part, dv_part
// (Tkv, H, D) fp32, which group_sum_kernel adds up.
template <int DK>
__global__ void __launch_bounds__(THREADS)
    dkdv_kernel(weft_cuda_attention_args a, const bf16 *q, const bf16 *k, const bf16 *v,
                const float *lse, const bf16 *dout, const float *delta, bf16 *dk, bf16 *dv,
                float *dk_part, float *dv_part, float scale, float scale_log2) {
    wait_for_earlier_kernels();
    constexpr int MT = m_tiles(DK), KEYS = block_rows(DK), D = 16 * DK;
    constexpr int NT = STEP_ROWS / 8, NO = D / 8, LD = D + PAD, ROWS_TILE = STEP_ROWS * LD;
    bf16 *Ks = dynamic_smem<bf16>(); // (KEYS, LD)
    bf16 *Vs = Ks + KEYS * LD;       // (KEYS, LD)
    bf16 *rows = Vs + KEYS * LD; // Q, dO of buffer 0, then of buffer 1: (STEP_ROWS, LD) each
    auto *meta = reinterpret_cast<step_rows<STEP_ROWS> *>(rows + 4 * ROWS_TILE); // [2]
    int *seen = reinterpret_cast<int *>(meta + 2);                                // [2][WARPS]

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    tile_of_head th = block_tile(false, false);
    int h = th.head, kvh = h / (a.H / a.KV), j0 = th.tile * KEYS;
    int j_end = min(j0 + KEYS, a.Tkv);
    size_t q_ld = (size_t)a.H * D, kv_ld = (size_t)a.KV * D;
    stage_rows<D, KEYS>(Ks, k + (size_t)kvh * D, kv_ld, j0, j_end);
    stage_rows<D, KEYS>(Vs, v + (size_t)kvh * D, kv_ld, j0, j_end);
    cp_async_commit(); // waited for with the first rows' copies
    // The warp's keys [kw0, kw1) and the thread's two keys of each m-tile (C rows g and g+8).
    int kw0 = j0 + warp * 16 * MT, kw1 = min(kw0 + 16 * MT, j_end), key[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) key[mt][0] = kw0 + 16 * mt + g, key[mt][1] = key[mt][0] + 8;
    // Query rows that may see these keys: those of the documents the keys belong to.
    int first_doc = find_doc(a.cu_kv, a.n_docs, j0);
    int last_doc = find_doc(a.cu_kv, a.n_docs, j_end - 1);
    int rows_lo = a.cu_q[first_doc], rows_hi = a.cu_q[last_doc + 1];
    const bf16 *Kw = Ks + warp * 16 * MT * LD, *Vw = Vs + warp * 16 * MT * LD;

    // The next step from i0 on whose rows see some key of the tile, its rows' ranges, lse and
    // delta in meta[buffer], and its Q and dO tiles in flight; rows_hi when none is left. Rows
    // causally before every key of the tile are skipped four steps per barrier (warp w checks
    // step i0 + 32 w; the flags alternate between two sets, so one barrier per pass suffices),
    // without loading them.
    static_assert(STEP_ROWS == 32, "a warp checks one step");
    int pass = 0;
    auto next_step = [&](int i0, int buffer) {
        for (; i0 < rows_hi; i0 += THREADS, pass++) {
            int i = i0 + threadIdx.x, lo = 0, hi = 0;
            if (i < rows_hi) row_key_range(a, i, &lo, &hi);
            int *flags = seen + (pass & 1) * WARPS;
            bool sees = __any_sync(0xffffffffu, lo < j_end && hi > j0);
            if (lane == 0) flags[warp] = sees;
            __syncthreads();
            int first = WARPS;
            for (int w = WARPS - 1; w >= 0; w--)
                if (flags[w]) first = w;
            if (first == WARPS) continue;
            i0 += STEP_ROWS * first;
            if (warp == first) { // its lanes hold the step's rows
                step_rows<STEP_ROWS> &m = meta[buffer];
                m.lo[lane] = lo;
                m.hi[lane] = hi;
                m.lse[lane] = i < rows_hi ? lse[(size_t)h * a.Tq + i] * LOG2E : 0.0f;
                m.delta[lane] = i < rows_hi ? delta[(size_t)h * a.Tq + i] : 0.0f;
                step_common_keys<STEP_ROWS, 1>(m, &lo, &hi);
            }
            pass++;
            bf16 *Qs = rows + 2 * buffer * ROWS_TILE;
            stage_rows<D, STEP_ROWS>(Qs, q + (size_t)h * D, q_ld, i0, rows_hi);
            stage_rows<D, STEP_ROWS>(Qs + ROWS_TILE, dout + (size_t)h * D, q_ld, i0, rows_hi);
            cp_async_commit();
            return i0;
        }
        return rows_hi;
    };

    float dk_acc[MT][NO][4] = {}, dv_acc[MT][NO][4] = {};
    int buffer = 0;
    for (int i0 = next_step(rows_lo, 0); i0 < rows_hi; buffer ^= 1) {
        int next = next_step(i0 + STEP_ROWS, buffer ^ 1); // in flight while this step computes
        if (next < rows_hi) cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads(); // this step's rows have landed, for every thread's copies
        const step_rows<STEP_ROWS> &m = meta[buffer];
        const bf16 *Qs = rows + 2 * buffer * ROWS_TILE, *dOs = Qs + ROWS_TILE;
        bool warp_sees = lane < STEP_ROWS && m.lo[lane] < kw1 && m.hi[lane] > kw0;
        if (__any_sync(0xffffffffu, warp_sees)) {
            float st[MT][NT][4], dpt[MT][NT][4];
            product_a_smem<MT, NT, DK>(st, Kw, Qs, LD);
            product_a_smem<MT, NT, DK>(dpt, Vw, dOs, LD);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                transposed_ds<NT>(st[mt], dpt[mt], key[mt], m, scale_log2);
            accumulate_c_times<MT, STEP_ROWS / 16, NO>(dv_acc, st, dOs, LD);
            accumulate_c_times<MT, STEP_ROWS / 16, NO>(dk_acc, dpt, Qs, LD);
        }
        __syncthreads(); // every warp is done with this buffer before it is refilled
        i0 = next;
    }
    cp_async_wait<0>(); // the K, V copies, when no step needed them

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (key[mt][r] < j_end)
                store_key_row<NO>(a, key[mt][r], h, r, dk_acc[mt], dv_acc[mt], scale, dk, dv,
                                  dk_part, dv_part);
}

// out (Tkv, KV, D) bf16 = the sum over each kv head's group of part (Tkv, H, D) fp32, in a fixed
// order.
__global__ void group_sum_kernel(const float *part, bf16 *out, int Tkv, int H, int KV, int D) {
    wait_for_earlier_kernels();
    int group = H / KV;
    size_t N = (size_t)Tkv * KV * D;
    for (size_t i = global_index(); i < N; i += global_stride()) {
        size_t key = i / ((size_t)KV * D);
        int rem = (int)(i - key * KV * D), g = rem / D, d = rem - g * D;
        const float *src = part + (key * H + (size_t)g * group) * D + d;
        float acc = 0.0f;
        for (int hh = 0; hh < group; hh++) acc += src[(size_t)hh * D];
        out[i] = to_bf16(acc);
    }
}

// Under grouped heads, dk and dv from the per-query-head partials a dK/dV kernel wrote
// (weft_cuda_attention_partials_bytes of them: dK's, then dV's).
void sum_groups(weft_cuda_stream s, const weft_cuda_attention_args *a, const float *partials,
                void *dk, void *dv) {
    size_t N = (size_t)a->Tkv * a->KV * a->D;
    const float *dk_part = partials, *dv_part = partials + (size_t)a->Tkv * a->H * a->D;
    WEFT_LAUNCH(group_sum_kernel, grid_for(N), 256, 0, s, dk_part, (bf16 *)dk, a->Tkv, a->H, a->KV,
                a->D);
    WEFT_LAUNCH(group_sum_kernel, grid_for(N), 256, 0, s, dv_part, (bf16 *)dv, a->Tkv, a->H, a->KV,
                a->D);
}

// Dynamic shared memory of each kernel, in bytes, for head_dim D.
size_t query_block_smem(int D) { // two buffers of K and V tiles; key ranges
    return sizeof(bf16) * 4 * BLOCK_KEYS * (D + PAD) + 2 * block_rows(D / 16) * sizeof(int);
}
size_t dkdv_smem(int D) { // K, V tiles; two buffers of Q, dO rows and of their step_rows; flags
    return sizeof(bf16) * (2 * block_rows(D / 16) + 4 * STEP_ROWS) * (D + PAD) +
           2 * sizeof(step_rows<STEP_ROWS>) + 2 * WARPS * sizeof(int);
}

} // namespace
