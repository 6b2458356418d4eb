// The CUDA backend's GEMMs through cuBLASLt (private to backend/cuda): its handle, workspace and
// a cache of per-shape plans (descriptors and the heuristic's algorithm), so steady-state
// training and decoding query the heuristic once per shape.
#pragma once
#include <cuda_runtime_api.h>
#include <stdbool.h>

#include "backend/backend.h"

typedef struct weft_cuda_gemms weft_cuda_gemms;

weft_cuda_gemms *weft_cuda_gemms_create(void);
void weft_cuda_gemms_free(weft_cuda_gemms *g);
// Row-major C (m, n) = alpha op(A) op(B) + beta C_in (k > 0), queued on `stream`; backend.h's
// matmul contract.
void weft_cuda_gemm(weft_cuda_gemms *g, cudaStream_t stream, bool ta, bool tb, int m, int n,
                    int k, float alpha, const void *a, int lda, const void *b, int ldb,
                    float beta, const void *c_in, void *c, int ldc, weft_matmul_types types);
