// The paged KV cache's kernels (DESIGN.md section 11): storing a batch's keys and values into the
// pool's blocks, and causal attention of query rows over their sequence's pooled keys.
//
// Attention is built for decoding, FlashDecoding-style: one or a few query rows per sequence
// against hundreds or thousands of keys, so the time is that of reading K and V.
//  - A block serves one kv head of one sequence and up to NQ query vectors (row, head) that read
//    the same keys: the query heads sharing the kv head (grouped-query attention) and, for a
//    prefill continuation or a speculative check, several rows of the sequence. Each K/V tile is
//    read from the pool once for all of them.
//  - Long sequences are split over several blocks (split-K) of split_keys positions each, so a
//    batch of a few sequences still fills the GPU. A block whose rows see keys past its split
//    writes, per (row, head), its softmax-normalized output and log-sum-exp as fp32 partials,
//    which are combined in split order (deterministic, no float atomics): by the last of the
//    item's blocks to finish (a counter per item, reset by that block, as skinny.cu's column
//    blocks do), or, where the call has more items than counters, by a second kernel. Rows whose
//    keys all lie in the first split are written by that block directly, and with one split (a
//    batch of many sequences) nothing is combined.
//  - In a block each of the 4 warps streams its own tiles of 32 keys (warp w takes tiles w, w + 4,
//    .. of the split) through its own shared memory, with 16-byte cp.async copies straight from
//    the pool's blocks and no barrier between warps, so one warp's copies overlap the others'
//    arithmetic. Scores are lane-per-key against the query vectors in shared memory (fp32); the
//    online softmax keeps a running max per vector and a per-lane sum; P V has each lane own 4
//    dims of one key group. Warps merge their (max, sum, acc) at the end, in warp order.
// Everything accumulates in fp32; bf16 only in the pool, q and out.
//
// On the tensor cores (compute capability 8.0 and up, head_dim 64 or 128: a->tensor_cores), the
// same blocks, warps and tiles multiply with mma.sync instead (attention_mma.cuh's helpers): the
// block's query vectors are the rows of one 16-row A operand held in registers (rows past its
// vectors zero), a warp's key tile the B operand read from shared memory by ldmatrix, so the
// scores of all vectors against 32 keys take 4 x head_dim / 16 mma where each lane had a dot
// product of head_dim per vector; the online softmax runs on the score fragments, and P V takes P
// rounded to bf16, as the training attention does. On an H200 the lane-per-key kernel's
// arithmetic, not its copies, bounded it (a fifth of the bandwidth at batch 256).
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

#include <math.h>

namespace paged {

constexpr int WARPS = 4, THREADS = 32 * WARPS;
constexpr int TILE = 32;              // keys per warp tile: one per lane when scoring
constexpr int BLOCK_KEYS = WARPS * TILE;
constexpr int MAX_VECTORS = 8;        // query vectors (row, head) per block
constexpr int MMA_VECTORS = 16;       // on the tensor cores: the rows of one A operand
// A split never holds fewer keys than this: one tile per warp. At batch 1 on an H200 (256 keys,
// 4 kv heads: 4 blocks) a layer's attention took 17 us with each warp walking two tiles in turn;
// two splits give 8 blocks of one tile a warp, and a combine of 32 (row, head) items.
constexpr int MIN_SPLIT_KEYS = BLOCK_KEYS;
constexpr int TARGET_BLOCKS = 528;    // 4 per SM of an H100 (132 SMs): the split-K goal


// ------------------------------------------------------------------------------ kv_store ----

// A block per row t of k and v (grid-stride over rows), its threads over the row's width in VEC
// elements: rows go to scattered slots, but each row is contiguous on both sides, so 16-byte
// accesses stay coalesced.
template <int VEC>
__global__ void kv_store_kernel(bf16 *pool, int layers, int block_size, int width, int layer,
                                const int32_t *slot, const bf16 *k, const bf16 *v, int T) {
    wait_for_earlier_kernels();
    size_t half = (size_t)block_size * width; // values after keys
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        if (slot[t] < 0) continue; // a padding row
        size_t at = pool_row(layers, block_size, width, slot[t] / block_size, layer,
                             slot[t] % block_size);
        for (int c = threadIdx.x * VEC; c < width; c += blockDim.x * VEC) {
            bf16_vec<VEC> x;
            x.load(k + (size_t)t * width + c);
            x.store(pool + at + c);
            x.load(v + (size_t)t * width + c);
            x.store(pool + at + half + c);
        }
    }
}

// ------------------------------------------------------------------------ the work split ----

// How one call divides its work (the launcher's plan): query vectors into blocks, keys into
// splits.
struct work {
    int heads;       // query heads per block, of one kv head's group
    int rows;        // query rows per block, of one sequence
    int head_blocks; // blocks per kv head (its group of query heads in `heads`)
    int splits;      // blocks per (rows, heads), each over split_keys positions
    int split_keys;
    bool vectorized; // head_dim a multiple of 8 and the pool 16-byte aligned: cp.async copies
    bool mma;        // on the tensor cores (paged_attention_mma_kernel)
};

