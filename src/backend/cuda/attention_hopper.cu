// Varlen causal attention forward for Hopper (sm_90a), in FlashAttention-3's design: one
// producer thread streams K and V tiles with TMA into a ring of shared-memory stages guarded by
// mbarriers ("full": the tile landed; "empty": every consumer is done with it), while consumer
// warpgroups of 64 query rows each multiply on the tensor cores with warpgroup MMA (wgmma): the
// scores S = Q K^T from shared memory, the online softmax in registers, then O += P V with P
// straight from the score registers. The QK^T of tile j + 1 is issued before the softmax of
// tile j, so the tensor cores work while the softmax runs; the two consumer warpgroups overlap
// each other the same way. Same contract and masking rule as the mma.sync kernels
// (attention_mma.cuh), whose helpers for masking and the online softmax it shares: query row i
// of document d sees keys cu_kv[d] + [0, q_pos[i]]. head_dim 64 or 128; the backward stays on
// the mma.sync kernels, which read the same lse.
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/hopper.cuh"

#if !defined(WEFT_CUDA_EMULATION)
#include <cudaTypedefs.h> // PFN_cuTensorMapEncodeTiled
#endif

namespace {
namespace fa3 {

constexpr int CONSUMERS = 2;                       // warpgroups of 64 query rows
constexpr int THREADS = 128 * (1 + CONSUMERS);     // warpgroup 0 produces
constexpr int ROWS = 64 * CONSUMERS;               // query rows per block
constexpr int KEYS = 128;                          // keys per tile
constexpr int STAGES = 2;                          // K/V tiles in flight
// Registers per thread after the hand-over: 128 x 24 + 256 x 240 fit the 64K of an SM.
constexpr int PRODUCER_REGISTERS = 24, CONSUMER_REGISTERS = 240;
constexpr uint32_t SBO = 8 * hopper::ATOM_ROW_BYTES; // between 8-row groups of an atom

// Shared memory, from a 1024-byte aligned start: Q (ROWS x D) and STAGES tiles of K and of V
// (KEYS x D), each as D / 64 swizzled atoms; the barriers; the key range of every query row.
template <int D> struct smem_layout {
    static constexpr int ATOMS = D / hopper::ATOM_COLS;
    static constexpr size_t Q_ATOM = (size_t)ROWS * hopper::ATOM_ROW_BYTES;
    static constexpr size_t KV_ATOM = (size_t)KEYS * hopper::ATOM_ROW_BYTES;
    static constexpr size_t Q = 0, K = Q + ATOMS * Q_ATOM, V = K + STAGES * ATOMS * KV_ATOM;
    static constexpr size_t BARRIERS = V + STAGES * ATOMS * KV_ATOM; // q, full[], empty[]
    static constexpr size_t RANGES = BARRIERS + sizeof(uint64_t) * (1 + 2 * STAGES);
    static constexpr size_t BYTES = RANGES + 2 * ROWS * sizeof(int) + 1024; // + alignment
    __host__ __device__ static constexpr size_t k_tile(int stage) {
        return K + (size_t)stage * ATOMS * KV_ATOM;
    }
    __host__ __device__ static constexpr size_t v_tile(int stage) {
        return V + (size_t)stage * ATOMS * KV_ATOM;
    }
};

struct barriers {
    uint64_t *q, *full, *empty;
};

// The union of the key ranges of rows [first, first + n).
__device__ key_span span_of(const int *row_lo, const int *row_hi, int first, int n) {
    key_span s = {INT_MAX, 0};
    for (int r = first; r < first + n; r++)
        if (row_lo[r] < row_hi[r]) s = {min(s.lo, row_lo[r]), max(s.hi, row_hi[r])};
    return s;
}

// The producer: Q once, then the key tiles [key_lo + j·KEYS, + KEYS) into stage j % STAGES as
// soon as the consumers have released it.
template <int D>
__device__ void produce(const weft_tensor_map *q_map, const weft_tensor_map *k_map,
                        const weft_tensor_map *v_map, unsigned char *smem, barriers bar, int r0,
                        int h, int kvh, int key_lo, int tiles) {
    using L = smem_layout<D>;
    hopper::mbar_arrive_expect_tx(bar.q, ROWS * D * sizeof(bf16));
    for (int c = 0; c < L::ATOMS; c++)
        hopper::tma_load_2d(smem + L::Q + c * L::Q_ATOM, q_map, h * D + 64 * c, r0, bar.q);
    for (int j = 0; j < tiles; j++) {
        int s = j % STAGES, phase = (j / STAGES) & 1;
        hopper::mbar_wait(&bar.empty[s], phase ^ 1); // the first pass finds every stage free
        hopper::mbar_arrive_expect_tx(&bar.full[s], 2 * KEYS * D * sizeof(bf16));
        for (int c = 0; c < L::ATOMS; c++) {
            int x = kvh * D + 64 * c, y = key_lo + j * KEYS;
            hopper::tma_load_2d(smem + L::k_tile(s) + c * L::KV_ATOM, k_map, x, y, &bar.full[s]);
            hopper::tma_load_2d(smem + L::v_tile(s) + c * L::KV_ATOM, v_map, x, y, &bar.full[s]);
        }
    }
}

// Issues s (64 x KEYS) = Q (the warpgroup's 64 rows) K^T of one stage, as one wgmma group.
template <int D>
__device__ __forceinline__ void issue_scores(float (*s)[4], const unsigned char *q_rows,
                                             const unsigned char *k_tile) {
    using L = smem_layout<D>;
    hopper::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) { // 16 columns of head_dim: 32 bytes of a 128-byte row
        size_t offset = (ks % 4) * 32;
        uint64_t a = hopper::smem_descriptor(q_rows + (ks / 4) * L::Q_ATOM + offset, 16, SBO);
        uint64_t b = hopper::smem_descriptor(k_tile + (ks / 4) * L::KV_ATOM + offset, 16, SBO);
        hopper::wgmma_ss<KEYS>(s, a, b, ks > 0);
    }
    hopper::wgmma_commit();
}

// Issues o (64 x D) += P V, P the probabilities in s's registers, V one stage's tile, as one
// wgmma group.
template <int D>
__device__ __forceinline__ void issue_pv(float (*o)[4], const float (*s)[4],
                                         const unsigned char *v_tile) {
    using L = smem_layout<D>;
    hopper::wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < KEYS / 16; kc++) { // keys kc·16 .. + 15: two 8-row groups
        uint32_t p[4];
        c_to_a(p, s, kc);
        uint64_t b = hopper::smem_descriptor(v_tile + kc * 16 * hopper::ATOM_ROW_BYTES,
                                             (uint32_t)L::KV_ATOM, SBO);
        hopper::wgmma_rs<D>(o, p, b, 1);
    }
    hopper::wgmma_commit();
}

