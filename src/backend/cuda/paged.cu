// The paged KV cache's kernels: storing keys and values into the pool's blocks, and causal
// attention of query rows over a sequence's pooled keys (decoding: one or a few rows per
// sequence). A first, simple version: one block per (query row, head), keys in order, online
// softmax in fp32.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

#include <math.h>

// Offset (in elements) of the keys of (block, layer, offset) in the pool; values follow
// block_size * width elements later.
__device__ __forceinline__ size_t pool_row(int layers, int block_size, int width, int block,
                                           int layer, int offset) {
    return (((size_t)block * layers + layer) * 2 * block_size + offset) * width;
}

__global__ void kv_store_kernel(bf16 *pool, int layers, int block_size, int width, int layer,
                                const int32_t *slot, const bf16 *k, const bf16 *v, int T) {
    int t = blockIdx.x;
    size_t at = pool_row(layers, block_size, width, slot[t] / block_size, layer,
                         slot[t] % block_size);
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        pool[at + j] = k[(size_t)t * width + j];
        pool[at + (size_t)block_size * width + j] = v[(size_t)t * width + j];
    }
}

extern "C" void weft_cuda_kv_store(weft_cuda_stream s, void *pool, int layers, int block_size,
                                   int width, int layer, const int32_t *slot, const void *k,
                                   const void *v, int T) {
    if (T == 0) return;
    WEFT_LAUNCH(kv_store_kernel, T, 128, 0, s, (bf16 *)pool, layers, block_size, width, layer,
                slot, (const bf16 *)k, (const bf16 *)v, T);
}

// The sequence a query row belongs to (cu_q is ascending).
__device__ int sequence_of(const int32_t *cu_q, int n_seqs, int row) {
    int lo = 0, hi = n_seqs;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (cu_q[mid] <= row) lo = mid;
        else hi = mid;
    }
    return lo;
}

// One block of 32 threads per (query row, head); thread j takes head dims j, j + 32, ...
__global__ void paged_attention_kernel(weft_cuda_paged_args a, int layer, const bf16 *q,
                                       bf16 *out, float *lse) {
    int row = blockIdx.x, h = blockIdx.y, D = a.D, kvh = h / (a.H / a.KV);
    int seq = sequence_of(a.cu_q, a.n_seqs, row), keys = a.q_pos[row] + 1;
    const int32_t *table = a.block_tables + (size_t)seq * a.max_blocks;
    const bf16 *pool = (const bf16 *)a.pool;
    float scale = 1.0f / sqrtf((float)D), m = -INFINITY, sum = 0.0f, acc[4] = {0, 0, 0, 0};
    const bf16 *qr = q + ((size_t)row * a.H + h) * D;
    for (int p = 0; p < keys; p++) {
        size_t at = pool_row(a.layers, a.block_size, a.width, table[p / a.block_size], layer,
                             p % a.block_size) + (size_t)kvh * D;
        float dot = 0.0f;
        for (int d = threadIdx.x; d < D; d += 32) dot += to_f32(qr[d]) * to_f32(pool[at + d]);
        dot = warp_sum(dot) * scale;
        float m_new = fmaxf(m, dot), correction = __expf(m - m_new), w = __expf(dot - m_new);
        sum = sum * correction + w;
        const bf16 *vr = pool + at + (size_t)a.block_size * a.width;
        for (int i = 0, d = threadIdx.x; d < D; i++, d += 32)
            acc[i] = acc[i] * correction + w * to_f32(vr[d]);
        m = m_new;
    }
    bf16 *o = out + ((size_t)row * a.H + h) * D;
    for (int i = 0, d = threadIdx.x; d < D; i++, d += 32) o[d] = to_bf16(acc[i] / sum);
    if (threadIdx.x == 0) lse[(size_t)h * a.Tq + row] = m + logf(sum);
}

extern "C" void weft_cuda_paged_attention(weft_cuda_stream s, const weft_cuda_paged_args *a,
                                          int layer, const void *q, void *out, float *lse) {
    if (a->Tq == 0) return;
    dim3 grid(a->Tq, a->H);
    WEFT_LAUNCH(paged_attention_kernel, grid, 32, 0, s, *a, layer, (const bf16 *)q,
                (bf16 *)out, lse);
}