// Items (sets of up to `rows` rows of one sequence) along the grid's x, times the splits: sequence
// s owns items [first_item(s), first_item(s + 1)), at least ceil(its rows / rows) of them and one
// more at most (which finds no rows); exactly its rows when rows = 1, as in decoding.
__host__ __device__ inline int first_item(int cu_q_s, int s, int rows) {
    return (cu_q_s + s * (rows - 1)) / rows;
}

// The padded layout of a head's dims in shared memory: query rows of DQ
// floats (zeros past D, so the scores can read whole 16-byte chunks), K/V rows of KS bf16 with an
// odd number of 16-byte chunks, so the 8 lanes of each phase of a 16-byte read by lane-per-key
// hit distinct banks.
__host__ __device__ inline int padded_dim(int D) { return (D + 7) / 8 * 8; }
__host__ __device__ inline int tile_stride(int D) { return 8 * ((D + 7) / 8 | 1); }

// Per warp: its key and value tiles (TILE, KS) bf16, probabilities (TILE, NQ) fp32 (16-byte
// aligned, as the tiles' size is a multiple of 16 bytes), and the pool offsets of the tile's keys.
__host__ __device__ inline size_t warp_smem(int D, int nq) {
    return 2 * TILE * tile_stride(D) * sizeof(bf16) + TILE * nq * sizeof(float) +
           TILE * sizeof(size_t);
}
// The query vectors (NQ, DQ) fp32, then the warps' areas. After the key loop the same bytes hold
// the warps' results for the merge (much smaller than their tiles).
__host__ __device__ inline size_t block_smem(int D, int nq) {
    return nq * padded_dim(D) * sizeof(float) + WARPS * warp_smem(D, nq);
}

// Partials of split-K: the log-sum-exp (Tq, H, splits) f32, padded to 16 bytes, then the
// normalized outputs (Tq, H, splits, D) f32.
__host__ __device__ inline size_t partial_lse_floats(int Tq, int H, int splits) {
    return ((size_t)Tq * H * splits + 3) / 4 * 4;
}

// One block's share of the work: rows [r0, r1) of sequence seq, query heads [h0, h0 + n_heads)
// of kv head kvh, key positions [k0, k1) of split `split`.
struct task {
    int seq, r0, r1, kvh, h0, n_heads, split, k0, k1;
};

// The most keys any of the task's rows sees.
__device__ __forceinline__ int task_keys(const weft_cuda_paged_args &a, const task &t) {
    int keys = 0;
    for (int r = t.r0; r < t.r1; r++) keys = max(keys, a.q_pos[r] + 1);
    return keys;
}

// This block's task; false when it has none (an item past its sequence's rows, or a split past
// the keys its rows see).
__device__ bool find_task(const weft_cuda_paged_args &a, const work &w, task *t) {
    int item = blockIdx.x / w.splits, lo = 0, hi = a.n_seqs;
    // A decode step's item is its sequence (one row each): two loads side by side say so, where
    // the search takes log2(sequences) dependent ones.
    if (w.rows == 1 && item < a.n_seqs && a.cu_q[item] == item && a.cu_q[item + 1] == item + 1)
        lo = hi = item;
    while (hi - lo > 1) { // the last sequence whose first item is at most `item`
        int mid = (lo + hi) / 2;
        if (first_item(a.cu_q[mid], mid, w.rows) <= item) lo = mid;
        else hi = mid;
    }
    t->seq = lo;
    t->r0 = a.cu_q[lo] + (item - first_item(a.cu_q[lo], lo, w.rows)) * w.rows;
    t->r1 = min(t->r0 + w.rows, a.cu_q[lo + 1]);
    int group = a.H / a.KV, part = blockIdx.y % w.head_blocks;
    t->kvh = blockIdx.y / w.head_blocks;
    t->h0 = t->kvh * group + part * w.heads;
    t->n_heads = min(w.heads, group - part * w.heads);
    t->split = blockIdx.x % w.splits;
    t->k0 = t->split * w.split_keys;
    t->k1 = min(task_keys(a, *t), t->k0 + w.split_keys);
    return t->k0 < t->k1;
}

// Query vector v of the block: row r0 + v / heads, head h0 + v % heads; false for the slots the
// block does not fill.
__device__ __forceinline__ bool vector_of(const task &t, const work &w, int v, int *row, int *h) {
    *row = t.r0 + v / w.heads;
    *h = t.h0 + v % w.heads;
    return *row < t.r1 && v % w.heads < t.n_heads;
}

// ------------------------------------------------------------------------- one warp tile ----

