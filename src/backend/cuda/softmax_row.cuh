// A row's softmax state over a large vocabulary, found by one block in one read (online
// softmax): the output heads' ops (cross_entropy.cu) and the device draws (sampling.cu) both take
// it from here, so a drawn token's log-prob has the bits the logprobs op gives the same row.
#pragma once
#include "backend/cuda/common.cuh"

#include <math.h>

enum { CE_THREADS = 512 }; // a row's block

// Running (max, sum of exp(x - max), first index of the max) of a set of logits.
struct softmax_state {
    float max, sum;
    int arg;
};

static __device__ softmax_state combine(softmax_state a, softmax_state b) {
    if (b.max > a.max || (b.max == a.max && b.arg < a.arg)) {
        softmax_state t = a;
        a = b;
        b = t;
    }
    // a holds the larger max (or the earlier index among equal ones)
    float sum = a.sum + (b.sum > 0.0f ? b.sum * __expf(b.max - a.max) : 0.0f);
    return softmax_state{a.max, sum, a.arg};
}

static __device__ softmax_state warp_combine(softmax_state s) {
    for (int o = 16; o > 0; o >>= 1) {
        softmax_state other{__shfl_xor_sync(0xffffffffu, s.max, o),
                            __shfl_xor_sync(0xffffffffu, s.sum, o),
                            __shfl_xor_sync(0xffffffffu, s.arg, o)};
        s = combine(s, other);
    }
    return s;
}

// The whole row's softmax state, returned to every thread of the block; *target_logit (shared)
// receives row[y].
template <int VEC>
static __device__ softmax_state row_softmax(const bf16 *row, int V, int y, float *target_logit) {
    __shared__ softmax_state partial[CE_THREADS / 32];
    softmax_state s{-INFINITY, 0.0f, V};
    for (int j = threadIdx.x * VEC; j < V; j += blockDim.x * VEC) {
        bf16_vec<VEC> x;
        x.load(row + j);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            if (j + k == y) *target_logit = x.x[k];
            s = combine(s, softmax_state{x.x[k], 1.0f, j + k});
        }
    }
    s = warp_combine(s);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    s = partial[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) s = combine(s, partial[w]);
    return s;
}
