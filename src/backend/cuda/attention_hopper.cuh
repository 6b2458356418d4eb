// What the Hopper (sm_90a) attention kernels share: the forward (attention_hopper.cu) and the
// backward (attention_hopper_backward.cu). Both are in FlashAttention-3's design: warpgroup 0
// produces, streaming tiles with TMA into shared memory guarded by mbarriers ("full": the tile
// landed; "empty": every consumer is done with it); the consumer warpgroups multiply with
// warpgroup MMA (wgmma). Every tile in shared memory is a run of 128-byte-swizzled atoms of 64
// columns (hopper.cuh), which is what TMA writes and wgmma reads.
#pragma once
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/hopper.cuh"

#if !defined(WEFT_CUDA_EMULATION)
#include <cudaTypedefs.h> // PFN_cuTensorMapEncodeTiled
#endif

namespace {
namespace fa3 {

constexpr int CONSUMERS = 2;                   // warpgroups of 64 rows
constexpr int ROWS = 64 * CONSUMERS;           // query rows per block of the forward and dQ
constexpr int THREADS = 128 * (1 + CONSUMERS); // warpgroup 0 produces
// The head_dim-64 forward may take three consumers (192 rows) instead, as FlashAttention-3 tiles
// it: each key tile loaded serves half as many rows again, and each SM sub-partition holds three
// consumer warps to hide one's softmax behind another's products.
__host__ __device__ constexpr int block_rows(int consumers) { return 64 * consumers; }
__host__ __device__ constexpr int block_threads(int consumers) { return 128 * (1 + consumers); }
// The consumers of a forward or dQ block: three at head_dim 64 where rows_at_64 asks for 192 rows.
inline int query_block_consumers(int D, int rows_at_64) {
    return D == 64 && rows_at_64 == block_rows(3) ? 3 : CONSUMERS;
}
// Tiles in flight. A pipelined consumer holds two stages at once (the previous tile's for its
// accumulation, the current one's for its products), so a third lets the producer load ahead.
constexpr int STAGES = 3;
constexpr size_t MAX_SMEM = 227 * 1024; // dynamic shared memory of a block on sm_90
// Registers per thread after the hand-over: 128 x 24 + 256 x 240 fit the 64K of an SM, and with
// three consumers 128 x 24 + 384 x 160 (FlashAttention-3's 160).
constexpr int PRODUCER_REGISTERS = 24;
__host__ __device__ constexpr int consumer_registers(int consumers) {
    return consumers == 2 ? 240 : 160;
}
static_assert(128 * PRODUCER_REGISTERS + 256 * consumer_registers(2) <= 65536 &&
                  128 * PRODUCER_REGISTERS + 384 * consumer_registers(3) <= 65536,
              "the warpgroups' registers exceed an SM's");
constexpr uint32_t SBO = 8 * hopper::ATOM_ROW_BYTES; // between 8-row groups of an atom

// Bytes of one atom (64 columns) of a tile of `rows` rows, and of a whole tile D wide.
__host__ __device__ constexpr size_t atom_bytes(int rows) {
    return (size_t)rows * hopper::ATOM_ROW_BYTES;
}
__host__ __device__ constexpr size_t tile_bytes(int rows, int D) {
    return atom_bytes(rows) * (D / hopper::ATOM_COLS);
}

struct barriers {
    uint64_t *once, *full, *empty; // once: what is loaded a single time; full, empty: [STAGES]
};

// Initializes the barriers (thread 0): `once` and full[] complete on one arrival plus their
// bytes, or on full_arrivals; empty[] on empty_arrivals.
__device__ __forceinline__ void init_barriers(barriers bar, int full_arrivals, int empty_arrivals) {
    hopper::mbar_init(bar.once, 1);
    for (int s = 0; s < STAGES; s++) {
        hopper::mbar_init(&bar.full[s], full_arrivals);
        hopper::mbar_init(&bar.empty[s], empty_arrivals);
    }
    hopper::mbar_init_fence();
}

// The ROWS x D box at row y, columns x .. x + D, of a 2-D map, as D / 64 atoms from dst.
template <int ROWS, int D>
__device__ __forceinline__ void load_tile(unsigned char *dst, const weft_tensor_map *map, int x,
                                          int y, uint64_t *bar) {
#pragma unroll
    for (int c = 0; c < D / hopper::ATOM_COLS; c++)
        hopper::tma_load_2d(dst + c * atom_bytes(ROWS), map, x + hopper::ATOM_COLS * c, y, bar);
}

// The union of the key ranges of rows [0, n).
__device__ __forceinline__ key_span span_of(const int *row_lo, const int *row_hi, int n) {
    key_span s = {INT_MAX, 0};
    for (int r = 0; r < n; r++)
        if (row_lo[r] < row_hi[r]) s = {min(s.lo, row_lo[r]), max(s.hi, row_hi[r])};
    return s;
}

// Issues acc (64 x N) (+)= A B^T, uncommitted: A the 64 rows at `a` of a tile whose atoms are
// a_atom bytes apart, B the N rows at `b` of one whose atoms are b_atom apart, both D wide and
// read K-major: Q K^T, dO V^T, and the transposed K Q^T, V dO^T.
template <int D, int N>
__device__ __forceinline__ void issue_a_bt(float (*acc)[4], const unsigned char *a, size_t a_atom,
                                           const unsigned char *b, size_t b_atom) {
    hopper::wgmma_fence();
    uint64_t a0 = hopper::smem_descriptor(a, 16, SBO), b0 = hopper::smem_descriptor(b, 16, SBO);
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) { // 16 columns of head_dim: 32 bytes of a 128-byte row
        uint32_t offset = (ks % 4) * 32;
        uint64_t da = hopper::descriptor_plus(a0, (uint32_t)((ks / 4) * a_atom) + offset);
        uint64_t db = hopper::descriptor_plus(b0, (uint32_t)((ks / 4) * b_atom) + offset);
        hopper::wgmma_ss<N>(acc, da, db, ks > 0);
    }
}

// Issues acc (64 x N) += A B, uncommitted: A (64 x K) the warpgroup's bf16 A fragments a (K / 16
// of them, the mma.sync layout), B the K rows at `b` of a tile N wide, read MN-major, atoms
// b_atom bytes apart: P V, dS K, P^T dO, dS^T Q.
template <int K, int N>
__device__ __forceinline__ void issue_a_b(float (*acc)[4], const uint32_t (*a)[4],
                                          const unsigned char *b, size_t b_atom) {
    hopper::wgmma_fence();
    uint64_t b0 = hopper::smem_descriptor(b, (uint32_t)b_atom, SBO);
#pragma unroll
    for (int kc = 0; kc < K / 16; kc++) { // rows kc·16 .. + 15 of B: two 8-row groups
        uint64_t db = hopper::descriptor_plus(b0, kc * 16 * hopper::ATOM_ROW_BYTES);
        hopper::wgmma_rs<N>(acc, a[kc], db, 1);
    }
}

// FlashAttention-3's software pipeline over a consumer's tiles 0, 1, .. while c.more(j): tile j's
// first products (c.first, into a fresh C::tile of registers) are issued, then the previous
// tile's accumulation (c.second, from the bf16 fragments c.take kept), and tile j's elementwise
// step (c.elementwise) runs while that accumulation is on the tensor cores. The tile registers
// are fresh each tile: writing into registers that a later wgmma reuses as its accumulators
// makes ptxas serialize every wgmma of the kernel. c.more must be uniform over the warpgroup.
// Where the registers do not allow two tiles' worth (C::OVERLAP false), each tile runs alone.
template <typename C> __device__ __forceinline__ void run_serial(C &c) {
    for (int j = 0; c.more(j); j++) {
        typename C::tile t;
        c.first(j, t);
        hopper::wgmma_wait<0>();
        c.elementwise(j, t);
        c.take(t);
        c.second(j);
        hopper::wgmma_wait<0>();
        c.release(j);
    }
}

template <typename C> __device__ __forceinline__ void run_pipeline(C &c) {
    if constexpr (!C::OVERLAP) {
        run_serial(c);
        return;
    }
    if (!c.more(0)) return;
    {
        typename C::tile t;
        c.first(0, t);
        hopper::wgmma_wait<0>();
        c.elementwise(0, t);
        c.take(t);
    }
    int j = 1;
    for (; c.more(j); j++) {
        typename C::tile t;
        c.first(j, t);
        c.second(j - 1);
        hopper::wgmma_wait<1>(); // tile j's products; the accumulation keeps running
        c.elementwise(j, t);
        hopper::wgmma_wait<0>();
        c.release(j - 1);
        c.take(t);
    }
    c.second(j - 1);
    hopper::wgmma_wait<0>();
    c.release(j - 1);
}

// Stores this thread's share of acc (64 x D; C rows g and g + 8 of its warp, query rows row0 and
// row0 + 8) times factor[r] as bf16 rows of head h of a (Tq, H, D) tensor.
template <int D>
__device__ __forceinline__ void store_query_rows(const weft_cuda_attention_args &a, int row0,
                                                 int h, const float (*acc)[4],
                                                 const float factor[2], bf16 *x) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        if (row >= a.Tq) continue;
        bf16 *dst = x + ((size_t)row * a.H + h) * D + 2 * t;
#pragma unroll
        for (int no = 0; no < D / 8; no++)
            store_vector(dst + no * 8,
                         pack_bf16(acc[no][2 * r] * factor[r], acc[no][2 * r + 1] * factor[r]));
    }
}

