// The CUDA runtime and cuBLASLt calls of weft's CUDA backend (src/backend/cuda/cuda.c and
// profile.c), implemented on host memory, so that backend runs end to end on a machine without a
// GPU (weft_emulated, with the kernels of cuda_emulated_kernels.cpp). "Device" memory is plain
// heap memory, stream work happens at once (or, captured, when its graph is launched:
// cuda_emulation_stream.h), and a GEMM is OpenBLAS's sgemm on fp32 copies of its operands, read
// through the same column-major layouts and transposes the backend hands cuBLASLt, so the
// row-major-to-column-major mapping in cuda.c is exercised too.
#include <unistd.h>
#include <cblas.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <map>
#include <vector>

#include "cuda_emulation_stream.h"

namespace {

struct layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct matmul_desc {
    cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
};

int g_stream_tag; // streams and handles are just distinct non-null pointers
std::map<uintptr_t, size_t> g_allocations; // "device" memory: start -> bytes

float element(const void *p, cudaDataType_t type, size_t at) {
    if (type == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[at]);
    return static_cast<const float *>(p)[at];
}

// op(M) (r x c, column-major, ld r) as fp32 from a stored matrix described by `l`.
std::vector<float> operand(const void *p, const layout *l, cublasOperation_t op) {
    size_t r = op == CUBLAS_OP_N ? l->rows : l->cols, c = op == CUBLAS_OP_N ? l->cols : l->rows;
    std::vector<float> out(r * c);
    for (size_t j = 0; j < c; j++)
        for (size_t i = 0; i < r; i++) {
            size_t at = op == CUBLAS_OP_N ? i + j * l->ld : j + i * l->ld;
            out[i + j * r] = element(p, l->type, at);
        }
    return out;
}

// D = alpha op(A) op(B) + beta C (column-major), on OpenBLAS in fp32 (beta C in fp32 as cuBLASLt
// does).
void gemm(const matmul_desc &m, float alpha, const void *A, const layout *a, const void *B,
          const layout *b, float beta, const void *C, const layout *c, void *D, const layout *dl) {
    size_t M = c->rows, N = c->cols, K = m.trans_a == CUBLAS_OP_N ? a->cols : a->rows;
    std::vector<float> opa = operand(A, a, m.trans_a), opb = operand(B, b, m.trans_b);
    std::vector<float> out = operand(C, c, CUBLAS_OP_N);
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, alpha,
                opa.data(), (int)M, opb.data(), (int)K, beta, out.data(), (int)M);
    for (size_t j = 0; j < N; j++)
        for (size_t i = 0; i < M; i++) {
            size_t at = i + j * dl->ld;
            if (dl->type == CUDA_R_16BF)
                static_cast<__nv_bfloat16 *>(D)[at] = __float2bfloat16_rn(out[i + j * M]);
            else
                static_cast<float *>(D)[at] = out[i + j * M];
        }
}

// A call a GPU refuses while the calling thread captures a stream (weft captures in the default
// thread-local mode): allocation, freeing, synchronizing, copies to or from pageable memory.
bool capturing() { return emu::g_recording != nullptr; }

bool is_device_memory(const void *p) {
    auto it = g_allocations.upper_bound((uintptr_t)p);
    if (it == g_allocations.begin()) return false;
    --it;
    return (uintptr_t)p < it->first + it->second;
}

} // namespace

extern "C" {

// ----------------------------------------------------------------------------- runtime ----

cudaError_t cudaMalloc(void **p, size_t bytes) {
    if (capturing()) return cudaErrorStreamCaptureUnsupported;
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!*p) return cudaErrorMemoryAllocation;
    g_allocations[(uintptr_t)*p] = bytes;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (capturing()) return cudaErrorStreamCaptureUnsupported;
    g_allocations.erase((uintptr_t)p);
    free(p);
    return cudaSuccess;
}
// Pinned host memory is host memory here: what matters to the emulation is only that it is not
// the device's.
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    if (capturing()) return cudaErrorStreamCaptureUnsupported;
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    if (capturing()) return cudaErrorStreamCaptureUnsupported;
    free(p);
    return cudaSuccess;
}
// Device memory is what cudaMalloc handed out; anything else is unregistered host memory.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr, const void *p) {
    memset(attr, 0, sizeof *attr);
    attr->type = is_device_memory(p) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t) {
    emu::stream_work([=] { memset(p, value, bytes); });
    return cudaSuccess;
}
cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t) {
    emu::stream_work([=] {
        for (size_t r = 0; r < height; r++) memset(static_cast<char *>(p) + r * pitch, value, width);
    });
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind, cudaStream_t) {
    if (capturing() && (!is_device_memory(dst) || !is_device_memory(src)))
        return cudaErrorStreamCaptureUnsupported;
    emu::stream_work([=] {
        for (size_t r = 0; r < height; r++)
            memmove(static_cast<char *>(dst) + r * dpitch,
                    static_cast<const char *>(src) + r * spitch, width);
    });
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t) {
    if (capturing() && (!is_device_memory(dst) || !is_device_memory(src)))
        return cudaErrorStreamCaptureUnsupported;
    emu::stream_work([=] { memmove(dst, src, bytes); });
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) {
    *s = reinterpret_cast<cudaStream_t>(&g_stream_tag);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    return capturing() ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int) {
    // An H100, for the kernel choice (and its 132 SMs, for the GEMMs' split of K).
    *value = attr == cudaDevAttrComputeCapabilityMajor ? 9
             : attr == cudaDevAttrMultiProcessorCount  ? 132
                                                       : 0;
    return cudaSuccess;
}
// "Device" memory is host memory here: report the host's, as the CPU backend does.
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    *free_bytes = (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    *total = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; } // emulated launches cannot fail
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "error"; }
// An event is the host clock when it was recorded: emulated work runs when it is queued, so that
// is when everything before it finished, and a profile (WEFT_CUDA_PROFILE) times the emulator.
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = reinterpret_cast<cudaEvent_t>(new double(0.0));
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    using namespace std::chrono;
    *reinterpret_cast<double *>(e) =
        duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; } // all work is done at once
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    *ms = (float)(*reinterpret_cast<double *>(end) - *reinterpret_cast<double *>(start));
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete reinterpret_cast<double *>(e);
    return cudaSuccess;
}