// This thread's share of the output: rows g and g + 8 of its warp's 16, from the running max m,
// sum l (partial over the quad) and o.
template <int D>
__device__ void store_output(const weft_cuda_attention_args &a, int row0, int h, const float m[2],
                             const float l[2], const float (*o)[4], bf16 *out, float *lse) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = quad_sum(l[r]), inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        int row = row0 + 8 * r;
        if (row >= a.Tq) continue;
        if (t == 0) lse[(size_t)h * a.Tq + row] = (m[r] + log2f(sum)) * LN2;
        bf16 *dst = out + ((size_t)row * a.H + h) * D + 2 * t;
#pragma unroll
        for (int no = 0; no < D / 8; no++)
            *reinterpret_cast<uint32_t *>(dst + no * 8) =
                pack_bf16(o[no][2 * r] * inv, o[no][2 * r + 1] * inv);
    }
}

// A consumer warpgroup: its 64 query rows against every key tile the block walks (all of them,
// masked: skipping the tiles only the other warpgroup's rows see would put the wgmma under a
// branch, which ptxas answers by serializing them). The scores of tile j live in one of two
// register arrays while tile j + 1's are in flight in the other; the caller alternates them by
// name, never by a runtime index, which would put them in local memory, out of reach of the
// asynchronous MMA.
template <int D> struct consumer {
    using L = smem_layout<D>;
    static constexpr int NT = KEYS / 8, NO = D / 8;
    const unsigned char *smem, *q_rows;
    barriers bar;
    int key_lo, tiles, lo[2], hi[2]; // lo, hi: the keys this thread's two rows see
    float scale_log2, o[NO][4], m[2], l[2];

    // Waits for tile j and issues its scores into s.
    __device__ __forceinline__ void start_scores(int j, float (*s)[4]) {
        hopper::mbar_wait(&bar.full[j % STAGES], (j / STAGES) & 1);
        issue_scores<D>(s, q_rows, smem + L::k_tile(j % STAGES));
    }

    // Tile j, whose scores were issued into cur; issues tile j + 1's into next first.
    __device__ __forceinline__ void step(int j, float (*cur)[4], float (*next)[4]) {
        bool overlap = j + 1 < tiles;
        if (overlap) start_scores(j + 1, next);
        if (overlap) hopper::wgmma_wait<1>(); // cur is done; next keeps running
        else hopper::wgmma_wait<0>();
        hopper::fence_registers<KEYS>(cur);
        mask_scores<NT>(cur, key_lo + j * KEYS, lo, hi, scale_log2);
        online_softmax<NT, NO>(cur, m, l, o);
        issue_pv<D>(o, cur, smem + L::v_tile(j % STAGES));
        hopper::wgmma_wait<0>(); // before the stage is released and o rescaled again
        hopper::fence_registers<D>(o);
        if ((threadIdx.x & 127) == 0) hopper::mbar_arrive(&bar.empty[j % STAGES]);
    }
};