// The index of a consumer warpgroup as a type (as_consumer).
template <int WG> struct consumer_index {
    static constexpr int value = WG;
};

// Calls f(consumer_index<c>{}) for consumer c = warpgroup - 1 (warpgroup from take_role, one of
// CONSUMERS_), so that the consumer's code knows its index as a constant: the shared-memory
// addresses of its rows, and so its wgmma descriptors, are then the same across the warpgroup to
// the compiler, which keeps them in uniform registers instead of moving them there before every
// wgmma (the dQ kernel at head_dim 128: 297 instructions a tile instead of 363).
template <int CONSUMERS_ = CONSUMERS, typename F>
__device__ __forceinline__ void as_consumer(int warpgroup, F &&f) {
    static_assert(CONSUMERS_ == 2 || CONSUMERS_ == 3, "two or three consumer warpgroups");
    if constexpr (CONSUMERS_ == 2) {
        if (warpgroup == 1) f(consumer_index<0>{});
        else f(consumer_index<1>{});
    } else {
        if (warpgroup == 1) f(consumer_index<0>{});
        else if (warpgroup == 2) f(consumer_index<1>{});
        else f(consumer_index<2>{});
    }
}

// Who runs what: warpgroup 0 (hands its registers over, then produces) or a consumer (takes
// them). Broadcast from lane 0, so the compiler knows it is the same across the warp: wgmma under
// branches it cannot prove uniform get serialized.
template <int CONSUMERS_ = CONSUMERS> __device__ __forceinline__ int take_role() {
    int warpgroup = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
    if (warpgroup == 0) hopper::registers_decrease_to<PRODUCER_REGISTERS>();
    else hopper::registers_increase_to<consumer_registers(CONSUMERS_)>();
    return warpgroup;
}

