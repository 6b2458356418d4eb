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

template <int VEC>
__global__ void cross_entropy_kernel(bf16 *logits, const int32_t *targets, float scale,
                                     float *row_loss, float *correct, int V) {
    __shared__ softmax_state partial[CE_THREADS / 32];
    __shared__ float target_logit;
    int t = blockIdx.x, y = targets[t];
    bf16 *row = logits + (size_t)t * V;
    if (y < 0) {
        bf16_vec<VEC> zeros = {};
        for (int j = threadIdx.x * VEC; j < V; j += blockDim.x * VEC) zeros.store(row + j);
        if (threadIdx.x == 0) {
            row_loss[t] = 0.0f;
            if (correct) correct[t] = 0.0f;
        }
        return;
    }
    softmax_state s{-INFINITY, 0.0f, V};
    for (int j = threadIdx.x * VEC; j < V; j += blockDim.x * VEC) {
        bf16_vec<VEC> x;
        x.load(row + j);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            if (j + k == y) target_logit = x.x[k];
            s = combine(s, softmax_state{x.x[k], 1.0f, j + k});
        }
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
    for (int j = threadIdx.x * VEC; j < V; j += blockDim.x * VEC) {
        bf16_vec<VEC> x;
        x.load(row + j);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float p = __expf(x.x[k] - s.max) * inv;
            x.x[k] = scale * (p - (j + k == y ? 1.0f : 0.0f));
        }
        x.store(row + j);
    }
}

extern "C" void weft_cuda_cross_entropy(weft_cuda_stream s, void *logits, const int32_t *targets,
                                        float scale, float *row_loss, float *correct, int T,
                                        int V) {
    if (T == 0) return;
    WEFT_LAUNCH_VECTORIZED(cross_entropy_kernel, vector_width(V, logits), T, CE_THREADS, 0, s,
                           (bf16 *)logits, targets, scale, row_loss, correct, V);
}
