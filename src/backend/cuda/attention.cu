// Varlen causal attention over packed documents with grouped-query heads, flash-attention style:
// keys and values stream through shared memory in tiles of 32, softmax is computed online, and
// nothing of size (T, T) is ever stored. Backward recomputes probabilities from the saved
// log-sum-exp (FlashAttention-2): one kernel walks query rows to build dQ, another walks key
// tiles to build dK and dV, so every output is written by exactly one block, without atomics.
//
// Work split inside a warp: for scores, lane j owns key j of the tile and computes whole dot
// products (rows of the key tile are padded by one float, so the 32 lanes hit 32 banks); for
// outputs, lane l owns dims l, l+32, ... of the head. A warp serves ROWS query rows at once, so
// each key tile read from memory feeds ROWS rows.
//
// Masking is per (row, key): query row i of document d sees keys cu_kv[d] + [0, q_pos[i]]. A warp
// whose rows straddle documents scans the union of their key ranges; the mask keeps them apart.
// This one rule covers whole documents (keys = queries) and context-parallel chunks (queries are
// two chunks of a document, keys the whole gathered document) alike.
#include "backend/cuda/attention.cuh"
#include "backend/cuda/common.cuh"

#include <limits.h>
#include <math.h>

enum { TILE = 32, ROWS = 8 };

// Loads key rows [j0, j0 + TILE) of kv head g (rows past `end` as zeros) into a padded tile.
__device__ void load_tile(float *dst, const bf16 *src, int j0, int end, int g, int KV, int D) {
    int stride = D + 1, lane = threadIdx.x;
    for (int idx = lane; idx < TILE * D; idx += 32) {
        int jj = idx / D, d = idx - jj * D, j = j0 + jj;
        dst[jj * stride + d] = j < end ? to_f32(src[((size_t)j * KV + g) * D + d]) : 0.0f;
    }
}

// The next key and value tiles, once every lane is done with the previous ones.
__device__ void load_kv_tiles(float *Ks, float *Vs, const bf16 *k, const bf16 *v, int j0, int end,
                              int g, int KV, int D) {
    __syncwarp();
    load_tile(Ks, k, j0, end, g, KV, D);
    load_tile(Vs, v, j0, end, g, KV, D);
    __syncwarp();
}

// Loads query-side rows r0 .. r0+ROWS-1 of head h (missing rows as zeros), times `scale`.
__device__ void load_rows(float *dst, const bf16 *src, int r0, int Tq, int h, int H, int D,
                          float scale) {
    for (int idx = threadIdx.x; idx < ROWS * D; idx += 32) {
        int r = idx / D, d = idx - r * D, row = r0 + r;
        dst[idx] = row < Tq ? to_f32(src[((size_t)row * H + h) * D + d]) * scale : 0.0f;
    }
}

// Each of the warp's rows: the key range it sees, [lo, hi); empty for rows past Tq. Returns the
// union's bounds.
__device__ void key_ranges(const weft_cuda_attention_args &a, int r0, int *lo, int *hi,
                           int *union_lo, int *union_hi) {
    *union_lo = INT_MAX;
    *union_hi = 0;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        row_key_range(a, r0 + r, &lo[r], &hi[r]);
        if (hi[r] > lo[r]) {
            *union_lo = min(*union_lo, lo[r]);
            *union_hi = max(*union_hi, hi[r]);
        }
    }
}

// dots[r] = rows[r] . tile[lane] for the warp's ROWS rows (lane-per-key).
__device__ void row_dots(const float *rows, const float *tile, int D, float *dots) {
    const float *t = tile + threadIdx.x * (D + 1);
#pragma unroll
    for (int r = 0; r < ROWS; r++) dots[r] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d++) {
        float td = t[d];
#pragma unroll
        for (int r = 0; r < ROWS; r++) dots[r] += rows[r * D + d] * td;
    }
}

// acc[r][c] += sum_jj weights[r][jj] * tile[jj][lane + 32 c] over the tile's first n keys.
template <int NC>
__device__ void accumulate_rows(float (*acc)[NC], const float *weights, const float *tile, int n,
                                int D) {
    int lane = threadIdx.x, stride = D + 1;
    for (int jj = 0; jj < n; jj++) {
        const float *t = tile + jj * stride;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float w = weights[r * TILE + jj];
#pragma unroll
            for (int c = 0; c < NC; c++)
                if (lane + 32 * c < D) acc[r][c] += w * t[lane + 32 * c];
        }
    }
}

