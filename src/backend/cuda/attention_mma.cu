// Launchers of the tensor-core attention kernels (attention_mma.cuh).
#include "backend/cuda/attention_mma.cuh"

namespace {

// Launches KERNEL<D / 16> with `smem` bytes of dynamic shared memory (opted in past 48 KiB).
#define DISPATCH_DK(D, LAUNCH)                                                                     \
    switch ((D) / 16) {                                                                            \
    case 1: LAUNCH(1); break;                                                                      \
    case 2: LAUNCH(2); break;                                                                      \
    case 3: LAUNCH(3); break;                                                                      \
    case 4: LAUNCH(4); break;                                                                      \
    case 5: LAUNCH(5); break;                                                                      \
    case 6: LAUNCH(6); break;                                                                      \
    case 7: LAUNCH(7); break;                                                                      \
    default: LAUNCH(8); break;                                                                     \
    }
#define LAUNCH_WITH_SMEM(KERNEL, DK, grid, smem, stream, ...)                                      \
    do {                                                                                           \
        cudaFuncSetAttribute(KERNEL<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem)); \
        KERNEL<DK><<<grid, THREADS, smem, stream>>>(__VA_ARGS__);                                  \
    } while (0)

} // namespace

extern "C" void weft_cuda_attention_forward_mma(weft_cuda_stream s,
                                                const weft_cuda_attention_args *a, const void *q,
                                                const void *k, const void *v, void *out,
                                                float *lse) {
    if (a->Tq == 0) return;
    dim3 grid((a->Tq + BLOCK_ROWS - 1) / BLOCK_ROWS, a->H);
    float scale_log2 = LOG2E / sqrtf((float)a->D);
    size_t smem = forward_smem(a->D);
#define LAUNCH(DK)                                                                                 \
    LAUNCH_WITH_SMEM(forward_kernel, DK, grid, smem, s, *a, (const bf16 *)q, (const bf16 *)k,      \
                     (const bf16 *)v, (bf16 *)out, lse, scale_log2)
    DISPATCH_DK(a->D, LAUNCH)
#undef LAUNCH
}

extern "C" void weft_cuda_attention_backward_mma(weft_cuda_stream s,
                                                 const weft_cuda_attention_args *a, const void *q,
                                                 const void *k, const void *v, const float *lse,
                                                 const void *dout, const float *delta, void *dq,
                                                 void *dk, void *dv) {
    if (a->Tq == 0) return;
    float scale = 1.0f / sqrtf((float)a->D), scale_log2 = scale * LOG2E;
    dim3 grid_q((a->Tq + BLOCK_ROWS - 1) / BLOCK_ROWS, a->H);
    size_t smem_q = dq_smem(a->D);
#define LAUNCH(DK)                                                                                 \
    LAUNCH_WITH_SMEM(dq_kernel, DK, grid_q, smem_q, s, *a, (const bf16 *)q, (const bf16 *)k,       \
                     (const bf16 *)v, lse, (const bf16 *)dout, delta, (bf16 *)dq, scale,           \
                     scale_log2)
    DISPATCH_DK(a->D, LAUNCH)
#undef LAUNCH
    if (a->Tkv == 0) return;
    dim3 grid_kv((a->Tkv + BLOCK_KEYS - 1) / BLOCK_KEYS, a->KV);
    size_t smem_kv = dkdv_smem(a->D);
#define LAUNCH(DK)                                                                                 \
    LAUNCH_WITH_SMEM(dkdv_kernel, DK, grid_kv, smem_kv, s, *a, (const bf16 *)q, (const bf16 *)k,   \
                     (const bf16 *)v, lse, (const bf16 *)dout, delta, (bf16 *)dk, (bf16 *)dv,      \
                     scale, scale_log2)
    DISPATCH_DK(a->D, LAUNCH)
#undef LAUNCH
}
