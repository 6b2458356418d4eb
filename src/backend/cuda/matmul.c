// cuBLASLt GEMMs with a cache of per-shape plans (matmul.h).
#include "backend/cuda/matmul.h"

#include <cublasLt.h>
#include <stdint.h>

#include "core/core.h"

enum { WORKSPACE_BYTES = 32 << 20, MATMUL_CACHE = 96 };

#define LT_CHECK(call)                                                                             \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        WEFT_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cublasLt: %s failed (status %d)", #call,       \
                   (int)st_);                                                                      \
    } while (0)

// One GEMM shape's cuBLASLt descriptors and chosen algorithm.
typedef struct matmul_plan {
    bool used;
    bool trans_a, trans_b;
    int m, n, k, lda, ldb, ldc, align;
    weft_matmul_types types;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    bool split; // K split (split_k)
} matmul_plan;

struct weft_cuda_gemms {
    cublasLtHandle_t lt;
    int split_k_sms; // matmul.h
    void *workspace;
    matmul_plan plans[MATMUL_CACHE];
    int next_plan; // round-robin replacement once the cache is full
};

static void warm_up(weft_cuda_gemms *g);

weft_cuda_gemms *weft_cuda_gemms_create(int split_k_sms) {
    weft_cuda_gemms *g = weft_alloc(sizeof *g);
    g->split_k_sms = split_k_sms;
    LT_CHECK(cublasLtCreate(&g->lt));
    cudaError_t err = cudaMalloc(&g->workspace, WORKSPACE_BYTES);
    WEFT_CHECK(err == cudaSuccess, "cuda: cublasLt workspace: %s", cudaGetErrorString(err));
    warm_up(g);
    return g;
}

static cudaDataType_t cuda_type(weft_dtype t) { return t == WEFT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two (up to 256) dividing every address: what cuBLASLt may assume.
static int common_alignment(const void *a, const void *b, const void *c, const void *d) {
    uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | 256;
    return (int)(bits & (~bits + 1));
}

// With split_k_sms, a product whose 128 x 128 tiles number fewer than the SMs (at 256 rows, the
// 1B model's 2,048-column projections make 32 for 132 SMs) gets its K split in up to 16 parts of
// at least 256, summed by cuBLASLt out of place in fp32 (a fixed order: runs repeat bit for
// bit), where the chosen algorithm supports it and cublasLtMatmulAlgoCheck accepts the change.
static void split_k(weft_cuda_gemms *g, matmul_plan *p) {
    int tiles = ((p->m + 127) / 128) * ((p->n + 127) / 128);
    int parts = (g->split_k_sms + tiles - 1) / tiles, most = p->k / 256;
    parts = parts < most ? parts : most;
    parts = parts < 16 ? parts : 16;
    int32_t supported = 0;
    size_t written = 0;
    if (parts < 2 ||
        cublasLtMatmulAlgoCapGetAttribute(&p->algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &supported,
                                          sizeof supported, &written) != CUBLAS_STATUS_SUCCESS ||
        !supported)
        return;
    cublasLtMatmulAlgo_t algo = p->algo;
    uint32_t splits = (uint32_t)parts, scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulHeuristicResult_t check;
    if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                             sizeof splits) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                             &scheme, sizeof scheme) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoCheck(g->lt, p->op, p->la, p->lb, p->lc, p->lc, &algo, &check) ==
            CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= WORKSPACE_BYTES)
        p->algo = algo, p->split = true;
}

// Row-major C (m, n) = op(A) op(B) is column-major C^T (n, m) = op(B)^T op(A)^T: cuBLASLt's "A"
// is our B and its "B" our A, each a column-major view of the stored row-major matrix.
static void build_plan(weft_cuda_gemms *g, matmul_plan *p) {
    cublasOperation_t opa = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    // Stored shapes in column-major terms (rows, cols, ld).
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->la, cuda_type(p->types.b), p->trans_b ? p->k : p->n,
                                        p->trans_b ? p->n : p->k, p->ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lb, cuda_type(p->types.a), p->trans_a ? p->m : p->k,
                                        p->trans_a ? p->k : p->m, p->lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lc, cuda_type(p->types.c), p->n, p->m, p->ldc));

    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = WORKSPACE_BYTES;
    uint32_t align = (uint32_t)p->align;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1,
                                            &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    WEFT_CHECK(found > 0, "cublasLt: no algorithm for a %dx%dx%d GEMM (types %d,%d,%d)", p->m,
               p->n, p->k, p->types.a, p->types.b, p->types.c);
    p->algo = result.algo;
    if (g->split_k_sms > 0) split_k(g, p);
}

