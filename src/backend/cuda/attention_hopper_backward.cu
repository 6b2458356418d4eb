// Varlen causal attention backward for Hopper (sm_90a), in the forward's design
// (attention_hopper.cuh): a producer streams tiles with TMA, two consumer warpgroups multiply with
// wgmma. Two ways to dQ, both bit-reproducible:
//   recompute (the default): the mma.sync backward's two kernels (attention_mma.cuh), in which
//     every output element has one writer, at the price of computing S and dP twice, once per
//     kernel (seven products per tile);
//   ordered: the dK/dV kernel below also computes each step's dQ from the dS it has anyway and
//     adds it into fp32 sums with a TMA bulk reduction, the blocks taking turns in a fixed order
//     (five products, as FlashAttention-3's deterministic mode). Two earlier versions, adding
//     with per-thread reductions, were 1.6-1.9x slower than recomputing on an H100; the third,
//     with one bulk reduction a step but its dQ product waited for alone and the consumers'
//     shares added in shared memory, 1.07-1.15x slower on an H200; this fourth one overlaps the
//     dQ product with the next step's work and adds nothing in shared memory at head_dim 128
//     (not yet timed; bench/README.md).
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
// Named barriers of the ORDERED dK/dV kernel (0 is __syncthreads): both consumers', and one
// consumer's own (+ its index).
constexpr int BAR_CONSUMERS = 1, BAR_CONSUMER = 2;

// ORDERED: how the two consumers share a step's dQ = dS K. At head_dim 128 by columns: each
// computes D / 2 of them over all the block's keys (n64 wgmma, its K operand one whole 64-column
// atom). At 64 the halves would be 32 columns, which a 128-byte-swizzled MN-major operand cannot
// describe (the PTX ISA's canonical layouts start such an operand at a 64-element atom), so there
// each computes all D columns over its own 64 keys, and the two partial sums are added.
__host__ __device__ constexpr bool dq_split_by_keys(int D) { return D <= 64; }
// The columns of dQ one consumer's fragments cover.
__host__ __device__ constexpr int dq_cols(int D) {
    return dq_split_by_keys(D) ? D : D / CONSUMERS;
}

// ------------------------------------------------------------------------------------ dQ ----

