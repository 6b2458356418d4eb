// Varlen causal attention backward for Hopper (sm_90a): the mma.sync backward's two kernels
// (attention_mma.cuh), each in the forward's design (attention_hopper.cuh): a producer streams
// tiles with TMA, two consumer warpgroups multiply with wgmma. As there, every output element has
// one writer, no atomics, so runs are bit-reproducible; the price is that S and dP are computed
// twice, once per kernel.
//   dQ: a block of 128 query rows walks the key tiles its rows see, as the forward does, with dO
//     loaded beside Q: S = Q K^T and dP = dO V^T (one wgmma group), dS = P (dP - delta) in
//     registers, then dQ += dS K with dS straight from them.
//   dK/dV: a block of 128 keys (64 per consumer) of one query head; the producer warp finds the
//     64-row steps of query rows that see any of them, announces each step's rows (their key
//     ranges, lse and delta) in shared memory beside its TMA-loaded Q and dO tiles, and a step
//     with i0 = -1 at the end. The consumers compute the transposed S^T = K Q^T and dP^T = V dO^T,
//     so that P^T and dS^T land in registers as the A operand of dV += P^T dO and dK += dS^T Q.
// Under grouped-query attention each query head writes fp32 partial dK/dV, summed per group as
// the mma backward does. The lse is either forward's: both families write the same one.
#include "backend/cuda/attention_hopper.cuh"