static void destroy_plan(matmul_plan *p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->op);
    p->used = false;
}

static bool same_shape(const matmul_plan *p, const matmul_plan *q) {
    return p->trans_a == q->trans_a && p->trans_b == q->trans_b && p->m == q->m && p->n == q->n &&
           p->k == q->k && p->lda == q->lda && p->ldb == q->ldb && p->ldc == q->ldc &&
           p->align == q->align && p->types.a == q->types.a && p->types.b == q->types.b &&
           p->types.c == q->types.c;
}

static const matmul_plan *find_plan(weft_cuda_gemms *g, const matmul_plan *want) {
    for (int i = 0; i < MATMUL_CACHE; i++)
        if (g->plans[i].used && same_shape(&g->plans[i], want)) return &g->plans[i];
    matmul_plan *slot = &g->plans[g->next_plan];
    g->next_plan = (g->next_plan + 1) % MATMUL_CACHE;
    destroy_plan(slot);
    *slot = *want;
    build_plan(g, slot);
    slot->used = true;
    return slot;
}

void weft_cuda_gemms_free(weft_cuda_gemms *g) {
    if (!g) return;
    for (int i = 0; i < MATMUL_CACHE; i++) destroy_plan(&g->plans[i]);
    cudaFree(g->workspace);
    cublasLtDestroy(g->lt);
    weft_free(g);
}

bool weft_cuda_gemm(weft_cuda_gemms *g, cudaStream_t stream, bool ta, bool tb, int m, int n,
                    int k, float alpha, const void *a, int lda, const void *b, int ldb,
                    float beta, const void *c_in, void *c, int ldc, weft_matmul_types types) {
    // cuBLASLt's C (read) and D (written) may differ: the residual is read where it lies.
    matmul_plan want = {.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .lda = lda,
                        .ldb = ldb, .ldc = ldc,
                        .align = common_alignment(a, b, c, c_in),
                        .types = types};
    const matmul_plan *p = find_plan(g, &want);
    LT_CHECK(cublasLtMatmul(g->lt, p->op, &alpha, b, p->la, a, p->lb, &beta, c_in, p->lc, c,
                            p->lc, &p->algo, g->workspace, WORKSPACE_BYTES, stream));
    return p->split;
}

// cuBLASLt's first product in a process pays for its own set-up (its heuristics, the kernels
// the driver loads on first use): on an H200 a batch-1 `weft generate` spent 134 ms of its
// 320 ms in its prefill's first products. One small bf16 product here, as inference engines warm
// cuBLAS when they start, moves that set-up to the backend's creation (model loading), ahead of
// the first step; products of new shapes still plan (and may load a kernel) on first use.
static void warm_up(weft_cuda_gemms *g) {
    enum { N = 128 };
    size_t bytes = (size_t)N * N * 2;
    unsigned char *buf;
    cudaError_t err = cudaMalloc((void **)&buf, 3 * bytes);
    WEFT_CHECK(err == cudaSuccess, "cuda: cublasLt warm-up: %s", cudaGetErrorString(err));
    err = cudaMemsetAsync(buf, 0, 3 * bytes, 0);
    WEFT_CHECK(err == cudaSuccess, "cuda: cublasLt warm-up: %s", cudaGetErrorString(err));
    weft_matmul_types bf16 = {WEFT_BF16, WEFT_BF16, WEFT_BF16};
    weft_cuda_gemm(g, 0, false, true, N, N, N, 1.0f, buf, N, buf + bytes, N, 0.0f, buf + 2 * bytes,
                   buf + 2 * bytes, N, bf16);
    err = cudaStreamSynchronize(0);
    WEFT_CHECK(err == cudaSuccess, "cuda: cublasLt warm-up: %s", cudaGetErrorString(err));
    cudaFree(buf);
}
