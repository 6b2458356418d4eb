// Launchers of the tensor-core attention kernels (attention_mma.cuh).
#include "backend/cuda/attention_mma.cuh"

// Runs LAUNCH(D / 16): the kernels are instantiated per head_dim.
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

extern "C" void weft_cuda_attention_forward_mma(weft_cuda_stream s,
                                                const weft_cuda_attention_args *a, const void *q,
                                                const void *k, const void *v, void *out,
                                                float *lse) {
    if (a->Tq == 0) return;
    int rows = block_rows(a->D / 16);
    dim3 grid((a->Tq + rows - 1) / rows, a->H);
    float scale_log2 = LOG2E / sqrtf((float)a->D);
    size_t smem = query_block_smem(a->D);
#define LAUNCH(DK)                                                                                 \
    WEFT_LAUNCH(forward_kernel<DK>, grid, THREADS, smem, s, *a, (const bf16 *)q, (const bf16 *)k,  \
                (const bf16 *)v, (bf16 *)out, lse, scale_log2)
    DISPATCH_DK(a->D, LAUNCH)
#undef LAUNCH
}

extern "C" size_t weft_cuda_attention_partials_bytes(const weft_cuda_attention_args *a) {
    return a->H == a->KV ? 0 : 2 * sizeof(float) * (size_t)a->Tkv * a->H * a->D;
}

extern "C" void weft_cuda_attention_backward_mma(weft_cuda_stream s,
                                                 const weft_cuda_attention_args *a, const void *q,
                                                 const void *k, const void *v, const float *lse,
                                                 const void *dout, const float *delta, void *dq,
                                                 void *dk, void *dv, float *partials) {
    if (a->Tq == 0) return;
    float scale = 1.0f / sqrtf((float)a->D), scale_log2 = scale * LOG2E;
    int rows = block_rows(a->D / 16); // query rows per dQ block, keys per dK/dV block
    dim3 grid_q((a->Tq + rows - 1) / rows, a->H);
    size_t smem_q = query_block_smem(a->D);
#define LAUNCH(DK)                                                                                 \
    WEFT_LAUNCH(dq_kernel<DK>, grid_q, THREADS, smem_q, s, *a, (const bf16 *)q, (const bf16 *)k,   \
                (const bf16 *)v, lse, (const bf16 *)dout, delta, (bf16 *)dq, scale, scale_log2)
    DISPATCH_DK(a->D, LAUNCH)
#undef LAUNCH
    if (a->Tkv == 0) return;
    bool grouped = a->H != a->KV;
    float *dk_part = grouped ? partials : NULL;
    float *dv_part = grouped ? partials + (size_t)a->Tkv * a->H * a->D : NULL;
    dim3 grid_kv((a->Tkv + rows - 1) / rows, a->H);
    size_t smem_kv = dkdv_smem(a->D);
#define LAUNCH(DK)                                                                                 \
    WEFT_LAUNCH(dkdv_kernel<DK>, grid_kv, THREADS, smem_kv, s, *a, (const bf16 *)q,                \
                (const bf16 *)k, (const bf16 *)v, lse, (const bf16 *)dout, delta, (bf16 *)dk,      \
                (bf16 *)dv, dk_part, dv_part, scale, scale_log2)
    DISPATCH_DK(a->D, LAUNCH)
#undef LAUNCH
    if (grouped) sum_groups(s, a, partials, dk, dv);
}