namespace {
namespace fa3 {

constexpr int DQ_KEYS = 64; // keys per tile of the dQ kernel: S, dP and dQ all fit in registers
constexpr int BLOCK_KEYS = 64 * CONSUMERS; // keys per dK/dV block
constexpr int STEP = 64;                   // query rows per step of the dK/dV kernel

// ------------------------------------------------------------------------------------ dQ ----

// A consumer warpgroup of the dQ kernel, run by run_pipeline: its 64 query rows against every
// key tile the block walks; tile j's dS is computed while the previous tile's dQ += dS K runs.
template <int D, int WG> struct dq_consumer {
    using B = query_block<D, DQ_KEYS, 2>;
    using L = typename B::L;
    static constexpr int NT = DQ_KEYS / 8, NO = D / 8;
    static constexpr bool OVERLAP = true;
    struct tile {
        float s[NT][4], dp[NT][4]; // S (then dS) and dP
    };
    const B &b;
    int lo[2], hi[2];           // the keys this thread's two rows see
    float lse[2], delta[2];     // theirs, lse in log2 units
    float scale_log2, acc[NO][4];
    uint32_t ds[DQ_KEYS / 16][4]; // the last tile's dS, bf16 A fragments

    __device__ __forceinline__ bool more(int j) const { return j < b.tiles; }
    // Waits for tile j; issues S = Q K^T and dP = dO V^T as one group.
    __device__ __forceinline__ void first(int j, tile &t) {
        b.wait_tile(j);
        issue_a_bt<D, DQ_KEYS>(t.s, b.template my_rows<WG>(0), L::ROW_ATOM,
                               b.smem + L::k_tile(j % STAGES), L::KEY_ATOM);
        issue_a_bt<D, DQ_KEYS>(t.dp, b.template my_rows<WG>(1), L::ROW_ATOM,
                               b.smem + L::v_tile(j % STAGES), L::KEY_ATOM);
        hopper::wgmma_commit();
    }
    // dQ += dS K with tile j's keys, committed.
    __device__ __forceinline__ void second(int j) {
        issue_a_b<DQ_KEYS, D>(acc, ds, b.smem + L::k_tile(j % STAGES), L::KEY_ATOM);
        hopper::wgmma_commit();
    }
    __device__ __forceinline__ void elementwise(int j, tile &t) {
        hopper::fence_registers<DQ_KEYS>(t.s);
        hopper::fence_registers<DQ_KEYS>(t.dp);
        mask_scores<1, NT>(&t.s, b.key_lo + j * DQ_KEYS, &lo, &hi);
        scores_to_ds<NT>(t.s, t.dp, lse, delta, scale_log2);
    }
    __device__ __forceinline__ void take(const tile &t) {
#pragma unroll
        for (int kc = 0; kc < DQ_KEYS / 16; kc++) c_to_a(ds[kc], t.s, kc);
    }
    __device__ __forceinline__ void release(int j) {
        hopper::fence_registers<D>(acc);
        b.release_tile(j);
    }
};

template <int D, int WG>
__device__ __forceinline__ void consume_dq(const weft_cuda_attention_args &a,
                                           const query_block<D, DQ_KEYS, 2> &b, const float *lse,
                                           const float *delta, bf16 *dq, float scale,
                                           float scale_log2) {
    int mine = b.my_row();
    dq_consumer<D, WG> c = {b, {}, {}, {}, {}, scale_log2, {}, {}};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        c.lo[r] = b.row_lo[mine + 8 * r], c.hi[r] = b.row_hi[mine + 8 * r];
        int row = min(b.r0 + mine + 8 * r, a.Tq - 1); // rows past Tq see no keys
        c.lse[r] = lse[(size_t)b.h * a.Tq + row] * LOG2E;
        c.delta[r] = delta[(size_t)b.h * a.Tq + row];
    }
    b.wait_rows();
    run_pipeline(c);
    float factor[2] = {scale, scale};
    store_query_rows<D>(a, b.r0 + mine, b.h, c.acc, factor, dq);
}

template <int D>
__global__ void __launch_bounds__(THREADS, 1)
    dq_kernel(const __grid_constant__ weft_tensor_map q_map,
              const __grid_constant__ weft_tensor_map do_map,
              const __grid_constant__ weft_tensor_map k_map,
              const __grid_constant__ weft_tensor_map v_map, weft_cuda_attention_args a,
              const float *lse, const float *delta, bf16 *dq, float scale, float scale_log2) {
    query_block<D, DQ_KEYS, 2> b(a);
    int role = take_role();
    if (role == 0) { // the producer warpgroup: one thread issues every copy
        const weft_tensor_map *rows[] = {&q_map, &do_map};
        if (threadIdx.x == 0) b.produce(rows, &k_map, &v_map);
        return;
    }
    as_consumer(role, [&](auto wg) {
        consume_dq<D, decltype(wg)::value>(a, b, lse, delta, dq, scale, scale_log2);
    });
}

// --------------------------------------------------------------------------------- dK dV ----

// A step of the dK/dV kernel as the producer announces it: its first query row (-1: there are no
// more) and its rows' key ranges, lse and delta.
struct step_meta {
    int i0;
    step_rows<STEP> rows;
};

// Shared memory of a dK/dV block, from a 1024-byte aligned start: its K and V tiles (BLOCK_KEYS x
// D), STAGES tiles of Q and of dO (STEP x D), STAGES step_meta, the barriers.
template <int D> struct dkdv_layout {
    static constexpr size_t KEY_ATOM = atom_bytes(BLOCK_KEYS), STEP_ATOM = atom_bytes(STEP);
    static constexpr size_t K = 0, V = tile_bytes(BLOCK_KEYS, D);
    static constexpr size_t Q = 2 * tile_bytes(BLOCK_KEYS, D);
    static constexpr size_t DO = Q + STAGES * tile_bytes(STEP, D);
    static constexpr size_t META = DO + STAGES * tile_bytes(STEP, D);
    static constexpr size_t BARRIERS = (META + STAGES * sizeof(step_meta) + 7) / 8 * 8;
    static constexpr size_t BYTES = BARRIERS + sizeof(uint64_t) * (1 + 2 * STAGES) + 1024;
    static_assert(BYTES <= MAX_SMEM, "a dK/dV block's tiles exceed shared memory");
    __host__ __device__ static constexpr size_t q_tile(int stage) {
        return Q + stage * tile_bytes(STEP, D);
    }
    __host__ __device__ static constexpr size_t do_tile(int stage) {
        return DO + stage * tile_bytes(STEP, D);
    }
};

struct dkdv_block {
    unsigned char *smem;
    barriers bar;
    step_meta *meta; // [STAGES]
    int h, j0, j_end; // query head, keys [j0, j_end)
};

// The producer warp: K and V of the block once, then every step of query rows that sees a key
// of the block (rows causally before all of them are skipped, never loaded), then the end.
template <int D>
__device__ void produce_steps(const weft_cuda_attention_args &a, const dkdv_block &b,
                              const weft_tensor_map *q_map, const weft_tensor_map *do_map,
                              const weft_tensor_map *k_map, const weft_tensor_map *v_map,
                              const float *lse, const float *delta) {
    using L = dkdv_layout<D>;
    int lane = threadIdx.x & 31, kvh = b.h / (a.H / a.KV);
    if (lane == 0) {
        hopper::mbar_arrive_expect_tx(b.bar.once, 2 * BLOCK_KEYS * D * sizeof(bf16));
        load_tile<BLOCK_KEYS, D>(b.smem + L::K, k_map, kvh * D, b.j0, b.bar.once);
        load_tile<BLOCK_KEYS, D>(b.smem + L::V, v_map, kvh * D, b.j0, b.bar.once);
    }
    // The rows that may see these keys: those of the documents the keys belong to.
    int rows_lo = a.cu_q[find_doc(a.cu_kv, a.n_docs, b.j0)];
    int rows_hi = a.cu_q[find_doc(a.cu_kv, a.n_docs, b.j_end - 1) + 1];
    for (int i0 = rows_lo, n = 0;; i0 += STEP) {
        bool end = i0 >= rows_hi, sees = false;
        int lo[2] = {0, 0}, hi[2] = {0, 0}; // lane's rows i0 + lane and i0 + lane + 32
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (i0 + lane + 32 * r < rows_hi) row_key_range(a, i0 + lane + 32 * r, &lo[r], &hi[r]);
            sees |= lo[r] < b.j_end && hi[r] > b.j0;
        }
        if (!end && !__any_sync(0xffffffffu, sees)) continue;
        int s = n % STAGES;
        hopper::mbar_wait(&b.bar.empty[s], ((n / STAGES) & 1) ^ 1); // first pass: all free
        step_meta &m = b.meta[s];
        if (lane == 0) m.i0 = end ? -1 : i0;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int at = lane + 32 * r, i = i0 + at;
            bool row = !end && i < a.Tq;
            m.rows.lo[at] = lo[r];
            m.rows.hi[at] = hi[r];
            m.rows.lse[at] = row ? lse[(size_t)b.h * a.Tq + i] * LOG2E : 0.0f;
            m.rows.delta[at] = row ? delta[(size_t)b.h * a.Tq + i] : 0.0f;
        }
        step_common_keys<STEP, 2>(m.rows, lo, hi);
        // Every lane arrives once its share of meta is written; lane 0 with the tiles' bytes.
        if (lane == 0 && !end) {
            hopper::mbar_arrive_expect_tx(&b.bar.full[s], 2 * STEP * D * sizeof(bf16));
            load_tile<STEP, D>(b.smem + L::q_tile(s), q_map, b.h * D, i0, &b.bar.full[s]);
            load_tile<STEP, D>(b.smem + L::do_tile(s), do_map, b.h * D, i0, &b.bar.full[s]);
        } else {
            hopper::mbar_arrive(&b.bar.full[s]);
        }
        n++;
        if (end) return;
    }
}