// Stores acc[r] * factor[r] as bf16 into rows r0 + r of head h (rows past Tq are not there).
template <int NC>
__device__ void store_rows(bf16 *dst, float (*acc)[NC], const float *factor, int r0, int Tq, int h,
                           int H, int D) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int row = r0 + r;
        if (row >= Tq) continue;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int d = threadIdx.x + 32 * c;
            if (d < D) dst[((size_t)row * H + h) * D + d] = to_bf16(acc[r][c] * factor[r]);
        }
    }
}

// ------------------------------------------------------------------------------- forward ----

template <int NC>
__global__ void attention_forward_kernel(weft_cuda_attention_args a, const bf16 *q, const bf16 *k,
                                         const bf16 *v, bf16 *out, float *lse, float scale) {
    wait_for_earlier_kernels();
    float *smem = dynamic_smem<float>();
    int D = a.D, lane = threadIdx.x;
    float *Ks = smem, *Vs = Ks + TILE * (D + 1), *Qs = Vs + TILE * (D + 1), *Ps = Qs + ROWS * D;
    int h = blockIdx.y, g = h / (a.H / a.KV), r0 = blockIdx.x * ROWS;
    int lo[ROWS], hi[ROWS], union_lo, union_hi;
    key_ranges(a, r0, lo, hi, &union_lo, &union_hi);
    load_rows(Qs, q, r0, a.Tq, h, a.H, D, scale);

    float m[ROWS], l[ROWS], acc[ROWS][NC];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) acc[r][c] = 0.0f;
    }
    for (int j0 = union_lo; j0 < union_hi; j0 += TILE) {
        load_kv_tiles(Ks, Vs, k, v, j0, union_hi, g, a.KV, D);
        float s[ROWS];
        row_dots(Qs, Ks, D, s);
        int j = j0 + lane;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            bool valid = j >= lo[r] && j < hi[r];
            float sr = valid ? s[r] : -INFINITY;
            float m_new = fmaxf(m[r], warp_max(sr));
            float p = valid ? __expf(sr - m_new) : 0.0f;
            float corr = m[r] == -INFINITY ? 0.0f : __expf(m[r] - m_new);
            if (m_new == -INFINITY) corr = 1.0f; // nothing seen yet: keep the zeros
            l[r] = l[r] * corr + warp_sum(p);
#pragma unroll
            for (int c = 0; c < NC; c++) acc[r][c] *= corr;
            m[r] = m_new;
            Ps[r * TILE + lane] = p;
        }
        __syncwarp();
        accumulate_rows<NC>(acc, Ps, Vs, min(TILE, union_hi - j0), D);
    }
    float inv[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        if (lane == 0 && r0 + r < a.Tq) lse[(size_t)h * a.Tq + r0 + r] = m[r] + logf(l[r]);
    }
    store_rows<NC>(out, acc, inv, r0, a.Tq, h, a.H, D);
}

// ------------------------------------------------------------------------------ backward ----

// delta (H, Tq) = rowsum(dO * O) per head, in fp32: one warp per (row, head).
__global__ void attention_delta_kernel(const bf16 *out, const bf16 *dout, float *delta, int Tq,
                                       int H, int D) {
    wait_for_earlier_kernels();
    int lane = threadIdx.x & 31;
    size_t item = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); // row * H + h
    if (item >= (size_t)Tq * H) return;
    const bf16 *o = out + item * D, *dout_row = dout + item * D;
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += to_f32(o[d]) * to_f32(dout_row[d]);
    acc = warp_sum(acc);
    if (lane == 0) delta[(size_t)(item % H) * Tq + item / H] = acc;
}

