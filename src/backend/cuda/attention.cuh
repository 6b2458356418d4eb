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
// y), and the tiles go heaviest first: the query tiles last-first (under the causal mask a
// document's later rows see more keys), the key tiles first-first (its earlier keys are seen by
// more rows), so the short blocks fill the last wave's gaps.
// heads_fastest (the forward): every head's longest blocks start before any shorter one; taking
// the heads one after another left the last heads' longest blocks for the end (a tail simulated
// at 12% of a 4K document's time, 5% at 8K, 18% at 2048 + 1024 + 512 + 512: bench/README.md;
// measured on an H100, the forward gained 10%, 4%, 0% at 4K, 8K, 16K and 10% on the packed set).
// Otherwise (the backward) one head after another: the backward's blocks in flight then all read
// one head's Q and dO (dK/dV) or K and V (dQ), which stay in L2; with the heads fastest they read
// 32 heads' at once and the backward lost 3%, 8%, 23% and 29% at 4K, 8K, 16K and 32K.
struct tile_of_head {
    int tile, head;
};
__device__ __forceinline__ tile_of_head block_tile(bool last_first, bool heads_fastest) {
    int tiles = (int)gridDim.x, heads = (int)gridDim.y, linear = blockIdx.x + blockIdx.y * tiles;
    int rank = heads_fastest ? linear / heads : linear % tiles;
    int head = heads_fastest ? linear % heads : linear / tiles;
    return {last_first ? tiles - 1 - rank : rank, head};
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