// Copies positions [t0, t0 + TILE) of kv head kvh (those at or past `end` as zeros) into the
// warp's tiles, K then V as two cp.async groups, so scoring can start before V lands. `rows`
// receives each key's pool offset first, so the copies need no division per chunk.
__device__ void load_tile(const weft_cuda_paged_args &a, const int32_t *table, int layer,
                          int kvh, int t0, int end, bool vectorized, bf16 *Ks, bf16 *Vs,
                          size_t *rows) {
    int lane = threadIdx.x & 31, p = t0 + lane, D = a.D, KS = tile_stride(D);
    rows[lane] = p < end ? pool_row(a.layers, a.block_size, a.width, table[p / a.block_size],
                                    layer, p % a.block_size) + (size_t)kvh * D
                         : SIZE_MAX;
    __syncwarp();
    const bf16 *pool = (const bf16 *)a.pool;
    size_t half = (size_t)a.block_size * a.width; // values after keys
    if (vectorized) { // lane l copies chunk l % chunks of rows l / chunks, + 32 / chunks, ..
        int chunks = D / 8, per_step = 32 / chunks, c = 8 * (lane % chunks);
        for (int kv = 0; kv < 2; kv++) {
            bf16 *dst = kv ? Vs : Ks;
            for (int j = lane / chunks; j < TILE && lane < per_step * chunks; j += per_step) {
                bool valid = rows[j] != SIZE_MAX;
                cp_async16(dst + j * KS + c, valid ? pool + rows[j] + kv * half + c : pool, valid);
            }
            cp_async_commit();
        }
    } else { // one element at a time, zeros past D up to the padded width
        int DQ = padded_dim(D);
        for (int j = 0; j < TILE; j++) {
            bool valid = rows[j] != SIZE_MAX;
            for (int d = lane; d < DQ; d += 32) {
                bool in = valid && d < D;
                Ks[j * KS + d] = in ? pool[rows[j] + d] : to_bf16(0.0f);
                Vs[j * KS + d] = in ? pool[rows[j] + half + d] : to_bf16(0.0f);
            }
        }
        cp_async_commit(); // empty groups: the waits below count the same either way
        cp_async_commit();
    }
}

// s[v] = q_v . k for the key of this lane, over the padded dims (zeros past D on both sides).
template <int NQ>
__device__ __forceinline__ void score_tile(const float *Qs, const bf16 *Ks, int DQ, int KS,
                                           float *s) {
    const bf16 *k = Ks + (threadIdx.x & 31) * KS;
#pragma unroll
    for (int v = 0; v < NQ; v++) s[v] = 0.0f;
    for (int c = 0; c < DQ; c += 8) {
        bf16_vec<8> kc;
        kc.load(k + c);
#pragma unroll
        for (int v = 0; v < NQ; v++) {
            float4 x = load_vector<float4>(Qs + v * DQ + c),
                   y = load_vector<float4>(Qs + v * DQ + c + 4);
            s[v] += x.x * kc.x[0] + x.y * kc.x[1] + x.z * kc.x[2] + x.w * kc.x[3] +
                    y.x * kc.x[4] + y.y * kc.x[5] + y.z * kc.x[6] + y.w * kc.x[7];
        }
    }
}

// Folds the tile's scores (key p = t0 + lane) into each vector's running max m (the warp's),
// per-lane sum l and accumulators, rescaling those to the new max; leaves the probabilities in
// P (TILE, NQ). Vector v sees keys below limit[v].
template <int NQ>
__device__ __forceinline__ void softmax_tile(const float *s, const int *limit, int t0,
                                             float scale, float *m, float *l, float (*acc)[4],
                                             float *P) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int v = 0; v < NQ; v++) {
        if (t0 >= limit[v]) { // the whole tile is past this vector's keys (warp-uniform)
            P[lane * NQ + v] = 0.0f;
            continue;
        }
        bool valid = t0 + lane < limit[v];
        float sv = valid ? s[v] * scale : -INFINITY;
        float m_new = fmaxf(m[v], warp_max(sv)); // finite: key t0 is valid
        float corr = __expf(m[v] - m_new), p = valid ? __expf(sv - m_new) : 0.0f;
        l[v] = l[v] * corr + p;
#pragma unroll
        for (int e = 0; e < 4; e++) acc[v][e] *= corr;
        m[v] = m_new;
        P[lane * NQ + v] = p;
    }
}