// dQ of ROWS rows of one head: ds = p (dO.v - delta), dq = scale * sum_j ds_j k_j.
template <int NC>
__global__ void attention_dq_kernel(weft_cuda_attention_args a, const bf16 *q, const bf16 *k,
                                    const bf16 *v, const float *lse, const bf16 *dout,
                                    const float *delta, bf16 *dq, float scale) {
    wait_for_earlier_kernels();
    float *smem = dynamic_smem<float>();
    int D = a.D, lane = threadIdx.x;
    float *Ks = smem, *Vs = Ks + TILE * (D + 1), *Qs = Vs + TILE * (D + 1);
    float *dOs = Qs + ROWS * D, *dSs = dOs + ROWS * D;
    int h = blockIdx.y, g = h / (a.H / a.KV), r0 = blockIdx.x * ROWS;
    int lo[ROWS], hi[ROWS], union_lo, union_hi;
    key_ranges(a, r0, lo, hi, &union_lo, &union_hi);
    load_rows(Qs, q, r0, a.Tq, h, a.H, D, scale);
    load_rows(dOs, dout, r0, a.Tq, h, a.H, D, 1.0f);
    float row_lse[ROWS], row_delta[ROWS], acc[ROWS][NC];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int row = min(r0 + r, a.Tq - 1);
        row_lse[r] = lse[(size_t)h * a.Tq + row];
        row_delta[r] = delta[(size_t)h * a.Tq + row];
#pragma unroll
        for (int c = 0; c < NC; c++) acc[r][c] = 0.0f;
    }
    for (int j0 = union_lo; j0 < union_hi; j0 += TILE) {
        load_kv_tiles(Ks, Vs, k, v, j0, union_hi, g, a.KV, D);
        float s[ROWS], dp[ROWS];
        row_dots(Qs, Ks, D, s);
        row_dots(dOs, Vs, D, dp);
        int j = j0 + lane;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            bool valid = j >= lo[r] && j < hi[r];
            float p = valid ? __expf(s[r] - row_lse[r]) : 0.0f;
            dSs[r * TILE + lane] = p * (dp[r] - row_delta[r]);
        }
        __syncwarp();
        accumulate_rows<NC>(acc, dSs, Ks, min(TILE, union_hi - j0), D);
    }
    float factor[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) factor[r] = scale;
    store_rows<NC>(dq, acc, factor, r0, a.Tq, h, a.H, D);
}

// dK and dV of one tile of keys of kv head g, summed over the query heads that share it and the
// query rows that see the keys. Lane j accumulates key j's gradients in shared memory.
__global__ void attention_dkdv_kernel(weft_cuda_attention_args a, const bf16 *q, const bf16 *k,
                                      const bf16 *v, const float *lse, const bf16 *dout,
                                      const float *delta, bf16 *dk, bf16 *dv, float scale) {
    wait_for_earlier_kernels();
    float *smem = dynamic_smem<float>();
    int D = a.D, stride = D + 1, lane = threadIdx.x;
    float *Ks = smem, *Vs = Ks + TILE * stride;
    float *dKs = Vs + TILE * stride, *dVs = dKs + TILE * stride;
    float *qi = dVs + TILE * stride, *doi = qi + D;
    int g = blockIdx.y, group = a.H / a.KV, j0 = blockIdx.x * TILE;
    int end = min(j0 + TILE, a.Tkv);
    load_tile(Ks, k, j0, end, g, a.KV, D);
    load_tile(Vs, v, j0, end, g, a.KV, D);
    for (int idx = lane; idx < TILE * stride; idx += 32) dKs[idx] = dVs[idx] = 0.0f;
    // This lane's key: its document and its offset (position) inside it.
    int j = j0 + lane;
    int doc_j = j < a.Tkv ? find_doc(a.cu_kv, a.n_docs, j) : -1;
    int off_j = doc_j >= 0 ? j - a.cu_kv[doc_j] : INT_MAX;
    int first_doc = find_doc(a.cu_kv, a.n_docs, j0);
    int last_doc = find_doc(a.cu_kv, a.n_docs, end - 1);
    int row_lo = a.cu_q[first_doc], row_hi = a.cu_q[last_doc + 1];
    __syncwarp();
    const float *kj = Ks + lane * stride, *vj = Vs + lane * stride;
    float *dkj = dKs + lane * stride, *dvj = dVs + lane * stride;
    for (int hh = 0; hh < group; hh++) {
        int h = g * group + hh;
        int doc_i = first_doc;
        for (int i = row_lo; i < row_hi; i++) {
            while (i >= a.cu_q[doc_i + 1]) doc_i++;
            int pos_i = a.q_pos[i];
            bool valid = doc_i == doc_j && pos_i >= off_j;
            if (!__any_sync(0xffffffffu, valid)) continue;
            __syncwarp();
            for (int d = lane; d < D; d += 32) {
                qi[d] = to_f32(q[((size_t)i * a.H + h) * D + d]);
                doi[d] = to_f32(dout[((size_t)i * a.H + h) * D + d]);
            }
            __syncwarp();
            float s = 0.0f, dp = 0.0f;
#pragma unroll 4
            for (int d = 0; d < D; d++) {
                s += qi[d] * kj[d];
                dp += doi[d] * vj[d];
            }
            float p = valid ? __expf(s * scale - lse[(size_t)h * a.Tq + i]) : 0.0f;
            float ds = p * (dp - delta[(size_t)h * a.Tq + i]) * scale;
            if (p != 0.0f) {
#pragma unroll 4
                for (int d = 0; d < D; d++) {
                    dvj[d] += p * doi[d];
                    dkj[d] += ds * qi[d];
                }
            }
        }
    }
    __syncwarp();
    for (int jj = 0; jj < end - j0; jj++)
        for (int d = lane; d < D; d += 32) {
            size_t at = ((size_t)(j0 + jj) * a.KV + g) * D + d;
            dk[at] = to_bf16(dKs[jj * stride + d]);
            dv[at] = to_bf16(dVs[jj * stride + d]);
        }
}

