// The output heads' ops over large vocabularies, one block per row: the fused cross-entropy (the
// logits become their gradient in place, so no second (T, V) buffer and no fp32 copy exist), the
// log-probs and entropy of the targets (logits unchanged), and the backward of a per-row weighted
// objective. All three find a row's max, log-sum-exp and argmax in one read (online softmax), the
// same way, so their losses and gradients agree.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/softmax_row.cuh"

#include <math.h>

// H = -sum_j p_j log p_j = log(sum) - sum_j e_j (x_j - max) / sum, e_j = exp(x_j - max).
template <int VEC> __device__ float row_entropy(const bf16 *row, int V, softmax_state s) {
    __shared__ float partial[CE_THREADS / 32];
    float weighted = 0.0f;
    for (int j = threadIdx.x * VEC; j < V; j += blockDim.x * VEC) {
        bf16_vec<VEC> x;
        x.load(row + j);
#pragma unroll
        for (int k = 0; k < VEC; k++) weighted += __expf(x.x[k] - s.max) * (x.x[k] - s.max);
    }
    return logf(s.sum) - block_sum(weighted, partial) / s.sum;
}

template <int VEC> __device__ void zero_row(bf16 *row, int V) {
    bf16_vec<VEC> zeros = {};
    for (int j = threadIdx.x * VEC; j < V; j += blockDim.x * VEC) zeros.store(row + j);
}

// Each element x of the row becomes f(p, x - max, hit): its softmax probability p, its distance
// from the row's max (log p = x - max - log(sum), finite where p underflows to 0), and whether it
// is the target.
template <int VEC, typename F>
__device__ void rewrite_row(bf16 *row, int V, int y, softmax_state s, F f) {
    float inv = 1.0f / s.sum;
    for (int j = threadIdx.x * VEC; j < V; j += blockDim.x * VEC) {
        bf16_vec<VEC> x;
        x.load(row + j);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float z = x.x[k] - s.max;
            x.x[k] = f(__expf(z) * inv, z, j + k == y);
        }
        x.store(row + j);
    }
}

template <int VEC>
__global__ void cross_entropy_kernel(bf16 *logits, const int32_t *targets, float scale,
                                     float *row_loss, float *correct, int V) {
    wait_for_earlier_kernels();
    __shared__ float target_logit;
    int t = blockIdx.x, y = targets[t];
    bf16 *row = logits + (size_t)t * V;
    if (y < 0) {
        zero_row<VEC>(row, V);
        if (threadIdx.x == 0) {
            row_loss[t] = 0.0f;
            if (correct) correct[t] = 0.0f;
        }
        return;
    }
    softmax_state s = row_softmax<VEC>(row, V, y, &target_logit);
    if (threadIdx.x == 0) {
        row_loss[t] = s.max + logf(s.sum) - target_logit;
        if (correct) correct[t] = s.arg == y ? 1.0f : 0.0f;
    }
    rewrite_row<VEC>(row, V, y, s, [=](float p, float, bool hit) {
        return scale * (p - (hit ? 1.0f : 0.0f));
    });
}

template <int VEC>
__global__ void logprobs_kernel(const bf16 *logits, const int32_t *targets, float *logprob,
                                float *entropy, float *correct, int V) {
    wait_for_earlier_kernels();
    __shared__ float target_logit;
    int t = blockIdx.x, y = targets[t];
    const bf16 *row = logits + (size_t)t * V;
    if (y < 0) {
        if (threadIdx.x == 0) {
            logprob[t] = 0.0f;
            if (entropy) entropy[t] = 0.0f;
            if (correct) correct[t] = 0.0f;
        }
        return;
    }
    softmax_state s = row_softmax<VEC>(row, V, y, &target_logit);
    float H = entropy ? row_entropy<VEC>(row, V, s) : 0.0f;
    if (threadIdx.x == 0) {
        logprob[t] = -(s.max + logf(s.sum) - target_logit);
        if (entropy) entropy[t] = H;
        if (correct) correct[t] = s.arg == y ? 1.0f : 0.0f;
    }
}

// Each row's log-normalizer as logprobs_kernel computes it (the same reduction, the same
// rounding), so the host finishes any token's log-prob with one f32 subtraction.
template <int VEC>
__global__ void log_normalizers_kernel(const bf16 *logits, float *lse, int V) {
    wait_for_earlier_kernels();
    __shared__ float unused;
    softmax_state s = row_softmax<VEC>(logits + (size_t)blockIdx.x * V, V, -1, &unused);
    if (threadIdx.x == 0) lse[blockIdx.x] = s.max + logf(s.sum);
}

template <int VEC>
__global__ void logits_backward_kernel(bf16 *logits, const int32_t *targets,
                                       const float *d_logprob, const float *d_entropy, int V) {
    wait_for_earlier_kernels();
    __shared__ float target_logit;
    int t = blockIdx.x, y = targets[t];
    bf16 *row = logits + (size_t)t * V;
    float w = d_logprob ? d_logprob[t] : 0.0f, u = d_entropy ? d_entropy[t] : 0.0f;
    if (y < 0) {
        zero_row<VEC>(row, V);
        return;
    }
    softmax_state s = row_softmax<VEC>(row, V, y, &target_logit);
    if (u == 0.0f) { // cross-entropy's own expression, so -1/N weights give its gradient
        float scale = -w;
        rewrite_row<VEC>(row, V, y, s, [=](float p, float, bool hit) {
            return scale * (p - (hit ? 1.0f : 0.0f));
        });
        return;
    }
    float H = row_entropy<VEC>(row, V, s), log_sum = logf(s.sum);
    rewrite_row<VEC>(row, V, y, s, [=](float p, float z, bool hit) {
        return w * ((hit ? 1.0f : 0.0f) - p) - u * p * (z - log_sum + H);
    });
}

extern "C" void weft_cuda_cross_entropy(weft_cuda_stream s, void *logits, const int32_t *targets,
                                        float scale, float *row_loss, float *correct, int T,
                                        int V) {
    if (T == 0) return;
    WEFT_LAUNCH_VECTORIZED(cross_entropy_kernel, vector_width(V, logits), T, CE_THREADS, 0, s,
                           (bf16 *)logits, targets, scale, row_loss, correct, V);
}

extern "C" void weft_cuda_logprobs(weft_cuda_stream s, const void *logits, const int32_t *targets,
                                   float *logprob, float *entropy, float *correct, int T, int V) {
    if (T == 0) return;
    WEFT_LAUNCH_VECTORIZED(logprobs_kernel, vector_width(V, logits), T, CE_THREADS, 0, s,
                           (const bf16 *)logits, targets, logprob, entropy, correct, V);
}

extern "C" void weft_cuda_log_normalizers(weft_cuda_stream s, const void *logits, float *lse,
                                          int T, int V) {
    if (T == 0) return;
    WEFT_LAUNCH_VECTORIZED(log_normalizers_kernel, vector_width(V, logits), T, CE_THREADS, 0, s,
                           (const bf16 *)logits, lse, V);
}

extern "C" void weft_cuda_logits_backward(weft_cuda_stream s, void *logits,
                                          const int32_t *targets, const float *d_logprob,
                                          const float *d_entropy, int T, int V) {
    if (T == 0) return;
    WEFT_LAUNCH_VECTORIZED(logits_backward_kernel, vector_width(V, logits), T, CE_THREADS, 0, s,
                           (bf16 *)logits, targets, d_logprob, d_entropy, V);
}