// A consumer warpgroup of the dK/dV kernel, run by run_pipeline: its 64 keys against every step
// the producer announces (all of them; see the forward's consumer for why no product is skipped
// under a branch; the mask is, where every row of the step sees all the keys); step n's P^T and
// dS^T are computed while the previous step's dV += P^T dO and dK += dS^T Q run (at head_dim 64;
// one step at a time at 128).
template <int D> struct dkdv_consumer {
    using L = dkdv_layout<D>;
    static constexpr int NT = STEP / 8, NO = D / 8;
    // At head_dim 128 dK and dV alone take 128 registers: two steps' worth would spill.
    static constexpr bool OVERLAP = D <= 64;
    struct tile {
        float st[NT][4], dpt[NT][4]; // S^T (then P^T) and dP^T (then dS^T)
    };
    const dkdv_block &b;
    const unsigned char *k_rows, *v_rows; // the warpgroup's 64 keys in the K and V tiles
    int key[2];                           // this thread's keys: C rows g and g + 8
    float scale_log2, dk[NO][4], dv[NO][4];
    uint32_t pt[STEP / 16][4], dst[STEP / 16][4]; // the last step's P^T, dS^T as A fragments

    // Waits for step n's stage; false at the producer's end mark.
    __device__ __forceinline__ bool more(int n) const {
        hopper::mbar_wait(&b.bar.full[n % STAGES], (n / STAGES) & 1);
        return __shfl_sync(0xffffffffu, b.meta[n % STAGES].i0, 0) >= 0; // uniform, see take_role
    }
    // S^T = K Q^T and dP^T = V dO^T of step n as one group.
    __device__ __forceinline__ void first(int n, tile &t) {
        int s = n % STAGES;
        issue_a_bt<D, STEP>(t.st, k_rows, L::KEY_ATOM, b.smem + L::q_tile(s), L::STEP_ATOM);
        issue_a_bt<D, STEP>(t.dpt, v_rows, L::KEY_ATOM, b.smem + L::do_tile(s), L::STEP_ATOM);
        hopper::wgmma_commit();
    }
    // dV += P^T dO and dK += dS^T Q with step n's rows, committed.
    __device__ __forceinline__ void second(int n) {
        int s = n % STAGES;
        issue_a_b<STEP, D>(dv, pt, b.smem + L::do_tile(s), L::STEP_ATOM);
        issue_a_b<STEP, D>(dk, dst, b.smem + L::q_tile(s), L::STEP_ATOM);
        hopper::wgmma_commit();
    }
    __device__ __forceinline__ void elementwise(int n, tile &t) {
        hopper::fence_registers<STEP>(t.st);
        hopper::fence_registers<STEP>(t.dpt);
        transposed_ds<NT>(t.st, t.dpt, key, b.meta[n % STAGES].rows, scale_log2);
    }
    __device__ __forceinline__ void take(const tile &t) {
#pragma unroll
        for (int kc = 0; kc < STEP / 16; kc++) {
            c_to_a(pt[kc], t.st, kc);
            c_to_a(dst[kc], t.dpt, kc);
        }
    }
    // Every warp read the step's meta: each one releases the stage.
    __device__ __forceinline__ void release(int n) {
        hopper::fence_registers<D>(dv);
        hopper::fence_registers<D>(dk);
        if ((threadIdx.x & 31) == 0) hopper::mbar_arrive(&b.bar.empty[n % STAGES]);
    }
};