// Shared memory of a block of ROWS_ query rows (64 a consumer) walking key tiles of KEYS keys,
// from a 1024-byte aligned start: ROW_TENSORS tiles of the rows (Q; Q and dO), STAGES tiles of K
// and of V, the barriers, the key range of every row.
template <int D, int KEYS_, int ROW_TENSORS, int CONSUMERS_ = CONSUMERS> struct query_layout {
    static constexpr int ROWS_ = block_rows(CONSUMERS_);
    static constexpr size_t ROW_ATOM = atom_bytes(ROWS_), KEY_ATOM = atom_bytes(KEYS_);
    static constexpr size_t K = ROW_TENSORS * tile_bytes(ROWS_, D);
    static constexpr size_t V = K + STAGES * tile_bytes(KEYS_, D);
    // once, full[], empty[]
    static constexpr size_t BARRIERS = V + STAGES * tile_bytes(KEYS_, D);
    static constexpr size_t RANGES = BARRIERS + sizeof(uint64_t) * (1 + 2 * STAGES);
    static constexpr size_t BYTES = RANGES + 2 * ROWS_ * sizeof(int) + 1024; // + alignment
    static_assert(BYTES <= MAX_SMEM, "a query block's tiles exceed shared memory");
    __host__ __device__ static constexpr size_t rows(int tensor) {
        return tensor * tile_bytes(ROWS_, D);
    }
    __host__ __device__ static constexpr size_t k_tile(int stage) {
        return K + stage * tile_bytes(KEYS_, D);
    }
    __host__ __device__ static constexpr size_t v_tile(int stage) {
        return V + stage * tile_bytes(KEYS_, D);
    }
};