// acc[v] += P[j][v] V[j][d0 .. d0 + 3] over this lane's keys j: the lanes form groups of
// `lanes_per_key` (enough to cover the padded dims 4 at a time), group g taking keys g, g + 32 /
// lanes_per_key, ..
template <int NQ>
__device__ __forceinline__ void accumulate_tile(const float *P, const bf16 *Vs, int DQ, int KS,
                                                int lanes_per_key, float (*acc)[4]) {
    int lane = threadIdx.x & 31, d0 = 4 * (lane % lanes_per_key);
    if (d0 >= DQ) return;
    for (int j = lane / lanes_per_key; j < TILE; j += 32 / lanes_per_key) {
        uint2 raw = load_vector<uint2>(Vs + j * KS + d0);
        const bf16 *h = reinterpret_cast<const bf16 *>(&raw);
        float x[4] = {to_f32(h[0]), to_f32(h[1]), to_f32(h[2]), to_f32(h[3])};
        float p[NQ]; // key j's probabilities, 16 bytes at a time where NQ allows
        if constexpr (NQ % 4 == 0) {
#pragma unroll
            for (int i = 0; i < NQ; i += 4) {
                float4 p4 = load_vector<float4>(P + j * NQ + i);
                p[i] = p4.x, p[i + 1] = p4.y, p[i + 2] = p4.z, p[i + 3] = p4.w;
            }
        } else {
#pragma unroll
            for (int v = 0; v < NQ; v++) p[v] = P[j * NQ + v];
        }
#pragma unroll
        for (int v = 0; v < NQ; v++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[v][e] += p[v] * x[e];
    }
}

// ------------------------------------------------------------------------ block results ----

// The warp's totals: l summed over its lanes, acc over its key groups (so that every lane holds
// the sums for its dims), then both stored with m for the merge: ms, ls (WARPS, NQ) and
// accs (WARPS, NQ, DQ).
template <int NQ>
__device__ void store_warp_result(const float *m, float *l, float (*acc)[4], int DQ,
                                  int lanes_per_key, float *ms, float *ls, float *accs) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d0 = 4 * lane;
#pragma unroll
    for (int v = 0; v < NQ; v++) {
        l[v] = warp_sum(l[v]);
        for (int o = 16; o >= lanes_per_key; o >>= 1)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[v][e] += __shfl_xor_sync(0xffffffffu, acc[v][e], o);
    }
    if (lane == 0)
#pragma unroll
        for (int v = 0; v < NQ; v++) {
            ms[warp * NQ + v] = m[v];
            ls[warp * NQ + v] = l[v];
        }
    if (lane < lanes_per_key && d0 < DQ)
#pragma unroll
        for (int v = 0; v < NQ; v++)
#pragma unroll
            for (int e = 0; e < 4; e++) accs[(warp * NQ + v) * DQ + d0 + e] = acc[v][e];
}

// Merges the warps' results, in warp order, for each (vector, dim) of the block and writes them:
// to out and lse where the row's keys all lie in the first split, else to this split's partials.
// Rows that see no key of this split write nothing.
template <int NQ>
__device__ void write_block_result(const weft_cuda_paged_args &a, const work &w, const task &t,
                                   const float *ms, const float *ls, const float *accs,
                                   bf16 *out, float *lse, float *partials) {
    int D = a.D, DQ = padded_dim(D);
    for (int idx = threadIdx.x; idx < NQ * DQ; idx += THREADS) {
        int v = idx / DQ, d = idx - v * DQ, row, h;
        if (d >= D || !vector_of(t, w, v, &row, &h)) continue;
        int pos = a.q_pos[row];
        if (pos < t.k0) continue;
        float M = -INFINITY, L = 0.0f, o = 0.0f;
        for (int wp = 0; wp < WARPS; wp++) M = fmaxf(M, ms[wp * NQ + v]);
        for (int wp = 0; wp < WARPS; wp++) {
            float e = __expf(ms[wp * NQ + v] - M); // 0 for a warp that saw none of its keys
            L += e * ls[wp * NQ + v];
            o += e * accs[(wp * NQ + v) * DQ + d];
        }
        size_t item = (size_t)row * a.H + h;
        if (pos < w.split_keys) {
            out[item * D + d] = to_bf16(o / L);
            if (d == 0) lse[(size_t)h * a.Tq + row] = M + logf(L);
        } else {
            size_t at = item * w.splits + t.split;
            partials[partial_lse_floats(a.Tq, a.H, w.splits) + at * D + d] = o / L;
            if (d == 0) partials[at] = M + logf(L);
        }
    }
}

// The combine of one (row, head)'s n partials by one warp, in split order: lse = log sum_k
// exp(lse_k), out = sum_k exp(lse_k - lse) out_k. Partials are read from L2 (__ldcg): the last
// block of an item reads what other blocks of its launch wrote, and this SM's L1 may hold a
// stale copy of their lines from another item's combine.
__device__ __forceinline__ void combine_vector(const float *part_lse, const float *part_out,
                                               int n, int D, bf16 *out, float *lse) {
    int lane = threadIdx.x & 31;
    float M = -INFINITY, L = 0.0f;
    for (int k = 0; k < n; k++) M = fmaxf(M, __ldcg(&part_lse[k]));
    for (int k = 0; k < n; k++) L += __expf(__ldcg(&part_lse[k]) - M);
    float total = M + logf(L);
    for (int d = lane; d < D; d += 32) {
        float o = 0.0f;
        for (int k = 0; k < n; k++)
            o += __expf(__ldcg(&part_lse[k]) - total) * __ldcg(&part_out[(size_t)k * D + d]);
        out[d] = to_bf16(o);
    }
    if (lane == 0) *lse = total;
}

