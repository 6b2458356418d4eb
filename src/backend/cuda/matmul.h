// The CUDA backend's GEMMs through cuBLASLt (private to backend/cuda): its handle, workspace and
// a cache of per-shape plans (descriptors and the heuristic's algorithm), so steady-state
// training and decoding query the heuristic once per shape.
#pragma once
#include <cuda_runtime_api.h>
#include <stdbool.h>

#include "backend/backend.h"

typedef struct weft_cuda_gemms weft_cuda_gemms;

// split_k_sms > 0 (WEFT_CUDA_GEMM_SPLIT_K=1: the SMs of the GPU) splits K of products whose
// 128 x 128 tiles would leave SMs idle (the decode step's at batches past skinny.cu's rows) into
// enough parts to fill them, where the heuristic's algorithm supports it; 0 keeps its choice.
weft_cuda_gemms *weft_cuda_gemms_create(int split_k_sms);
void weft_cuda_gemms_free(weft_cuda_gemms *g);
// Row-major C (m, n) = alpha op(A) op(B) + beta C_in (k > 0), queued on `stream`; backend.h's
// matmul contract. True where the product's K was split (split_k_sms).
bool weft_cuda_gemm(weft_cuda_gemms *g, cudaStream_t stream, bool ta, bool tb, int m, int n,
                    int k, float alpha, const void *a, int lda, const void *b, int ldb,
                    float beta, const void *c_in, void *c, int ldc, weft_matmul_types types);