// A block of ROWS_ query rows of one head (block_tile: the heads fastest in the forward, not in
// the dQ kernel) and its walk over the key tiles they see: set up by every thread; the producer
// loads, the consumers wait for and release the stages.
template <int D, int KEYS_, int ROW_TENSORS, int CONSUMERS_ = CONSUMERS> struct query_block {
    using L = query_layout<D, KEYS_, ROW_TENSORS, CONSUMERS_>;
    static constexpr int ROWS_ = L::ROWS_;
    unsigned char *smem;
    barriers bar;
    int *row_lo, *row_hi; // the keys each row sees, [row_lo, row_hi)
    int r0, h, kvh, key_lo, tiles;

    __device__ query_block(const weft_cuda_attention_args &a, bool heads_fastest) {
        smem = hopper::align_1024(dynamic_smem<unsigned char>());
        uint64_t *bars = reinterpret_cast<uint64_t *>(smem + L::BARRIERS);
        bar = {bars, bars + 1, bars + 1 + STAGES};
        row_lo = reinterpret_cast<int *>(smem + L::RANGES);
        row_hi = row_lo + ROWS_;
        tile_of_head th = block_tile(true, heads_fastest);
        r0 = th.tile * ROWS_, h = th.head, kvh = h / (a.H / a.KV);
        if (threadIdx.x == 0) init_barriers(bar, 1, CONSUMERS_);
        if (threadIdx.x < ROWS_)
            row_key_range(a, r0 + threadIdx.x, &row_lo[threadIdx.x], &row_hi[threadIdx.x]);
        __syncthreads();
        key_span block = span_of(row_lo, row_hi, ROWS_);
        int n = block.lo < block.hi ? (block.hi - block.lo + KEYS_ - 1) / KEYS_ : 0;
        tiles = __shfl_sync(0xffffffffu, n, 0); // uniform, as take_role says
        key_lo = __shfl_sync(0xffffffffu, block.lo, 0);
    }

    // The producer (one thread): the rows of every row map once, then key tile j, [key_lo +
    // j·KEYS, + KEYS), into stage j % STAGES as soon as the consumers have released it.
    __device__ void produce(const weft_tensor_map *const *row_maps, const weft_tensor_map *k_map,
                            const weft_tensor_map *v_map) const {
        hopper::mbar_arrive_expect_tx(bar.once, ROW_TENSORS * ROWS_ * D * sizeof(bf16));
        for (int i = 0; i < ROW_TENSORS; i++)
            load_tile<ROWS_, D>(smem + L::rows(i), row_maps[i], h * D, r0, bar.once);
        for (int j = 0; j < tiles; j++) {
            int s = j % STAGES;
            hopper::mbar_wait(&bar.empty[s], ((j / STAGES) & 1) ^ 1); // first pass: all free
            hopper::mbar_arrive_expect_tx(&bar.full[s], 2 * KEYS_ * D * sizeof(bf16));
            load_tile<KEYS_, D>(smem + L::k_tile(s), k_map, kvh * D, key_lo + j * KEYS_,
                                &bar.full[s]);
            load_tile<KEYS_, D>(smem + L::v_tile(s), v_map, kvh * D, key_lo + j * KEYS_,
                                &bar.full[s]);
        }
    }

    // A consumer thread's first row in the block (its warpgroup's 64, its warp's 16, C row g; the
    // other is 8 further).
    __device__ int my_row() const {
        int w = (threadIdx.x >> 5) & 3;
        return 64 * (threadIdx.x / 128 - 1) + 16 * w + ((threadIdx.x & 31) >> 2);
    }
    // The start of consumer WG's rows in row tile `tensor`.
    template <int WG> __device__ const unsigned char *my_rows(int tensor) const {
        return smem + L::rows(tensor) + (size_t)64 * WG * hopper::ATOM_ROW_BYTES;
    }
    __device__ void wait_rows() const { hopper::mbar_wait(bar.once, 0); }
    __device__ void wait_tile(int j) const {
        hopper::mbar_wait(&bar.full[j % STAGES], (j / STAGES) & 1);
    }
    __device__ void release_tile(int j) const { // after the warpgroup's last wgmma on it
        if ((threadIdx.x & 127) == 0) hopper::mbar_arrive(&bar.empty[j % STAGES]);
    }
};

// A 2-D bf16 tensor of `rows` rows of `cols` elements (contiguous) for TMA, read in boxes of 64
// columns (128 bytes, 128-byte swizzle) by box_rows; false where the driver refuses it.
inline bool tensor_map_2d(weft_tensor_map *map, const void *base, int cols, int rows,
                          int box_rows) {
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

// The maps of q (Tq, H·D) and k, v (Tkv, KV·D), in boxes of q_rows and kv_rows; false where the
// driver refuses one.
struct qkv_maps {
    weft_tensor_map q, k, v;
};
inline bool make_qkv_maps(qkv_maps *m, const weft_cuda_attention_args *a, const void *q,
                          const void *k, const void *v, int q_rows, int kv_rows) {
    return tensor_map_2d(&m->q, q, a->H * a->D, a->Tq, q_rows) &&
           tensor_map_2d(&m->k, k, a->KV * a->D, a->Tkv, kv_rows) &&
           tensor_map_2d(&m->v, v, a->KV * a->D, a->Tkv, kv_rows);
}

} // namespace fa3
} // namespace
