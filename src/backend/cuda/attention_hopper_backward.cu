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

template <int D>
__device__ __forceinline__ void consume_dq(const weft_cuda_attention_args &a,
                                           const query_block<D, DQ_KEYS, 2> &b, const float *lse,
                                           const float *delta, bf16 *dq, float scale,
                                           float scale_log2) {
    using L = typename query_block<D, DQ_KEYS, 2>::L;
    constexpr int NT = DQ_KEYS / 8, NO = D / 8;
    int mine = b.my_row(), lo[2], hi[2];
    float row_lse[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lo[r] = b.row_lo[mine + 8 * r], hi[r] = b.row_hi[mine + 8 * r];
        int row = min(b.r0 + mine + 8 * r, a.Tq - 1); // rows past Tq see no keys
        row_lse[r] = lse[(size_t)b.h * a.Tq + row] * LOG2E;
        row_delta[r] = delta[(size_t)b.h * a.Tq + row];
    }
    float acc[NO][4] = {};
    b.wait_rows();
    for (int j = 0; j < b.tiles; j++) {
        const unsigned char *k_tile = b.smem + L::k_tile(j % STAGES);
        float s[NT][4], dp[NT][4];
        b.wait_tile(j);
        issue_a_bt<D, DQ_KEYS>(s, b.my_rows(0), L::ROW_ATOM, k_tile, L::KEY_ATOM);
        issue_a_bt<D, DQ_KEYS>(dp, b.my_rows(1), L::ROW_ATOM, b.smem + L::v_tile(j % STAGES),
                               L::KEY_ATOM);
        hopper::wgmma_commit();
        hopper::wgmma_wait<0>();
        hopper::fence_registers<DQ_KEYS>(s);
        hopper::fence_registers<DQ_KEYS>(dp);
        mask_scores<NT>(s, b.key_lo + j * DQ_KEYS, lo, hi, scale_log2);
        scores_to_ds<NT>(s, dp, row_lse, row_delta);
        issue_c_b<DQ_KEYS, D>(acc, s, k_tile, L::KEY_ATOM);
        hopper::wgmma_commit();
        hopper::wgmma_wait<0>(); // before the stage is released
        hopper::fence_registers<D>(acc);
        b.release_tile(j);
    }
    float factor[2] = {scale, scale};
    store_query_rows<D>(a, b.r0 + mine, b.h, acc, factor, dq);
}

template <int D>
__global__ void __launch_bounds__(THREADS, 1)
    dq_kernel(const __grid_constant__ weft_tensor_map q_map,
              const __grid_constant__ weft_tensor_map do_map,
              const __grid_constant__ weft_tensor_map k_map,
              const __grid_constant__ weft_tensor_map v_map, weft_cuda_attention_args a,
              const float *lse, const float *delta, bf16 *dq, float scale, float scale_log2) {
    query_block<D, DQ_KEYS, 2> b(a);
    if (take_role() == 0) { // the producer warpgroup: one thread issues every copy
        const weft_tensor_map *rows[] = {&q_map, &do_map};
        if (threadIdx.x == 0) b.produce(rows, &k_map, &v_map);
        return;
    }
    consume_dq<D>(a, b, lse, delta, dq, scale, scale_log2);
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

// A consumer warpgroup: its 64 keys against every step the producer announces (all masked; see
// the forward's consumer for why nothing is skipped under a branch), then its dK and dV rows.
template <int D>
__device__ __forceinline__ void consume_steps(const weft_cuda_attention_args &a,
                                              const dkdv_block &b, bf16 *dk, bf16 *dv,
                                              float *dk_part, float *dv_part, float scale,
                                              float scale_log2) {
    using L = dkdv_layout<D>;
    constexpr int NT = STEP / 8, NO = D / 8;
    int first = 64 * (threadIdx.x / 128 - 1), w = (threadIdx.x >> 5) & 3;
    int key[2] = {b.j0 + first + 16 * w + (int)((threadIdx.x & 31) >> 2), 0}; // C rows g, g + 8
    key[1] = key[0] + 8;
    const unsigned char *k_rows = b.smem + L::K + (size_t)first * hopper::ATOM_ROW_BYTES;
    const unsigned char *v_rows = b.smem + L::V + (size_t)first * hopper::ATOM_ROW_BYTES;
    float dk_acc[NO][4] = {}, dv_acc[NO][4] = {};
    hopper::mbar_wait(b.bar.once, 0);
    for (int n = 0;; n++) {
        int s = n % STAGES;
        hopper::mbar_wait(&b.bar.full[s], (n / STAGES) & 1);
        if (__shfl_sync(0xffffffffu, b.meta[s].i0, 0) < 0) break; // uniform, as take_role says
        const unsigned char *q_tile = b.smem + L::q_tile(s), *do_tile = b.smem + L::do_tile(s);
        float st[NT][4], dpt[NT][4];
        issue_a_bt<D, STEP>(st, k_rows, L::KEY_ATOM, q_tile, L::STEP_ATOM);
        issue_a_bt<D, STEP>(dpt, v_rows, L::KEY_ATOM, do_tile, L::STEP_ATOM);
        hopper::wgmma_commit();
        hopper::wgmma_wait<0>();
        hopper::fence_registers<STEP>(st);
        hopper::fence_registers<STEP>(dpt);
        transposed_ds<NT>(st, dpt, key, b.meta[s].rows, scale_log2);
        issue_c_b<STEP, D>(dv_acc, st, do_tile, L::STEP_ATOM);
        issue_c_b<STEP, D>(dk_acc, dpt, q_tile, L::STEP_ATOM);
        hopper::wgmma_commit();
        hopper::wgmma_wait<0>(); // before the stage is released
        hopper::fence_registers<D>(dv_acc);
        hopper::fence_registers<D>(dk_acc);
        // Every warp read the step's meta: each one releases the stage.
        if ((threadIdx.x & 31) == 0) hopper::mbar_arrive(&b.bar.empty[s]);
    }
#pragma unroll
    for (int r = 0; r < 2; r++)
        if (key[r] < b.j_end)
            store_key_row<NO>(a, key[r], b.h, r, dk_acc, dv_acc, scale, dk, dv, dk_part, dv_part);
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
    b.h = blockIdx.y, b.j0 = blockIdx.x * BLOCK_KEYS, b.j_end = min(b.j0 + BLOCK_KEYS, a.Tkv);
    if (threadIdx.x == 0) init_barriers(b.bar, 32, 4 * CONSUMERS); // full: the producer warp
    __syncthreads();
    if (take_role() == 0) {
        if (threadIdx.x < 32) produce_steps<D>(a, b, &q_map, &do_map, &k_map, &v_map, lse, delta);
        return;
    }
    consume_steps<D>(a, b, dk, dv, dk_part, dv_part, scale, scale_log2);
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
