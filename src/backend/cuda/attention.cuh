// Device helpers both attention kernel families share: which keys a query row may see.
#pragma once
#include "backend/cuda/kernels.h"

// Document of packed row `row`: the last d with cu[d] <= row (empty documents are skipped).
__device__ __forceinline__ int find_doc(const int32_t *cu, int n_docs, int row) {
    int lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// The query tile a block of the forward or dQ grid (query tiles, heads) takes: the last first.
// Under the causal mask a document's later rows see more keys, and blocks start in index order,
// so the longest blocks start first and the short ones fill the last wave's gaps.
__device__ __forceinline__ int query_tile_of_block() { return gridDim.x - 1 - blockIdx.x; }

// The keys query row `row` sees, [*lo, *hi): cu_kv[d] + [0, q_pos[row]] for its document d; empty
// for rows past Tq.
__device__ __forceinline__ void row_key_range(const weft_cuda_attention_args &a, int row, int *lo,
                                              int *hi) {
    if (row >= a.Tq) {
        *lo = *hi = 0;
        return;
    }
    int d = find_doc(a.cu_q, a.n_docs, row);
    *lo = a.cu_kv[d];
    *hi = *lo + a.q_pos[row] + 1;
}