// Split-K's combine for (row, head), whose keys span n = pos / split_keys + 1 splits: where
// n > 1, combine_vector of its partials (n = 1: written by its block).
__device__ __forceinline__ void combine_partials(const weft_cuda_paged_args &a, const work &w,
                                                 int row, int h, const float *partials,
                                                 bf16 *out, float *lse) {
    int D = a.D, n = a.q_pos[row] / w.split_keys + 1;
    if (n == 1) return;
    size_t item = (size_t)row * a.H + h;
    combine_vector(partials + item * w.splits,
                   partials + partial_lse_floats(a.Tq, a.H, w.splits) + item * w.splits * D, n,
                   D, out + item * D, lse + (size_t)h * a.Tq + row);
}

// The last block of a task's item combines every vector of the task, a warp a vector. Not
// inlined, and given the task and the arguments rather than holding them: inlined into the
// attention kernel it spilled at 96 registers.
template <int NQ>
__device__ __attribute__((noinline)) void combine_task(weft_cuda_paged_args a, work w, task t,
                                                       const float *partials, bf16 *out,
                                                       float *lse) {
    for (int v = threadIdx.x >> 5; v < NQ; v += WARPS) {
        int row, h;
        if (vector_of(t, w, v, &row, &h)) combine_partials(a, w, row, h, partials, out, lse);
    }
}

// With arrival counters (a counter per item along x and kv head part along y, zero between
// launches), after the block's results: the block counts itself in among its item's blocks
// with work (those of the first ceil(keys / split_keys) splits), and the last to arrive combines
// every vector of the item from the partials the others made visible first.
template <int NQ>
__device__ void combine_if_last(const weft_cuda_paged_args &a, const work &w, const task &t,
                                const float *partials, bf16 *out, float *lse, int *arrived) {
    int with_work = (task_keys(a, t) - 1) / w.split_keys + 1; // (recounted: one register less)
    if (with_work == 1) return; // its rows were written directly
    __shared__ bool last;
    int *counter = arrived + (size_t)(blockIdx.x / w.splits) * gridDim.y + blockIdx.y;
    __threadfence(); // this block's partials are visible before it counts itself in
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == with_work - 1;
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) *counter = 0; // every block of the item is in: for the next launch
    __threadfence(); // the other blocks' partials, which they made visible before counting
    combine_task<NQ>(a, w, t, partials, out, lse);
}

// Both kernels' end, once the warps' results are merged in shared memory: the block's outputs or
// partials, and with counters the combine where this block is its item's last.
template <int NQ>
__device__ __forceinline__ void finish_block(const weft_cuda_paged_args &a, const work &w,
                                             const task &t, const float *ms, const float *ls,
                                             const float *accs, bf16 *out, float *lse,
                                             float *partials, int *arrived) {
    write_block_result<NQ>(a, w, t, ms, ls, accs, out, lse, partials);
    if (!arrived) return;
    task again; // found anew: the task's fields held through the key loop spill at 96
    find_task(a, w, &again);
    combine_if_last<NQ>(a, w, again, partials, out, lse, arrived);
}

// ---------------------------------------------------------------------------- the kernels ----