// ------------------------------------------------------------------------------- launches ----

static size_t rows_smem(int D, int row_sets) {
    return sizeof(float) * (2 * TILE * (D + 1) + row_sets * ROWS * D + ROWS * TILE);
}

// Instantiates a kernel for the number of 32-dim chunks a head needs (1 to 4).
#define DISPATCH_NC(D, CALL)                                                                       \
    switch (((D) + 31) / 32) {                                                                     \
    case 1: CALL(1); break;                                                                        \
    case 2: CALL(2); break;                                                                        \
    case 3: CALL(3); break;                                                                        \
    default: CALL(4); break;                                                                       \
    }

extern "C" void weft_cuda_attention_forward_simt(weft_cuda_stream s,
                                                 const weft_cuda_attention_args *a, const void *q,
                                                 const void *k, const void *v, void *out,
                                                 float *lse) {
    if (a->Tq == 0) return;
    dim3 grid((a->Tq + ROWS - 1) / ROWS, a->H);
    size_t smem = rows_smem(a->D, 1);
    float scale = 1.0f / sqrtf((float)a->D);
#define LAUNCH(NC)                                                                                 \
    WEFT_LAUNCH(attention_forward_kernel<NC>, grid, 32, smem, s, *a, (const bf16 *)q,              \
                (const bf16 *)k, (const bf16 *)v, (bf16 *)out, lse, scale)
    DISPATCH_NC(a->D, LAUNCH)
#undef LAUNCH
}

extern "C" void weft_cuda_attention_delta(weft_cuda_stream s, const void *out, const void *dout,
                                          float *delta, int Tq, int H, int D) {
    size_t items = (size_t)Tq * H;
    if (items == 0) return;
    WEFT_LAUNCH(attention_delta_kernel, (unsigned)((items + 3) / 4), 128, 0, s,
                (const bf16 *)out, (const bf16 *)dout, delta, Tq, H, D);
}

extern "C" void weft_cuda_attention_backward_simt(weft_cuda_stream s,
                                                  const weft_cuda_attention_args *a, const void *q,
                                                  const void *k, const void *v, const float *lse,
                                                  const void *dout, const float *delta, void *dq,
                                                  void *dk, void *dv) {
    if (a->Tq == 0) return;
    float scale = 1.0f / sqrtf((float)a->D);
    dim3 grid_q((a->Tq + ROWS - 1) / ROWS, a->H);
    size_t smem_q = rows_smem(a->D, 2);
#define LAUNCH(NC)                                                                                 \
    WEFT_LAUNCH(attention_dq_kernel<NC>, grid_q, 32, smem_q, s, *a, (const bf16 *)q,               \
                (const bf16 *)k, (const bf16 *)v, lse, (const bf16 *)dout, delta, (bf16 *)dq,      \
                scale)
    DISPATCH_NC(a->D, LAUNCH)
#undef LAUNCH

    if (a->Tkv == 0) return;
    dim3 grid_kv((a->Tkv + TILE - 1) / TILE, a->KV);
    size_t smem_kv = sizeof(float) * (4 * TILE * (a->D + 1) + 2 * a->D);
    WEFT_LAUNCH(attention_dkdv_kernel, grid_kv, 32, smem_kv, s, *a, (const bf16 *)q,
                (const bf16 *)k, (const bf16 *)v, lse, (const bf16 *)dout, delta, (bf16 *)dk,
                (bf16 *)dv, scale);
}