template <int D, int WG>
__device__ __forceinline__ void consume_steps(const weft_cuda_attention_args &a,
                                              const dkdv_block &b, bf16 *dk, bf16 *dv,
                                              float *dk_part, float *dv_part, float scale,
                                              float scale_log2) {
    using L = dkdv_layout<D>;
    int first = 64 * WG, w = (threadIdx.x >> 5) & 3;
    int key0 = b.j0 + first + 16 * w + (int)((threadIdx.x & 31) >> 2);
    dkdv_consumer<D> c = {b,
                          b.smem + L::K + (size_t)first * hopper::ATOM_ROW_BYTES,
                          b.smem + L::V + (size_t)first * hopper::ATOM_ROW_BYTES,
                          {key0, key0 + 8},
                          scale_log2, {}, {}, {}, {}};
    hopper::mbar_wait(b.bar.once, 0);
    run_pipeline(c);
#pragma unroll
    for (int r = 0; r < 2; r++)
        if (c.key[r] < b.j_end)
            store_key_row<D / 8>(a, c.key[r], b.h, r, c.dk, c.dv, scale, dk, dv, dk_part,
                                 dv_part);
}

template <int D>
__global__ void __launch_bounds__(THREADS, 1)
    dkdv_kernel(const __grid_constant__ weft_tensor_map q_map,
                const __grid_constant__ weft_tensor_map do_map,
                const __grid_constant__ weft_tensor_map k_map,
                const __grid_constant__ weft_tensor_map v_map, weft_cuda_attention_args a,
                const float *lse, const float *delta, bf16 *dk, bf16 *dv, float *dk_part,
                float *dv_part, float scale, float scale_log2) {
    using L = dkdv_layout<D>;
    dkdv_block b;
    b.smem = hopper::align_1024(dynamic_smem<unsigned char>());
    uint64_t *bars = reinterpret_cast<uint64_t *>(b.smem + L::BARRIERS);
    b.bar = {bars, bars + 1, bars + 1 + STAGES};
    b.meta = reinterpret_cast<step_meta *>(b.smem + L::META);
    tile_of_head th = block_tile(false);
    b.h = th.head, b.j0 = th.tile * BLOCK_KEYS, b.j_end = min(b.j0 + BLOCK_KEYS, a.Tkv);
    if (threadIdx.x == 0) init_barriers(b.bar, 32, 4 * CONSUMERS); // full: the producer warp
    __syncthreads();
    int role = take_role();
    if (role == 0) {
        if (threadIdx.x < 32) produce_steps<D>(a, b, &q_map, &do_map, &k_map, &v_map, lse, delta);
        return;
    }
    as_consumer(role, [&](auto wg) {
        consume_steps<D, decltype(wg)::value>(a, b, dk, dv, dk_part, dv_part, scale, scale_log2);
    });
}

} // namespace fa3
} // namespace

