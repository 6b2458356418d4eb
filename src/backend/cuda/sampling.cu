// Token draws on the device, for the rollout engine's steps without top-k, top-p or min-p: the
// host sends one uniform number per draw and reads back a token and its log-probability, not the
// (draws, vocab) logits. One block per draw; thread t owns the contiguous tokens [t·per,
// (t + 1)·per) of the row, so a block-wide scan of the threads' weights (in double, a fixed
// order) is the cumulative weight in token order at every thread's boundary, and the one thread
// whose span holds the drawn point walks it. A draw depends on its row and u alone, never on the
// other draws of the launch.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

#include <limits.h>
#include <math.h>

enum { SAMPLE_THREADS = 256 };

namespace {

struct arg_max {
    float value;
    int index;
};

// The larger value, the smaller index among equal ones: the first largest logit.
__device__ __forceinline__ arg_max better(arg_max a, arg_max b) {
    return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

// The first largest logit of the row, to every thread of the block.
__device__ arg_max row_arg_max(const bf16 *row, int lo, int hi, arg_max *partial) {
    arg_max m = {-INFINITY, INT_MAX};
    for (int i = lo; i < hi; i++) m = better(m, arg_max{to_f32(row[i]), i});
    for (int o = 16; o > 0; o >>= 1)
        m = better(m, arg_max{__shfl_xor_sync(0xffffffffu, m.value, o),
                              __shfl_xor_sync(0xffffffffu, m.index, o)});
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = m;
    __syncthreads();
    m = partial[0];
    for (int w = 1; w < SAMPLE_THREADS / 32; w++) m = better(m, partial[w]);
    return m;
}

// In place: scan[t] becomes the sum of scan[0 .. t], the same additions in the same order for
// every row (Hillis-Steele).
__device__ void inclusive_scan(double *scan) {
    for (int offset = 1; offset < SAMPLE_THREADS; offset *= 2) {
        double add = (int)threadIdx.x >= offset ? scan[threadIdx.x - offset] : 0.0;
        __syncthreads();
        scan[threadIdx.x] += add;
        __syncthreads();
    }
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const bf16 *logits, const int32_t *rows, const double *u, int V,
                  float temperature, int32_t *tokens, float *processed) {
    wait_for_earlier_kernels();
    __shared__ arg_max partial[SAMPLE_THREADS / 32];
    __shared__ double scan[SAMPLE_THREADS];
    __shared__ int chosen, last_kept;
    const bf16 *row = logits + (size_t)rows[blockIdx.x] * V;
    int per = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    int lo = min((int)threadIdx.x * per, V), hi = min(lo + per, V);
    arg_max best = row_arg_max(row, lo, hi, partial);
    if (temperature == 0.0f) {
        if (threadIdx.x == 0) tokens[blockIdx.x] = best.index, processed[blockIdx.x] = 0.0f;
        return;
    }
    // Weights exp((l - max) / temperature) in double, as the host's sampling computes them.
    double max_logit = best.value, mine = 0.0;
    int mine_last = -1; // the thread's last token of nonzero weight
    for (int i = lo; i < hi; i++) {
        double w = exp(((double)to_f32(row[i]) - max_logit) / temperature);
        mine += w;
        if (w > 0.0) mine_last = i;
    }
    scan[threadIdx.x] = mine;
    if (threadIdx.x == 0) chosen = -1, last_kept = -1;
    __syncthreads();
    atomicMax(&last_kept, mine_last); // a max: the same whatever the order
    inclusive_scan(scan);
    double mass = scan[SAMPLE_THREADS - 1], target = u[blockIdx.x] * mass;
    double before = threadIdx.x > 0 ? scan[threadIdx.x - 1] : 0.0;
    if (before <= target && target < scan[threadIdx.x]) { // at most one thread's span
        double cumulative = before;
        for (int i = lo; i < hi; i++) {
            cumulative += exp(((double)to_f32(row[i]) - max_logit) / temperature);
            if (target < cumulative) {
                chosen = i;
                break;
            }
        }
        if (chosen < 0) chosen = mine_last; // round-off between the scan's sums and the walk's
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int token = chosen >= 0 ? chosen : last_kept; // u beyond the rounded total
        double w = exp(((double)to_f32(row[token]) - max_logit) / temperature);
        tokens[blockIdx.x] = token;
        processed[blockIdx.x] = (float)log(w / mass);
    }
}

} // namespace

extern "C" void weft_cuda_sample_tokens(weft_cuda_stream s, const void *logits,
                                        const int32_t *rows, const double *u, int n, int V,
                                        float temperature, int32_t *tokens, float *processed) {
    if (n == 0) return;
    WEFT_LAUNCH(sample_kernel, n, SAMPLE_THREADS, 0, s, (const bf16 *)logits, rows, u, V,
                temperature, tokens, processed);
}

namespace {

__global__ void take_tokens_kernel(int32_t *tokens, const int32_t *drawn, const int32_t *from,
                                   int n) {
    wait_for_earlier_kernels();
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < n; r += gridDim.x * blockDim.x)
        if (from[r] >= 0) tokens[r] = drawn[from[r]];
}

} // namespace

extern "C" void weft_cuda_take_tokens(weft_cuda_stream s, int32_t *tokens, const int32_t *drawn,
                                      const int32_t *from, int n) {
    if (n == 0) return;
    int threads = 256, blocks = (n + threads - 1) / threads;
    WEFT_LAUNCH(take_tokens_kernel, blocks < 64 ? blocks : 64, threads, 0, s, tokens, drawn, from,
                n);
}