// A consumer warpgroup of the dQ kernel, run by run_pipeline: its 64 query rows against every
// key tile the block walks; tile j's dS is computed while the previous tile's dQ += dS K runs.
template <int D, int WG, int C> struct dq_consumer {
    using B = query_block<D, DQ_KEYS, 2, C>;
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

template <int D, int WG, int C>
__device__ __forceinline__ void consume_dq(const weft_cuda_attention_args &a,
                                           const query_block<D, DQ_KEYS, 2, C> &b,
                                           const float *lse, const float *delta, bf16 *dq,
                                           float scale, float scale_log2) {
    int mine = b.my_row();
    dq_consumer<D, WG, C> c = {b, {}, {}, {}, {}, scale_log2, {}, {}};
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

// C consumer warpgroups of 64 query rows each (block_rows), as the forward's.
template <int D, int C>
__global__ void __launch_bounds__(block_threads(C), 1)
    dq_kernel(const __grid_constant__ weft_tensor_map q_map,
              const __grid_constant__ weft_tensor_map do_map,
              const __grid_constant__ weft_tensor_map k_map,
              const __grid_constant__ weft_tensor_map v_map, weft_cuda_attention_args a,
              const float *lse, const float *delta, bf16 *dq, float scale, float scale_log2) {
    wait_for_earlier_kernels();
    query_block<D, DQ_KEYS, 2, C> b(a, false);
    int role = take_role<C>();
    if (role == 0) { // the producer warpgroup: one thread issues every copy
        const weft_tensor_map *rows[] = {&q_map, &do_map};
        if (threadIdx.x == 0) b.produce(rows, &k_map, &v_map);
        return;
    }
    as_consumer<C>(role, [&](auto wg) {
        consume_dq<D, decltype(wg)::value, C>(a, b, lse, delta, dq, scale, scale_log2);
    });
}

// --------------------------------------------------------------------------------- dK dV ----

// A step of the dK/dV kernel as the producer announces it: its first query row (-1: there are no
// more; ORDERED, a multiple of STEP, so that every block's steps are the same rows), its rows' key
// ranges, lse and delta, and how many blocks of keys after this one add into its dQ before it
// (ORDERED).
struct step_meta {
    int i0, order;
    step_rows<STEP> rows;
};

// ORDERED: the step whose dQ is in shared memory, as the consumers hand it to the writer.
struct dq_header {
    int i0, order;
};

// Where element (row, col) of a step's dQ (STEP x D) is, in floats, in the ORDERED kernel's
// shared and global tiles: in the order the consumers' C fragments hold it (store_dq). Fragments
// of N = dq_cols(D) columns [c·N, c·N + N): thread T = 32w + 4g + t holds rows 16w + g + 8r,
// columns c·N + 8nt + 2t + e, as float4 q = r·N/16 + nt/2, element 2(nt % 2) + e, at
// ((c·N/8 + q)·128 + T)·4, so that a warp's float4 stores are one contiguous run.
__host__ __device__ constexpr int dq_tile_offset(int row, int col, int D) {
    int N = dq_cols(D), w = row / 16, g = row % 8, r = row % 16 / 8;
    int c = col / N, n = col % N, nt = n / 8;
    int T = 32 * w + 4 * g + n % 8 / 2, q = r * (N / 16) + nt / 2;
    return ((c * (N / 8) + q) * 128 + T) * 4 + 2 * (nt % 2) + n % 2;
}

// Shared memory of a dK/dV block, from a 1024-byte aligned start: its K and V tiles (BLOCK_KEYS x
// D), STAGES tiles of Q and of dO (STEP x D); ORDERED, the step's dS^T (BLOCK_KEYS x STEP),
// DQ_BUFFERS tiles of dQ (STEP x D fp32, dq_tile_offset's order), PARTIALS more (dQ split by
// keys: one consumer's partial sums) and the tiles' headers; STAGES step_meta;
// the barriers (once, full[], empty[]; ORDERED, dq_full[] and dq_empty[]).
template <int D, bool ORDERED> struct dkdv_layout {
    // ORDERED: at head_dim 64 the consumers store a step's dQ while the writer may still be
    // reducing the step before's; at 128 a second tile would not fit.
    static constexpr int DQ_BUFFERS = ORDERED ? (D <= 64 ? 2 : 1) : 0;
    static constexpr int PARTIALS = ORDERED && dq_split_by_keys(D) ? 1 : 0;
    static constexpr size_t KEY_ATOM = atom_bytes(BLOCK_KEYS), STEP_ATOM = atom_bytes(STEP);
    static constexpr size_t K = 0, V = tile_bytes(BLOCK_KEYS, D);
    static constexpr size_t Q = 2 * tile_bytes(BLOCK_KEYS, D);
    static constexpr size_t DO = Q + STAGES * tile_bytes(STEP, D);
    static constexpr size_t DS = DO + STAGES * tile_bytes(STEP, D);
    static constexpr size_t DQ_SHARE = STEP * D * sizeof(float);
    static constexpr size_t DQ = DS + (ORDERED ? tile_bytes(BLOCK_KEYS, STEP) : 0);
    static constexpr size_t PARTIAL = DQ + DQ_BUFFERS * DQ_SHARE;
    static constexpr size_t DQ_HEADER = PARTIAL + PARTIALS * DQ_SHARE;
    static constexpr size_t META = DQ_HEADER + DQ_BUFFERS * 16;
    static constexpr size_t BARRIERS = (META + STAGES * sizeof(step_meta) + 7) / 8 * 8;
    static constexpr size_t BYTES =
        BARRIERS + sizeof(uint64_t) * (1 + 2 * STAGES + 2 * DQ_BUFFERS) + 1024;
    static_assert(BYTES <= MAX_SMEM, "a dK/dV block's tiles exceed shared memory");
    __host__ __device__ static constexpr size_t q_tile(int stage) {
        return Q + stage * tile_bytes(STEP, D);
    }
    __host__ __device__ static constexpr size_t do_tile(int stage) {
        return DO + stage * tile_bytes(STEP, D);
    }
};

// Where the ORDERED kernel sums dQ: fp32 (H, steps, STEP x D), each step's tile in
// dq_tile_offset's order, and per query head and step a count of the blocks that have added
// theirs.
struct dq_sums {
    float *sums;
    int *counts; // (H, steps)
    int steps;   // STEP-row steps of Tq
};

struct dkdv_block {
    unsigned char *smem;
    barriers bar;
    step_meta *meta;        // [STAGES]
    int h, tile, j0, j_end; // query head, tile of keys [j0, j_end)
    dq_sums dq;
    // ORDERED, [DQ_BUFFERS], step n's in n % DQ_BUFFERS: dQ tiles (store_dq), the steps they are
    // of; full: written by the consumers; empty: read by the writer's reduction.
    float *dq_share, *dq_partial; // dq_partial: dQ split by keys
    dq_header *dq_head;
    uint64_t *dq_full, *dq_empty;
};

// The producer warp: K and V of the block once, then every step of query rows of which a row sees
// a key of the block (rows causally before all of them are skipped, never loaded), then the end.
// ORDERED, a step's rows together see keys [first, last) (each row a prefix of its document's):
// the blocks of keys that meet that span are the step's, every one of them announces it, and the
// number of them after this block orders its dQ.
template <int D, bool ORDERED>
__device__ void produce_steps(const weft_cuda_attention_args &a, const dkdv_block &b,
                              const weft_tensor_map *q_map, const weft_tensor_map *do_map,
                              const weft_tensor_map *k_map, const weft_tensor_map *v_map,
                              const float *lse, const float *delta) {
    using L = dkdv_layout<D, ORDERED>;
    int lane = threadIdx.x & 31, kvh = b.h / (a.H / a.KV);
    if (lane == 0) {
        hopper::mbar_arrive_expect_tx(b.bar.once, 2 * BLOCK_KEYS * D * sizeof(bf16));
        load_tile<BLOCK_KEYS, D>(b.smem + L::K, k_map, kvh * D, b.j0, b.bar.once);
        load_tile<BLOCK_KEYS, D>(b.smem + L::V, v_map, kvh * D, b.j0, b.bar.once);
    }
    // The rows that may see these keys: those of the documents the keys belong to (ORDERED: in
    // steps that start at multiples of STEP, so that every block's steps are the same rows).
    int rows_lo = a.cu_q[find_doc(a.cu_kv, a.n_docs, b.j0)];
    int rows_hi = a.cu_q[find_doc(a.cu_kv, a.n_docs, b.j_end - 1) + 1];
    if (ORDERED) rows_lo = rows_lo / STEP * STEP;
    for (int i0 = rows_lo, n = 0;; i0 += STEP) {
        bool end = i0 >= rows_hi, sees = false;
        int lo[2] = {0, 0}, hi[2] = {0, 0}; // lane's rows i0 + lane and i0 + lane + 32
        int first = INT_MAX, last = 0;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (!end && (ORDERED || i0 + lane + 32 * r < rows_hi))
                row_key_range(a, i0 + lane + 32 * r, &lo[r], &hi[r]);
            sees |= lo[r] < b.j_end && hi[r] > b.j0;
            if (lo[r] < hi[r]) first = min(first, lo[r]), last = max(last, hi[r]);
        }
        bool announce;
        if constexpr (ORDERED) {
            first = -warp_max(-first), last = warp_max(last);
            announce = first < b.j_end && last > b.j0;
        } else {
            announce = __any_sync(0xffffffffu, sees);
        }
        if (!end && !announce) continue;
        int s = n % STAGES;
        hopper::mbar_wait(&b.bar.empty[s], ((n / STAGES) & 1) ^ 1); // first pass: all free
        step_meta &m = b.meta[s];
        if (lane == 0) m.i0 = end ? -1 : i0, m.order = end ? 0 : (last - 1) / BLOCK_KEYS - b.tile;
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

// ORDERED: the writer (one thread) adds each step's dQ tile into the fp32 sums with one bulk
// reduction once every block of keys after this one that adds into the step has (wait_counter),
// frees the tile as soon as the reduction has read it, and counts itself in once its sums have
// landed (checked a step later, so that the next step's reduction is under way meanwhile). The
// blocks of later keys start first (block_tile, keys last-first), so the wait ends; and being
// further down the diagonal they reach any row first, so in the steady state there is nothing to
// wait for. A dQ element's terms are added in the same order in every run: bit-reproducible,
// without computing S and dP a second time in a dQ kernel.
template <int D> __device__ void write_dq(const dkdv_block &b) {
    constexpr int BUFFERS = dkdv_layout<D, true>::DQ_BUFFERS;
    int *landing = nullptr; // the count of the step whose sums are still on their way
    for (int n = 0;; n++) {
        int buffer = n % BUFFERS;
        hopper::mbar_wait(&b.dq_full[buffer], (n / BUFFERS) & 1);
        dq_header step = b.dq_head[buffer];
        if (step.i0 < 0) break;
        size_t at = (size_t)b.h * b.dq.steps + step.i0 / STEP;
        hopper::wait_counter(b.dq.counts + at, step.order);
        hopper::fence_proxy_async_global(); // the turn, before the reduction's adds
        hopper::bulk_reduce_add(b.dq.sums + at * STEP * D, b.dq_share + buffer * STEP * D,
                                STEP * D * sizeof(float));
        hopper::bulk_commit();
        hopper::bulk_wait<0, true>(); // read: the consumers may write another step's there
        hopper::mbar_arrive(&b.dq_empty[buffer]);
        if (landing) {
            hopper::bulk_wait<1, false>(); // the step before's sums are in
            hopper::fence_proxy_async_global();
            hopper::signal_counter(landing);
        }
        landing = b.dq.counts + at;
    }
    if (landing) {
        hopper::bulk_wait<0, false>();
        hopper::fence_proxy_async_global();
        hopper::signal_counter(landing);
    }
}

// A consumer warpgroup of the dK/dV kernel, run by run_pipeline: its 64 keys against every step
// the producer announces (all of them; see the forward's consumer for why no product is skipped
// under a branch; the mask is, where every row of the step sees all the keys); step n's P^T and
// dS^T are computed while the previous step's dV += P^T dO and dK += dS^T Q run (at head_dim 64;
// one step at a time at 128).
// ORDERED, the step's dQ too, as FlashAttention-3 computes it: each consumer puts its keys' rows
// of dS^T into shared memory (take) and, once the rows its share needs are there, issues that
// share of dQ = dS K (dS read transposed from the dS^T tile) with its dV and dK products, so it
// runs on the tensor cores beside the next step's elementwise work. The shares (dq_split_by_keys)
// are disjoint columns, each stored into the dQ tile by its consumer, or the two consumers' keys,
// whose partial sums one of them (by turns) adds (release); then the tile goes to the writer.
template <int D, int WG, bool ORDERED> struct dkdv_consumer {
    using L = dkdv_layout<D, ORDERED>;
    static constexpr int NT = STEP / 8, NO = D / 8;
    static constexpr int DQ_COLS = dq_cols(D); // ORDERED: the columns of dQ this consumer sums
    // At head_dim 128 dK and dV alone take 128 registers: two steps' worth would spill.
    static constexpr bool OVERLAP = D <= 64;
    struct tile {
        float st[NT][4], dpt[NT][4]; // S^T (then P^T) and dP^T (then dS^T)
    };
    const dkdv_block &b;
    const unsigned char *k_rows, *v_rows; // the warpgroup's 64 keys in the K and V tiles
    unsigned char *ds_rows;               // ... and in the dS^T tile (ORDERED)
    int key[2];                           // this thread's keys: C rows g and g + 8
    float scale_log2, dk[NO][4], dv[NO][4];
    float dq[DQ_COLS / 8][4];                     // ORDERED: the step's share of dQ
    uint32_t pt[STEP / 16][4], dst[STEP / 16][4]; // the last step's P^T, dS^T as A fragments
    int steps;                                    // how many there were, once more() said no

    // Waits for step n's stage; false at the producer's end mark.
    __device__ __forceinline__ bool more(int n) {
        hopper::mbar_wait(&b.bar.full[n % STAGES], (n / STAGES) & 1);
        bool go = __shfl_sync(0xffffffffu, b.meta[n % STAGES].i0, 0) >= 0; // uniform: take_role
        if (!go) steps = n;
        return go;
    }
    // S^T = K Q^T and dP^T = V dO^T of step n as one group.
    __device__ __forceinline__ void first(int n, tile &t) {
        int s = n % STAGES;
        issue_a_bt<D, STEP>(t.st, k_rows, L::KEY_ATOM, b.smem + L::q_tile(s), L::STEP_ATOM);
        issue_a_bt<D, STEP>(t.dpt, v_rows, L::KEY_ATOM, b.smem + L::do_tile(s), L::STEP_ATOM);
        hopper::wgmma_commit();
    }
    // dV += P^T dO and dK += dS^T Q with step n's rows (ORDERED: and the step's share of dQ, once
    // the dS^T rows it reads are in place: its own, or both consumers'), committed.
    __device__ __forceinline__ void second(int n) {
        int s = n % STAGES;
        issue_a_b<STEP, D>(dv, pt, b.smem + L::do_tile(s), L::STEP_ATOM);
        issue_a_b<STEP, D>(dk, dst, b.smem + L::q_tile(s), L::STEP_ATOM);
        if constexpr (ORDERED) {
            if constexpr (dq_split_by_keys(D)) hopper::named_barrier(BAR_CONSUMER + WG, 128);
            else hopper::named_barrier(BAR_CONSUMERS, 128 * CONSUMERS);
            issue_dq();
        }
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
        if constexpr (ORDERED) store_ds(t);
    }
    // Every warp read the step's meta: each one releases the stage.
    __device__ __forceinline__ void release(int n) {
        hopper::fence_registers<D>(dv);
        hopper::fence_registers<D>(dk);
        if constexpr (ORDERED) store_dq(n, b.meta[n % STAGES]);
        if ((threadIdx.x & 31) == 0) hopper::mbar_arrive(&b.bar.empty[n % STAGES]);
    }

    // dS^T (this thread's C fragments: keys g and g + 8 of its warp's 16, query rows 8nt + 2t and
    // + 1) as bf16 into the warpgroup's 64 rows of the dS^T tile, query rows along a row; then
    // visible to the wgmma that read it (after the barrier in second).
    __device__ __forceinline__ void store_ds(const tile &t) {
        int w = (threadIdx.x >> 5) & 3, g = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                uint32_t at = (16 * w + g + 8 * r) * hopper::ATOM_ROW_BYTES +
                              (8 * nt + 2 * tq) * (uint32_t)sizeof(bf16);
                store_vector(ds_rows + hopper::swizzled(at),
                             pack_bf16(t.dpt[nt][2 * r], t.dpt[nt][2 * r + 1]));
            }
        hopper::fence_proxy_async();
    }
    // Issues dq (64 x DQ_COLS) = dS (the step's 64 rows x the share's keys: the dS^T tile read
    // MN-major) times those keys' K rows, its columns (MN-major), uncommitted: by keys, this
    // consumer's 64 keys and every column; by columns, all the block's keys and the consumer's
    // 64-column atom of K.
    __device__ __forceinline__ void issue_dq() {
        constexpr bool BY_KEYS = dq_split_by_keys(D);
        constexpr int keys = BY_KEYS ? 64 : BLOCK_KEYS;
        const unsigned char *ds = BY_KEYS ? ds_rows : b.smem + L::DS;
        const unsigned char *k = BY_KEYS ? k_rows : b.smem + L::K + WG * L::KEY_ATOM;
        hopper::wgmma_fence();
        uint64_t da = hopper::smem_descriptor(ds, (uint32_t)L::KEY_ATOM, SBO);
        uint64_t db = hopper::smem_descriptor(k, (uint32_t)L::KEY_ATOM, SBO);
#pragma unroll
        for (int kc = 0; kc < keys / 16; kc++) { // 16 keys: two 8-row groups of both tiles
            uint32_t k16 = kc * 16 * hopper::ATOM_ROW_BYTES;
            hopper::wgmma_ss<DQ_COLS, true, true>(dq, hopper::descriptor_plus(da, k16),
                                                  hopper::descriptor_plus(db, k16), kc > 0);
        }
    }
    // Step n's dQ into the tile once the writer's reduction has read the tile's last step
    // (dq_empty), then to the writer (dq_full) with its step (header).
    // By columns: both consumers store their columns; the barrier after also keeps either from
    // writing the next step's dS^T (take) before both products that read this one are done.
    // By keys: consumer n % 2 adds the other's partial sums to its own and stores them; each
    // product read only its own consumer's dS^T rows, which its own wait ordered. One buffer of
    // partial sums is enough because the consumers take turns: the one that adds step n's stores
    // step n + 1's, each thread the elements it has just read, so no thread overwrites what
    // another has yet to read.
    __device__ __forceinline__ void store_dq(int n, const step_meta &m) {
        constexpr bool BY_KEYS = dq_split_by_keys(D);
        hopper::fence_registers<DQ_COLS>(dq);
        int buffer = n % L::DQ_BUFFERS, T = threadIdx.x & 127;
        bool stores = !BY_KEYS || n % 2 == WG; // into the tile; else into the partial sums
        float *tile = b.dq_share + (size_t)buffer * STEP * D +
                      ((size_t)(BY_KEYS ? 0 : WG) * (DQ_COLS / 8) * 128 + T) * 4;
        float *partial = b.dq_partial + (size_t)T * 4;
        if (stores) {
            hopper::mbar_wait(&b.dq_empty[buffer], ((n / L::DQ_BUFFERS) & 1) ^ 1); // first: free
            if (T == 0 && (BY_KEYS || WG == 0)) b.dq_head[buffer] = {m.i0, m.order};
        } else {
#pragma unroll
            for (int q = 0; q < DQ_COLS / 8; q++) store_vector(partial + q * 512, fragment_quad(q));
        }
        if constexpr (BY_KEYS) hopper::named_barrier(BAR_CONSUMERS, 128 * CONSUMERS);
        if (stores) {
#pragma unroll
            for (int q = 0; q < DQ_COLS / 8; q++) {
                float4 x = fragment_quad(q);
                if constexpr (BY_KEYS) { // x + y is y + x: the same bits whichever consumer adds
                    float4 y = load_vector<float4>(partial + q * 512);
                    x = float4{x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w};
                }
                store_vector(tile + q * 512, x);
            }
            hopper::fence_proxy_async(); // the tile, before the writer's reduction reads it
        }
        if constexpr (BY_KEYS) {
            if (stores) hopper::named_barrier(BAR_CONSUMER + WG, 128);
            if (stores && T == 0) hopper::mbar_arrive(&b.dq_full[buffer]);
        } else {
            hopper::named_barrier(BAR_CONSUMERS, 128 * CONSUMERS);
            if (WG == 0 && T == 0) hopper::mbar_arrive(&b.dq_full[buffer]);
        }
    }
    // Float4 q of this thread's dQ fragments (dq_tile_offset's order).
    __device__ __forceinline__ float4 fragment_quad(int q) const {
        constexpr int half = DQ_COLS / 16; // float4s per C row
        int r = q / half, nt = 2 * (q % half);
        return {dq[nt][2 * r], dq[nt][2 * r + 1], dq[nt + 1][2 * r], dq[nt + 1][2 * r + 1]};
    }
    // After the last step: the end mark for the writer, once it is done with that step.
    __device__ __forceinline__ void finish() {
        if constexpr (ORDERED) {
            if (WG == 0 && (threadIdx.x & 127) == 0) {
                int buffer = steps % L::DQ_BUFFERS;
                hopper::mbar_wait(&b.dq_empty[buffer], ((steps / L::DQ_BUFFERS) & 1) ^ 1);
                b.dq_head[buffer].i0 = -1;
                hopper::mbar_arrive(&b.dq_full[buffer]);
            }
        }
    }
};

template <int D, int WG, bool ORDERED>
__device__ __forceinline__ void consume_steps(const weft_cuda_attention_args &a,
                                              const dkdv_block &b, bf16 *dk, bf16 *dv,
                                              float *dk_part, float *dv_part, float scale,
                                              float scale_log2) {
    using L = dkdv_layout<D, ORDERED>;
    int first = 64 * WG, w = (threadIdx.x >> 5) & 3;
    int key0 = b.j0 + first + 16 * w + (int)((threadIdx.x & 31) >> 2);
    size_t rows = (size_t)first * hopper::ATOM_ROW_BYTES;
    dkdv_consumer<D, WG, ORDERED> c = {b,
                                       b.smem + L::K + rows,
                                       b.smem + L::V + rows,
                                       b.smem + L::DS + rows,
                                       {key0, key0 + 8},
                                       scale_log2, {}, {}, {}, {}, {}, 0};
    hopper::mbar_wait(b.bar.once, 0);
    run_pipeline(c);
    c.finish();
#pragma unroll
    for (int r = 0; r < 2; r++)
        if (c.key[r] < b.j_end)
            store_key_row<D / 8>(a, c.key[r], b.h, r, c.dk, c.dv, scale, dk, dv, dk_part,
                                 dv_part);
}

template <int D, bool ORDERED>
__global__ void __launch_bounds__(THREADS, 1)
    dkdv_kernel(const __grid_constant__ weft_tensor_map q_map,
                const __grid_constant__ weft_tensor_map do_map,
                const __grid_constant__ weft_tensor_map k_map,
                const __grid_constant__ weft_tensor_map v_map, weft_cuda_attention_args a,
                const float *lse, const float *delta, bf16 *dk, bf16 *dv, float *dk_part,
                float *dv_part, dq_sums dq, float scale, float scale_log2) {
    wait_for_earlier_kernels();
    using L = dkdv_layout<D, ORDERED>;
    dkdv_block b;
    b.smem = hopper::align_1024(dynamic_smem<unsigned char>());
    uint64_t *bars = reinterpret_cast<uint64_t *>(b.smem + L::BARRIERS);
    b.bar = {bars, bars + 1, bars + 1 + STAGES};
    b.meta = reinterpret_cast<step_meta *>(b.smem + L::META);
    b.dq_share = reinterpret_cast<float *>(b.smem + L::DQ);
    b.dq_partial = reinterpret_cast<float *>(b.smem + L::PARTIAL);
    b.dq_head = reinterpret_cast<dq_header *>(b.smem + L::DQ_HEADER);
    b.dq_full = bars + 1 + 2 * STAGES, b.dq_empty = b.dq_full + L::DQ_BUFFERS;
    // ORDERED waits for the blocks of later keys: they start first (see write_dq).
    tile_of_head th = block_tile(ORDERED, false);
    b.h = th.head, b.tile = th.tile, b.j0 = th.tile * BLOCK_KEYS;
    b.j_end = min(b.j0 + BLOCK_KEYS, a.Tkv);
    b.dq = dq;
    if (threadIdx.x == 0) {
        init_barriers(b.bar, 32, 4 * CONSUMERS); // full: the producer warp
        if (ORDERED) {
            for (int i = 0; i < L::DQ_BUFFERS; i++) {
                hopper::mbar_init(&b.dq_full[i], 1); // a consumer thread, after both stored
                hopper::mbar_init(&b.dq_empty[i], 1);
            }
            hopper::mbar_init_fence();
        }
    }
    __syncthreads();
    int role = take_role();
    if (role == 0) {
        if (threadIdx.x < 32)
            produce_steps<D, ORDERED>(a, b, &q_map, &do_map, &k_map, &v_map, lse, delta);
        else if (ORDERED && threadIdx.x == 32)
            write_dq<D>(b);
        return;
    }
    as_consumer(role, [&](auto wg) {
        consume_steps<D, decltype(wg)::value, ORDERED>(a, b, dk, dv, dk_part, dv_part, scale,
                                                       scale_log2);
    });
}

// dq (Tq, H, D) bf16 = scale * the ordered kernel's sums, two elements a thread.
__global__ void dq_from_sums_kernel(const float *sums, bf16 *dq, int Tq, int H, int D, int steps,
                                    float scale) {
    wait_for_earlier_kernels();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, pairs = (size_t)Tq * H * D / 2;
    if (i >= pairs) return;
    int col = 2 * (int)(i % (D / 2)), h = (int)(i / (D / 2) % H), row = (int)(i / (D / 2) / H);
    const float *tile = sums + ((size_t)h * steps + row / STEP) * STEP * D;
    float2 x = load_vector<float2>(tile + dq_tile_offset(row % STEP, col, D));
    store_vector(dq + 2 * i, pack_bf16(x.x * scale, x.y * scale));
}

// The ordered kernel's dq_sums: its bytes, and where they are within the scratch, after the mma
// backward's partials.
size_t dq_sums_bytes(const weft_cuda_attention_args *a) {
    size_t steps = (a->Tq + STEP - 1) / STEP;
    return (sizeof(float) * STEP * a->D + sizeof(int)) * a->H * steps;
}
dq_sums dq_sums_in(const weft_cuda_attention_args *a, float *scratch) {
    dq_sums d;
    d.steps = (a->Tq + STEP - 1) / STEP;
    d.sums = scratch + weft_cuda_attention_partials_bytes(a) / sizeof(float);
    d.counts = reinterpret_cast<int *>(d.sums + (size_t)a->H * d.steps * STEP * a->D);
    return d;
}

} // namespace fa3
} // namespace

