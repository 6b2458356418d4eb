// What the CUDA backend's host files share (cuda.c: memory, kernel ops and the op table;
// products.c: the products' choice of kernel): its state and the helpers every op goes through.
#pragma once
#include <cuda_runtime_api.h>
#include <stdbool.h>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/profile.h"
#include "backend/cuda/staging.h"
#include "backend/cuda/watch.h"

typedef struct cuda_state {
    int device;
    cudaStream_t stream;
    weft_cuda_queue queue;       // the stream as weft's own launchers see it (kernels.h)
    weft_cuda_gemms *gemms;      // cuBLASLt (matmul.c)
    double *sum_result;          // device scalar for sum_f32 / sumsq_f32
    double *sum_partials;        // their blocks' sums (WEFT_CUDA_SUM_PARTIALS)
    float *scratch;              // attention's delta and partials, grown on demand
    bool attention_mma;          // tensor-core attention where the head_dim allows it
    bool attention_hopper;       // and on TMA and wgmma (the default on sm_90a)
    bool attention_hopper_named; // by WEFT_CUDA_ATTENTION=hopper
    bool attention_ordered_dq;   // the hopper backward's dQ in its dK/dV kernel (ordered sums)
    int attention_rows_at_64;    // query rows per block of the hopper forward at head_dim 64
    bool few_rows;               // x W^T of up to WEFT_CUDA_FEW_ROWS rows on few_rows.cu's kernel
    bool skinny;                 // and up to skinny_rows on skinny.cu's (sm_80 and up)
    int skinny_rows;             // WEFT_CUDA_SKINNY_ROWS (switches.h)
    bool fold_norm;              // a forward-only RMSNorm in the few-row product after it
    bool batch_invariant;        // batch_invariant: forward products on skinny.cu for every row
                                 // count, paged attention split at a fixed size
    int *arrived;                // arrival counters (kernels.h), zero between calls
    bool capturing;              // between capture_begin and capture_end
    weft_cuda_profile *profile;  // WEFT_CUDA_PROFILE=1, else NULL
    weft_cuda_staging *staging;  // small uploads' pinned slots
    weft_cuda_watch watch;       // every host wait for the GPU, with its deadline (watch.h)
    size_t scratch_bytes;
    // Live allocations and their sizes, for the byte count (cudaFree is not told the size).
    void **live;
    size_t *live_bytes;
    int n_live, live_cap;
} cuda_state;

static inline cuda_state *weft_cuda_state(weft_backend *b) { return b->impl; }

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        WEFT_CHECK(err_ == cudaSuccess, "cuda: %s failed: %s", #call, cudaGetErrorString(err_));   \
    } while (0)

// The stream, for an op about to queue its work on it: the profile (if on) marks the op's start.
cudaStream_t weft_cuda_op_stream(weft_backend *self);
// The same for an op of weft's own kernels.
weft_cuda_stream weft_cuda_op_queue(weft_backend *self);
// After each op is queued: a bad launch configuration shows up here, named by the op, and the
// profile (if on) marks the op's end.
void weft_cuda_launched(weft_backend *self, const char *op);
// Scratch of at least `bytes`, kept for later calls. Freed memory may still be in use by queued
// kernels, so growth waits for the stream first.
float *weft_cuda_scratch(weft_backend *self, size_t bytes);

// The products (products.c), as the op table takes them.
void weft_cuda_op_matmul(weft_backend *self, bool ta, bool tb, int m, int n, int k, float alpha,
                         const void *a, int lda, const void *b, int ldb, float beta,
                         const void *c_in, const void *bias, void *c, int ldc,
                         weft_matmul_types types);
void weft_cuda_op_swiglu_product(weft_backend *self, const void *x, const void *w, void *gate_up,
                                 void *out, int rows, int C, int width);
bool weft_cuda_op_norm_product(weft_backend *self, const weft_norm_product *np, void *y, int N,
                               bool swiglu);
bool weft_cuda_op_norm_product_store(weft_backend *self, const weft_norm_product *np,
                                     void *fused, const weft_column_parts *parts,
                                     const weft_rope_rows *r, const weft_kv_pool *pool, int layer,
                                     const int32_t *slot);
void weft_cuda_op_batch_invariant(weft_backend *self, bool on);