// Causal attention of the block's query vectors over the key positions of its split (see the
// file's comment). q (Tq, H, D), out (Tq, H, D) bf16; lse (H, Tq) f32. A warp's tiles are a
// chain of dependent waits (the block table, the copies, the scores), so the kernel runs at the
// rate of the warps resident at once: at batch 256 on an H200 (1,024 blocks, head_dim 64, 44 KB
// of shared memory each) it read the pool at a fifth of the bandwidth with 3 blocks an SM, which
// 166 registers a thread allowed. Five, what the shared memory allows at head_dim 64 on sm_90
// (two at 128), cap them at 96, which ptxas fits without spilling once the vectors' key limits
// live in shared memory.
template <int NQ>
__global__ void __launch_bounds__(THREADS, 5)
    paged_attention_kernel(weft_cuda_paged_args a, work w, int layer, const bf16 *q, bf16 *out,
                           float *lse, float *partials, int *arrived) {
    wait_for_earlier_kernels();
    task t;
    if (!find_task(a, w, &t)) return;
    int D = a.D, DQ = padded_dim(D), KS = tile_stride(D), warp = threadIdx.x >> 5;
    int lanes_per_key = 2; // a power of two covering DQ / 4 dims
    while (4 * lanes_per_key < DQ) lanes_per_key *= 2;
    float *Qs = dynamic_smem<float>(); // (NQ, DQ)
    unsigned char *mine = (unsigned char *)(Qs + NQ * DQ) + warp * warp_smem(D, NQ);
    bf16 *Ks = (bf16 *)mine, *Vs = Ks + TILE * KS;
    float *P = (float *)(Vs + TILE * KS);
    size_t *rows = (size_t *)(P + TILE * NQ);

    // Vector v sees positions below limit[v] of this split: in shared memory, as registers held
    // through the key loop would spill.
    __shared__ int limit[NQ];
    if (threadIdx.x < NQ) {
        int row, h, v = threadIdx.x;
        limit[v] = vector_of(t, w, v, &row, &h) ? min(a.q_pos[row] + 1, t.k1) : 0;
    }
    for (int idx = threadIdx.x; idx < NQ * DQ; idx += THREADS) {
        int v = idx / DQ, d = idx - v * DQ, row, h;
        bool in = vector_of(t, w, v, &row, &h) && d < D;
        Qs[idx] = in ? to_f32(q[((size_t)row * a.H + h) * D + d]) : 0.0f;
    }
    __syncthreads();

    float m[NQ], l[NQ], acc[NQ][4], scale = 1.0f / sqrtf((float)D);
#pragma unroll
    for (int v = 0; v < NQ; v++) {
        m[v] = -INFINITY;
        l[v] = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; e++) acc[v][e] = 0.0f;
    }
    const int32_t *table = a.block_tables + (size_t)t.seq * a.max_blocks;
    for (int t0 = t.k0 + warp * TILE; t0 < t.k1; t0 += BLOCK_KEYS) {
        __syncwarp(); // every lane is done with the previous tile
        load_tile(a, table, layer, t.kvh, t0, t.k1, w.vectorized, Ks, Vs, rows);
        cp_async_wait<1>(); // K
        __syncwarp();
        float s[NQ];
        score_tile<NQ>(Qs, Ks, DQ, KS, s);
        softmax_tile<NQ>(s, limit, t0, scale, m, l, acc, P);
        cp_async_wait<0>(); // V
        __syncwarp();
        accumulate_tile<NQ>(P, Vs, DQ, KS, lanes_per_key, acc);
    }
    __syncthreads(); // every warp is done with its tiles: the merge reuses their memory
    float *ms = dynamic_smem<float>(), *ls = ms + WARPS * NQ, *accs = ls + WARPS * NQ;
    store_warp_result<NQ>(m, l, acc, DQ, lanes_per_key, ms, ls, accs);
    __syncthreads();
    finish_block<NQ>(a, w, t, ms, ls, accs, out, lse, partials, arrived);
}

// ------------------------------------------------------------------- on the tensor cores ----

// Per warp of the tensor-core kernel: its key and value tiles (TILE, D + 8) bf16 (the padding of
// tile_stride, which keeps ldmatrix's rows in distinct banks) and the tile's pool offsets.
__host__ __device__ inline size_t mma_warp_smem(int D) {
    return 2 * TILE * tile_stride(D) * sizeof(bf16) + TILE * sizeof(size_t);
}
// The warps' areas; after the key loop the same bytes hold their results for the merge.
__host__ __device__ inline size_t mma_block_smem(int D, int nq) {
    size_t merge = sizeof(float) * (2 * WARPS * nq + (size_t)WARPS * nq * D);
    size_t tiles = WARPS * mma_warp_smem(D);
    return tiles > merge ? tiles : merge;
}

// This thread's two rows of the 16-row A operand (g and g + 8, lane = 4 g + t): query vector v
// = that row where v < NQ and the block fills it. Its query, as A fragments (zeros otherwise),
// and the keys [lo, hi) of the split it sees (none otherwise).
template <int NQ, int DK>
__device__ __forceinline__ void query_rows(const weft_cuda_paged_args &a, const work &w,
                                           const task &t, const bf16 *q, uint32_t (*qf)[4],
                                           int lo[2], int hi[2]) {
    constexpr int D = 16 * DK;
    int g = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
    const bf16 *at[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int v = g + 8 * r, row, h;
        bool mine = v < NQ && vector_of(t, w, v, &row, &h);
        at[r] = mine ? q + ((size_t)row * a.H + h) * D + 2 * tq : nullptr;
        lo[r] = t.k0;
        hi[r] = mine ? min(a.q_pos[row] + 1, t.k1) : t.k0;
    }
#pragma unroll
    for (int kc = 0; kc < DK; kc++) {
        qf[kc][0] = at[0] ? load_u32(at[0] + 16 * kc) : 0u;
        qf[kc][1] = at[1] ? load_u32(at[1] + 16 * kc) : 0u;
        qf[kc][2] = at[0] ? load_u32(at[0] + 16 * kc + 8) : 0u;
        qf[kc][3] = at[1] ? load_u32(at[1] + 16 * kc + 8) : 0u;
    }
}