extern "C" size_t weft_cuda_attention_hopper_scratch_bytes(const weft_cuda_attention_args *a,
                                                           bool ordered_dq) {
    return weft_cuda_attention_partials_bytes(a) + (ordered_dq ? fa3::dq_sums_bytes(a) : 0);
}

extern "C" bool weft_cuda_attention_backward_hopper(weft_cuda_stream s,
                                                    const weft_cuda_attention_args *a,
                                                    const void *q, const void *k, const void *v,
                                                    const float *lse, const void *dout,
                                                    const float *delta, void *dq, void *dk,
                                                    void *dv, float *scratch, bool ordered_dq,
                                                    int rows_at_64) {
    // Boxes: the dQ kernel reads rows in blocks and keys in tiles, the dK/dV kernel the reverse.
    int dq_consumers = fa3::query_block_consumers(a->D, rows_at_64);
    int dq_rows = fa3::block_rows(dq_consumers);
    fa3::qkv_maps dq_maps, dkdv_maps;
    weft_tensor_map do_block, do_step;
    int HD = a->H * a->D;
    if (!fa3::make_qkv_maps(&dkdv_maps, a, q, k, v, fa3::STEP, fa3::BLOCK_KEYS) ||
        !fa3::tensor_map_2d(&do_step, dout, HD, a->Tq, fa3::STEP) ||
        (!ordered_dq && (!fa3::make_qkv_maps(&dq_maps, a, q, k, v, dq_rows, fa3::DQ_KEYS) ||
                         !fa3::tensor_map_2d(&do_block, dout, HD, a->Tq, dq_rows))))
        return false;
    float scale = 1.0f / sqrtf((float)a->D), scale_log2 = scale * LOG2E;
    bool grouped = a->H != a->KV;
    float *dk_part = grouped ? scratch : NULL;
    float *dv_part = grouped ? scratch + (size_t)a->Tkv * a->H * a->D : NULL;
    fa3::dq_sums sums = fa3::dq_sums_in(a, scratch);
    size_t pairs = (size_t)a->Tq * HD / 2;
    if (ordered_dq) cudaMemsetAsync(sums.sums, 0, fa3::dq_sums_bytes(a), s->stream);
    dim3 grid_q((a->Tq + dq_rows - 1) / dq_rows, a->H);
    dim3 grid_kv((a->Tkv + fa3::BLOCK_KEYS - 1) / fa3::BLOCK_KEYS, a->H);
#define DKDV(DIM, ORDERED, LAUNCH)                                                                 \
    do {                                                                                           \
        auto *kernel = fa3::dkdv_kernel<DIM, ORDERED>;                                             \
        size_t smem = fa3::dkdv_layout<DIM, ORDERED>::BYTES;                                       \
        LAUNCH(kernel, grid_kv, fa3::THREADS, smem, s, dkdv_maps.q, do_step, dkdv_maps.k,          \
               dkdv_maps.v, *a, lse, delta, (bf16 *)dk, (bf16 *)dv, dk_part, dv_part, sums, scale, \
               scale_log2);                                                                        \
    } while (0)
#define DQ(DIM, C)                                                                                 \
    WEFT_LAUNCH((fa3::dq_kernel<DIM, C>), grid_q, fa3::block_threads(C),                           \
                (fa3::query_layout<DIM, fa3::DQ_KEYS, 2, C>::BYTES), s, dq_maps.q, do_block,       \
                dq_maps.k, dq_maps.v, *a, lse, delta, (bf16 *)dq, scale, scale_log2)
#define RUN(DIM, DQ_CONSUMERS)                                                                     \
    if (ordered_dq) {                                                                              \
        DKDV(DIM, true, WEFT_LAUNCH_IN_ORDER);                                                     \
        WEFT_LAUNCH(fa3::dq_from_sums_kernel, (unsigned)((pairs + 255) / 256), 256, 0, s,          \
                    (const float *)sums.sums, (bf16 *)dq, a->Tq, a->H, a->D, sums.steps, scale);   \
    } else {                                                                                       \
        DQ(DIM, DQ_CONSUMERS);                                                                     \
        DKDV(DIM, false, WEFT_LAUNCH);                                                             \
    }
    if (a->D == 128) {
        RUN(128, 2);
    } else if (dq_consumers == 3) {
        RUN(64, 3);
    } else {
        RUN(64, 2);
    }
#undef RUN
#undef DQ
#undef DKDV
    if (grouped) sum_groups(s, a, scratch, dk, dv);
    return true;
}