// A graph is its capture's recording; instantiating copies it, launching runs it.
using recording = std::vector<std::function<void()>>;

cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    if (capturing()) return cudaErrorIllegalState;
    emu::g_recording = new recording;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *graph) {
    if (!capturing()) return cudaErrorIllegalState;
    *graph = reinterpret_cast<cudaGraph_t>(emu::g_recording);
    emu::g_recording = nullptr;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus *status) {
    *status = capturing() ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                          unsigned long long) {
    *exec = reinterpret_cast<cudaGraphExec_t>(
        new recording(*reinterpret_cast<recording *>(graph)));
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete reinterpret_cast<recording *>(graph);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
    if (capturing()) return cudaErrorStreamCaptureUnsupported; // weft never nests graphs
    for (auto &work : *reinterpret_cast<recording *>(exec)) work();
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete reinterpret_cast<recording *>(exec);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------- cuBLASLt ----

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = reinterpret_cast<cublasLtHandle_t>(&g_stream_tag);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = reinterpret_cast<cublasLtMatmulDesc_t>(new matmul_desc);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete reinterpret_cast<matmul_desc *>(d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *value, size_t bytes) {
    matmul_desc *m = reinterpret_cast<matmul_desc *>(d);
    if (bytes != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA) memcpy(&m->trans_a, value, bytes);
    else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) memcpy(&m->trans_b, value, bytes);
    else return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    if (type != CUDA_R_16BF && type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE; // column-major: ld >= rows
    *l = reinterpret_cast<cublasLtMatrixLayout_t>(new layout{type, rows, cols, ld});
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete reinterpret_cast<layout *>(l);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = reinterpret_cast<cublasLtMatmulPreference_t>(new int(0));
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete reinterpret_cast<int *>(p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void *, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *found) {
    // The shapes must chain: op(A) (m x k), op(B) (k x n), C (m x n). cuBLASLt finds no algorithm
    // otherwise, and neither does this.
    const matmul_desc *m = reinterpret_cast<const matmul_desc *>(d);
    const layout *a = reinterpret_cast<const layout *>(A), *b = reinterpret_cast<const layout *>(B);
    const layout *c = reinterpret_cast<const layout *>(C);
    uint64_t am = m->trans_a == CUBLAS_OP_N ? a->rows : a->cols;
    uint64_t ak = m->trans_a == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t bk = m->trans_b == CUBLAS_OP_N ? b->rows : b->cols;
    uint64_t bn = m->trans_b == CUBLAS_OP_N ? b->cols : b->rows;
    *found = requested > 0 && am == c->rows && bn == c->cols && ak == bk;
    if (*found) {
        memset(&results[0], 0, sizeof results[0]);
        results[0].state = CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// Every algorithm may split K; the emulated product ignores the algorithm, so any split is fine.
cublasStatus_t cublasLtMatmulAlgoCapGetAttribute(const cublasLtMatmulAlgo_t *,
                                                 cublasLtMatmulAlgoCapAttributes_t attr,
                                                 void *buf, size_t bytes, size_t *written) {
    if (attr != CUBLASLT_ALGO_CAP_SPLITK_SUPPORT || bytes < sizeof(int32_t))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *(int32_t *)buf = 1;
    *written = sizeof(int32_t);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t *,
                                                    cublasLtMatmulAlgoConfigAttributes_t,
                                                    const void *, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                       const cublasLtMatmulAlgo_t *,
                                       cublasLtMatmulHeuristicResult_t *result) {
    *result = cublasLtMatmulHeuristicResult_t{};
    result->state = CUBLAS_STATUS_SUCCESS;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t) {
    // A captured GEMM keeps its shapes and scalars, as cuBLASLt's kernels keep their arguments.
    matmul_desc m = *reinterpret_cast<const matmul_desc *>(d);
    layout a = *reinterpret_cast<const layout *>(Adesc), b = *reinterpret_cast<const layout *>(Bdesc);
    layout c = *reinterpret_cast<const layout *>(Cdesc), dl = *reinterpret_cast<const layout *>(Ddesc);
    float al = *static_cast<const float *>(alpha), be = *static_cast<const float *>(beta);
    emu::stream_work([=] { gemm(m, al, A, &a, B, &b, be, C, &c, D, &dl); });
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