// The warp's (max, sum, output) of each of its rows that is a vector, in the layout of
// store_warp_result (max in natural-log units, as the merge takes it): ms, ls (WARPS, NQ) and
// accs (WARPS, NQ, D).
template <int NQ, int NO>
__device__ void store_fragment_result(const float m[2], const float l[2], const float (*o)[4],
                                      float *ms, float *ls, float *accs) {
    constexpr int D = 8 * NO;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = quad_sum(l[r]); // every lane: the shuffles take the whole warp
        int v = g + 8 * r;
        if (v >= NQ) continue;
        if (tq == 0) {
            ms[warp * NQ + v] = m[r] == -INFINITY ? -INFINITY : m[r] * LN2;
            ls[warp * NQ + v] = sum;
        }
        float *dst = accs + (size_t)(warp * NQ + v) * D + 2 * tq;
#pragma unroll
        for (int no = 0; no < NO; no++) dst[8 * no] = o[no][2 * r], dst[8 * no + 1] = o[no][2 * r + 1];
    }
}

// paged_attention_kernel's work on the tensor cores, for head_dim 16 DK (64 or 128): the same
// task, tiles, merge and combine. The output fragments' registers (ptxas: at most 128 at head_dim
// 64, 167 at 128, no spills) allow four blocks an SM and three; two with 16 vectors at 128, whose
// second 8 rows' pointers and key limits spilled at three.
template <int NQ, int DK>
__global__ void __launch_bounds__(THREADS, DK <= 4 ? 4 : NQ <= 8 ? 3 : 2)
    paged_attention_mma_kernel(weft_cuda_paged_args a, work w, int layer, const bf16 *q,
                               bf16 *out, float *lse, float *partials, int *arrived) {
    wait_for_earlier_kernels();
    constexpr int D = 16 * DK, NT = TILE / 8, NO = D / 8;
    task t;
    if (!find_task(a, w, &t)) return;
    int warp = threadIdx.x >> 5, KS = tile_stride(D);
    unsigned char *mine = dynamic_smem<unsigned char>() + warp * mma_warp_smem(D);
    bf16 *Ks = (bf16 *)mine, *Vs = Ks + TILE * KS;
    size_t *rows = (size_t *)(Vs + TILE * KS);
    uint32_t qf[1][DK][4];
    int lo[1][2], hi[1][2];
    query_rows<NQ, DK>(a, w, t, q, qf[0], lo[0], hi[0]);
    float o[1][NO][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float scale_log2 = LOG2E / sqrtf((float)D);
    const int32_t *table = a.block_tables + (size_t)t.seq * a.max_blocks;
    for (int t0 = t.k0 + warp * TILE; t0 < t.k1; t0 += BLOCK_KEYS) {
        __syncwarp(); // every lane is done with the previous tile
        load_tile(a, table, layer, t.kvh, t0, t.k1, true, Ks, Vs, rows);
        cp_async_wait<1>(); // K
        __syncwarp();
        float s[1][NT][4];
        product_a_regs<1, NT, DK>(s, qf, Ks, KS);
        mask_scores<1, NT>(s, t0, lo, hi);
        online_softmax<NT, NO>(s[0], m, l, o[0], scale_log2);
        cp_async_wait<0>(); // V
        __syncwarp();
        accumulate_c_times<1, NT / 2, NO>(o, s, Vs, KS);
    }
    __syncthreads(); // every warp is done with its tiles: the merge reuses their memory
    float *ms = dynamic_smem<float>(), *ls = ms + WARPS * NQ, *accs = ls + WARPS * NQ;
    store_fragment_result<NQ, NO>(m, l, o[0], ms, ls, accs);
    __syncthreads();
    finish_block<NQ>(a, w, t, ms, ls, accs, out, lse, partials, arrived);
}

// Split-K's second pass where the call has no counters: a warp per (row, head).
__global__ void paged_combine_kernel(weft_cuda_paged_args a, work w, const float *partials,
                                     bf16 *out, float *lse) {
    wait_for_earlier_kernels();
    size_t item = (size_t)blockIdx.x * WARPS + (threadIdx.x >> 5); // row * H + h
    if (item >= (size_t)a.Tq * a.H) return;
    combine_partials(a, w, (int)(item / a.H), (int)(item % a.H), partials, out, lse);
}

// ------------------------------------------------------------------------------ the plan ----

static int smallest_power_of_two(int n) { // at least n
    int p = 1;
    while (p < n) p *= 2;
    return p;
}

// The call's work split (see `work`), and in *nq the query vectors per block: the group's heads
// (up to MAX_VECTORS, or MMA_VECTORS on the tensor cores, where they fill one A operand: two
// rows of eight heads where a prefill continuation or a speculative check reads the keys once for
// both) times the rows a sequence has on average, rounded up to a power of two. The
// splits aim at TARGET_BLOCKS blocks in all, each over at least MIN_SPLIT_KEYS of the longest
// possible sequence (the block tables' width), unless a->split_keys fixes the split size.
static work plan(const weft_cuda_paged_args *a, int *nq) {
    int group = a->H / a->KV, rows_each = (a->Tq + a->n_seqs - 1) / a->n_seqs;
    work w;
    w.vectorized = vector_width(a->D, a->pool) == 8;
    w.mma = a->tensor_cores && w.vectorized && (a->D == 64 || a->D == 128);
    int max_vectors = w.mma ? MMA_VECTORS : MAX_VECTORS;
    w.heads = group < max_vectors ? group : max_vectors;
    int vectors = w.heads * rows_each;
    *nq = smallest_power_of_two(vectors < max_vectors ? vectors : max_vectors);
    w.rows = *nq / w.heads;
    w.head_blocks = (group + w.heads - 1) / w.heads;
    long blocks = (long)first_item(a->Tq, a->n_seqs, w.rows) * a->KV * w.head_blocks;
    int max_keys = a->max_blocks * a->block_size > 0 ? a->max_blocks * a->block_size : 1;
    w.split_keys = a->split_keys;
    if (w.split_keys <= 0) {
        long wanted = (TARGET_BLOCKS + blocks - 1) / blocks;
        long most = (max_keys + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS;
        int splits = (int)(wanted < most ? wanted : most);
        if (splits < 1) splits = 1;
        int keys = (max_keys + splits - 1) / splits;
        w.split_keys = (keys + BLOCK_KEYS - 1) / BLOCK_KEYS * BLOCK_KEYS;
    }
    w.splits = (max_keys + w.split_keys - 1) / w.split_keys;
    return w;
}

} // namespace paged

// -------------------------------------------------------------------------------- launchers ----

extern "C" void weft_cuda_kv_store(weft_cuda_stream s, void *pool, int layers, int block_size,
                                   int width, int layer, const int32_t *slot, const void *k,
                                   const void *v, int T) {
    if (T == 0) return;
    int vec = vector_width(width, pool, k, v), steps = (width / vec + 31) / 32;
    unsigned threads = 32 * (steps < 4 ? steps : 4), blocks = T < 65536 ? T : 65536;
    WEFT_LAUNCH_VECTORIZED(paged::kv_store_kernel, vec, blocks, threads, 0, s, (bf16 *)pool,
                           layers, block_size, width, layer, slot, (const bf16 *)k,
                           (const bf16 *)v, T);
}

extern "C" size_t weft_cuda_paged_partials_bytes(const weft_cuda_paged_args *a) {
    if (a->Tq == 0) return 0;
    int nq;
    paged::work w = paged::plan(a, &nq);
    if (w.splits == 1) return 0;
    return sizeof(float) * (paged::partial_lse_floats(a->Tq, a->H, w.splits) +
                            (size_t)a->Tq * a->H * w.splits * a->D);
}

extern "C" void weft_cuda_paged_attention(weft_cuda_stream s, const weft_cuda_paged_args *a,
                                          int layer, const void *q, void *out, float *lse,
                                          float *partials, int *arrived) {
    if (a->Tq == 0) return;
    int nq;
    paged::work w = paged::plan(a, &nq);
    int items = paged::first_item(a->Tq, a->n_seqs, w.rows);
    dim3 grid(items * w.splits, a->KV * w.head_blocks);
    // Counters for the last block of each item to combine its splits, where there are enough.
    if (w.splits == 1 || (long)items * grid.y > WEFT_CUDA_ARRIVAL_COUNTERS) arrived = NULL;
    size_t smem = w.mma ? paged::mma_block_smem(a->D, nq) : paged::block_smem(a->D, nq);
#define LAUNCH(KERNEL)                                                                             \
    WEFT_LAUNCH(KERNEL, grid, paged::THREADS, smem, s, *a, w, layer, (const bf16 *)q,              \
                (bf16 *)out, lse, partials, arrived)
#define LAUNCH_NQ(NQ)                                                                              \
    if (!w.mma) LAUNCH(paged::paged_attention_kernel<NQ>);                                         \
    else if (a->D == 64) LAUNCH((paged::paged_attention_mma_kernel<NQ, 4>));                       \
    else LAUNCH((paged::paged_attention_mma_kernel<NQ, 8>));
    switch (nq) {
    case 1: LAUNCH_NQ(1); break;
    case 2: LAUNCH_NQ(2); break;
    case 4: LAUNCH_NQ(4); break;
    case 8: LAUNCH_NQ(8); break;
    default: // 16: the tensor cores only
        if (a->D == 64) LAUNCH((paged::paged_attention_mma_kernel<16, 4>));
        else LAUNCH((paged::paged_attention_mma_kernel<16, 8>));
    }
#undef LAUNCH_NQ
#undef LAUNCH
    if (w.splits == 1 || arrived) return;
    unsigned blocks = (unsigned)(((size_t)a->Tq * a->H + paged::WARPS - 1) / paged::WARPS);
    WEFT_LAUNCH(paged::paged_combine_kernel, blocks, paged::THREADS, 0, s, *a, w, partials,
                (bf16 *)out, lse);
}