template <int D>
__device__ void consume(const weft_cuda_attention_args &a, const unsigned char *smem,
                        barriers bar, const int *row_lo, const int *row_hi, int r0, int h,
                        int key_lo, int tiles, bf16 *out, float *lse, float scale_log2) {
    int first = 64 * (threadIdx.x / 128 - 1), w = (threadIdx.x >> 5) & 3;
    int mine = first + 16 * w + ((threadIdx.x & 31) >> 2); // this thread's rows: mine, mine + 8
    consumer<D> c = {smem, smem + smem_layout<D>::Q + (size_t)first * hopper::ATOM_ROW_BYTES,
                     bar, key_lo, tiles, {row_lo[mine], row_lo[mine + 8]},
                     {row_hi[mine], row_hi[mine + 8]},
                     scale_log2, {}, {-INFINITY, -INFINITY}, {0.0f, 0.0f}};
    float s0[KEYS / 8][4], s1[KEYS / 8][4];
    hopper::mbar_wait(bar.q, 0);
    if (tiles > 0) c.start_scores(0, s0);
    for (int j = 0; j < tiles; j += 2) {
        c.step(j, s0, s1);
        if (j + 1 < tiles) c.step(j + 1, s1, s0);
    }
    store_output<D>(a, r0 + mine, h, c.m, c.l, c.o, out, lse);
}

