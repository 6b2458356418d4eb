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

// The tile and head a block of a grid (tiles, heads) takes. Blocks start in launch order (x, then
// y), which here runs over the heads fastest and over the tiles heaviest first: the query tiles
// last-first (under the causal mask a document's later rows see more keys), the key tiles
// first-first (its earlier keys are seen by more rows). So every head's longest blocks start
// before any shorter one and the short ones fill the last wave's gaps; taking the heads one after
// another left the last heads' longest blocks for the end (a tail simulated at 12% of the time at
// one 4K document, 5% at 8K, 18% at 2048 + 1024 + 512 + 512: bench/README.md).
struct tile_of_head {
    int tile, head;
};
__device__ __forceinline__ tile_of_head block_tile(bool last_first) {
    int linear = blockIdx.x + blockIdx.y * gridDim.x, heads = gridDim.y, rank = linear / heads;
    return {last_first ? (int)gridDim.x - 1 - rank : rank, linear % heads};
}

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
