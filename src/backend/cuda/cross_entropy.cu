// Fused cross-entropy over large vocabularies: one block per row reads the row's logits once to
// find max, log-sum-exp and argmax together (online softmax), then overwrites the same row with
// its gradient. No second (T, V) buffer and no fp32 copy of the logits exist.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

#include <math.h>

enum { CE_THREADS = 512 };

// Running (max, sum of exp(x - max), first index of the max) of a set of logits.
struct softmax_state {
    float max, sum;
    int arg;
};

__device__ softmax_state combine(softmax_state a, softmax_state b) {
    if (b.max > a.max || (b.max == a.max && b.arg < a.arg)) {
        softmax_state t = a;
        a = b;
        b = t;
    }
    // a holds the larger max (or the earlier index among equal ones)
    float sum = a.sum + (b.sum > 0.0f ? b.sum * __expf(b.max - a.max) : 0.0f);
    return softmax_state{a.max, sum, a.arg};
}

__device__ softmax_state warp_combine(softmax_state s) {
    for (int o = 16; o > 0; o >>= 1) {
        softmax_state other{__shfl_xor_sync(0xffffffffu, s.max, o),
                            __shfl_xor_sync(0xffffffffu, s.sum, o),
                            __shfl_xor_sync(0xffffffffu, s.arg, o)};
        s = combine(s, other);
    }
    return s;
}

__global__ void cross_entropy_kernel(bf16 *logits, const int32_t *targets, float scale,
                                     float *row_loss, float *correct, int V) {
    __shared__ softmax_state partial[CE_THREADS / 32];
    __shared__ float target_logit;
    int t = blockIdx.x, y = targets[t];
    bf16 *row = logits + (size_t)t * V;
    if (y < 0) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] = to_bf16(0.0f);
        if (threadIdx.x == 0) {
            row_loss[t] = 0.0f;
            if (correct) correct[t] = 0.0f;
        }
        return;
    }
    softmax_state s{-INFINITY, 0.0f, V};
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float x = to_f32(row[j]);
        if (j == y) target_logit = x;
        s = combine(s, softmax_state{x, 1.0f, j});
    }
    s = warp_combine(s);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    s = partial[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) s = combine(s, partial[w]);
    float inv = 1.0f / s.sum;
    if (threadIdx.x == 0) {
        row_loss[t] = s.max + logf(s.sum) - target_logit;
        if (correct) correct[t] = s.arg == y ? 1.0f : 0.0f;
    }
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float p = __expf(to_f32(row[j]) - s.max) * inv;
        row[j] = to_bf16(scale * (p - (j == y ? 1.0f : 0.0f)));
    }
}

extern "C" void weft_cuda_cross_entropy(weft_cuda_stream s, void *logits, const int32_t *targets,
                                        float scale, float *row_loss, float *correct, int T,
                                        int V) {
    if (T == 0) return;
    WEFT_LAUNCH(cross_entropy_kernel, T, CE_THREADS, 0, s, (bf16 *)logits, targets, scale, row_loss,
                correct, V);
}