extern "C" bool weft_cuda_attention_backward_hopper(weft_cuda_stream s,
                                                    const weft_cuda_attention_args *a,
                                                    const void *q, const void *k, const void *v,
                                                    const float *lse, const void *dout,
                                                    const float *delta, void *dq, void *dk,
                                                    void *dv, float *partials) {
    // Boxes: the dQ kernel reads rows in blocks and keys in tiles, the dK/dV kernel the reverse.
    fa3::qkv_maps dq_maps, dkdv_maps;
    weft_tensor_map do_block, do_step;
    int HD = a->H * a->D;
    if (!fa3::make_qkv_maps(&dq_maps, a, q, k, v, fa3::ROWS, fa3::DQ_KEYS) ||
        !fa3::make_qkv_maps(&dkdv_maps, a, q, k, v, fa3::STEP, fa3::BLOCK_KEYS) ||
        !fa3::tensor_map_2d(&do_block, dout, HD, a->Tq, fa3::ROWS) ||
        !fa3::tensor_map_2d(&do_step, dout, HD, a->Tq, fa3::STEP))
        return false;
    float scale = 1.0f / sqrtf((float)a->D), scale_log2 = scale * LOG2E;
    bool grouped = a->H != a->KV;
    float *dk_part = grouped ? partials : NULL;
    float *dv_part = grouped ? partials + (size_t)a->Tkv * a->H * a->D : NULL;
    dim3 grid_q((a->Tq + fa3::ROWS - 1) / fa3::ROWS, a->H);
    dim3 grid_kv((a->Tkv + fa3::BLOCK_KEYS - 1) / fa3::BLOCK_KEYS, a->H);
#define LAUNCH(D)                                                                                  \
    WEFT_LAUNCH(fa3::dq_kernel<D>, grid_q, fa3::THREADS,                                           \
                (fa3::query_layout<D, fa3::DQ_KEYS, 2>::BYTES), s, dq_maps.q, do_block,            \
                dq_maps.k, dq_maps.v, *a, lse, delta, (bf16 *)dq, scale, scale_log2);              \
    WEFT_LAUNCH(fa3::dkdv_kernel<D>, grid_kv, fa3::THREADS, fa3::dkdv_layout<D>::BYTES, s,         \
                dkdv_maps.q, do_step, dkdv_maps.k, dkdv_maps.v, *a, lse, delta, (bf16 *)dk,       \
                (bf16 *)dv, dk_part, dv_part, scale, scale_log2)
    if (a->D == 64) {
        LAUNCH(64);
    } else {
        LAUNCH(128);
    }
#undef LAUNCH
    if (grouped) sum_groups(s, a, partials, dk, dv);
    return true;
}