template <int D>
__global__ void __launch_bounds__(THREADS, 1)
    forward_kernel(const __grid_constant__ weft_tensor_map q_map,
                   const __grid_constant__ weft_tensor_map k_map,
                   const __grid_constant__ weft_tensor_map v_map, weft_cuda_attention_args a,
                   bf16 *out, float *lse, float scale_log2) {
    using L = smem_layout<D>;
    unsigned char *smem = hopper::align_1024(dynamic_smem<unsigned char>());
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + L::BARRIERS);
    barriers bar = {bars, bars + 1, bars + 1 + STAGES};
    int *row_lo = reinterpret_cast<int *>(smem + L::RANGES), *row_hi = row_lo + ROWS;
    int r0 = blockIdx.x * ROWS, h = blockIdx.y, kvh = h / (a.H / a.KV);
    if (threadIdx.x == 0) {
        hopper::mbar_init(bar.q, 1);
        for (int s = 0; s < STAGES; s++) {
            hopper::mbar_init(&bar.full[s], 1);
            hopper::mbar_init(&bar.empty[s], CONSUMERS);
        }
        hopper::mbar_init_fence();
    }
    if (threadIdx.x < ROWS)
        row_key_range(a, r0 + threadIdx.x, &row_lo[threadIdx.x], &row_hi[threadIdx.x]);
    __syncthreads();
    key_span block = span_of(row_lo, row_hi, 0, ROWS);
    int tiles = block.lo < block.hi ? (block.hi - block.lo + KEYS - 1) / KEYS : 0;
    // Broadcast from lane 0, so the compiler knows these are the same across the warp: wgmma
    // under branches it cannot prove uniform get serialized.
    int warpgroup = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
    tiles = __shfl_sync(0xffffffffu, tiles, 0);
    block.lo = __shfl_sync(0xffffffffu, block.lo, 0);
    if (warpgroup == 0) { // the producer warpgroup: one thread issues every copy
        hopper::registers_decrease_to<PRODUCER_REGISTERS>();
        if (threadIdx.x == 0)
            produce<D>(&q_map, &k_map, &v_map, smem, bar, r0, h, kvh, block.lo, tiles);
        return;
    }
    hopper::registers_increase_to<CONSUMER_REGISTERS>();
    consume<D>(a, smem, bar, row_lo, row_hi, r0, h, block.lo, tiles, out, lse, scale_log2);
}

// A 2-D bf16 tensor of `rows` rows of `cols` elements (contiguous) for TMA, read in boxes of 64
// columns (128 bytes, 128-byte swizzle) by box_rows; false where the driver refuses it.
bool tensor_map_2d(weft_tensor_map *map, const void *base, int cols, int rows, int box_rows) {
#if defined(WEFT_CUDA_EMULATION)
    *map = weft_emulated_tensor_map_2d(base, cols, rows, (uint64_t)cols * 2, 64, box_rows, true);
    return true;
#else
    static PFN_cuTensorMapEncodeTiled_v12000 encode; // the driver's, looked up once
    if (!encode) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            return false;
        encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols * 2};
    cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, element_strides[2] = {1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims, strides,
                  box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
#endif
}

} // namespace fa3
} // namespace

extern "C" bool weft_cuda_attention_hopper_covers(const weft_cuda_attention_args *a) {
    return (a->D == 64 || a->D == 128) && a->Tq > 0 && a->Tkv > 0;
}

extern "C" bool weft_cuda_attention_forward_hopper(weft_cuda_stream s,
                                                   const weft_cuda_attention_args *a,
                                                   const void *q, const void *k, const void *v,
                                                   void *out, float *lse) {
    weft_tensor_map q_map, k_map, v_map;
    if (!fa3::tensor_map_2d(&q_map, q, a->H * a->D, a->Tq, fa3::ROWS) ||
        !fa3::tensor_map_2d(&k_map, k, a->KV * a->D, a->Tkv, fa3::KEYS) ||
        !fa3::tensor_map_2d(&v_map, v, a->KV * a->D, a->Tkv, fa3::KEYS))
        return false;
    dim3 grid((a->Tq + fa3::ROWS - 1) / fa3::ROWS, a->H);
    float scale_log2 = LOG2E / sqrtf((float)a->D);
#define LAUNCH(D)                                                                                  \
    WEFT_LAUNCH(fa3::forward_kernel<D>, grid, fa3::THREADS, fa3::smem_layout<D>::BYTES, s, q_map,  \
                k_map, v_map, *a, (bf16 *)out, lse, scale_log2)
    if (a->D == 64) LAUNCH(64);
    else LAUNCH(128);
#undef LAUNCH
    return true;
}
