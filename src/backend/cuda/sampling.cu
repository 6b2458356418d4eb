// Token draws on the device, for the rollout engine's steps without top-k, top-p or min-p: the
// host sends one uniform number per draw and reads back a token and its two log-probabilities, not
// the (draws, vocab) logits. One block per draw, which first finds its row's softmax state with
// the logprobs op's own code (softmax_row.cuh), coalesced: the first largest logit, which greedy
// takes, and the drawn token's log-prob under the model in the logprobs op's bits, with no row
// gather or second launch. With a temperature, the first SAMPLE_SPANS threads own the contiguous
// tokens [t·per, (t + 1)·per) of the row, so a scan of their weights (in double, a fixed order) is
// the cumulative weight in token order at every span's boundary, and the one thread whose span
// holds the drawn point walks it. A draw depends on its row and u alone, never on the other draws
// of the launch.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/softmax_row.cuh"

#include <math.h>

enum { SAMPLE_SPANS = 256 }; // of CE_THREADS

namespace {

// In place: scan[t] becomes the sum of scan[0 .. t] for t < SAMPLE_SPANS, the same additions in
// the same order for every row (Hillis-Steele); every thread of the block takes part.
__device__ void inclusive_scan(double *scan) {
    for (int offset = 1; offset < SAMPLE_SPANS; offset *= 2) {
        int t = (int)threadIdx.x;
        double add = t < SAMPLE_SPANS && t >= offset ? scan[t - offset] : 0.0;
        __syncthreads();
        if (t < SAMPLE_SPANS) scan[t] += add;
        __syncthreads();
    }
}

// The token drawn at u from weights exp((l - max) / temperature), in double as the host's
// sampling computes them, and into *processed its log-probability under them; to every thread.
__device__ int draw_at(const bf16 *row, int V, float max_logit, float temperature, double u,
                       float *processed) {
    __shared__ double scan[SAMPLE_SPANS];
    __shared__ int chosen, last_kept;
    int per = (V + SAMPLE_SPANS - 1) / SAMPLE_SPANS, t = (int)threadIdx.x;
    int lo = t < SAMPLE_SPANS ? min(t * per, V) : V, hi = min(lo + per, V);
    double mine = 0.0;
    int mine_last = -1; // the thread's last token of nonzero weight
    for (int i = lo; i < hi; i++) {
        double w = exp(((double)to_f32(row[i]) - max_logit) / temperature);
        mine += w;
        if (w > 0.0) mine_last = i;
    }
    if (t < SAMPLE_SPANS) scan[t] = mine;
    if (t == 0) chosen = -1, last_kept = -1;
    __syncthreads();
    atomicMax(&last_kept, mine_last); // a max: the same whatever the order
    inclusive_scan(scan);
    double mass = scan[SAMPLE_SPANS - 1], target = u * mass;
    double before = t > 0 && t < SAMPLE_SPANS ? scan[t - 1] : 0.0;
    if (t < SAMPLE_SPANS && before <= target && target < scan[t]) { // at most one span
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
    int token = chosen >= 0 ? chosen : last_kept; // u beyond the rounded total
    double w = exp(((double)to_f32(row[token]) - max_logit) / temperature);
    *processed = (float)log(w / mass);
    return token;
}

template <int VEC>
__global__ void __launch_bounds__(CE_THREADS)
    sample_kernel(const bf16 *logits, const int32_t *rows, const double *u, int V,
                  float temperature, int32_t *tokens, float *logprob, float *processed) {
    wait_for_earlier_kernels();
    __shared__ float unused;
    const bf16 *row = logits + (size_t)rows[blockIdx.x] * V;
    softmax_state s = row_softmax<VEC>(row, V, -1, &unused);
    float processed_logp = 0.0f;
    int token = temperature == 0.0f
                    ? s.arg
                    : draw_at(row, V, s.max, temperature, u[blockIdx.x], &processed_logp);
    if (threadIdx.x == 0) {
        tokens[blockIdx.x] = token, processed[blockIdx.x] = processed_logp;
        logprob[blockIdx.x] = -(s.max + logf(s.sum) - to_f32(row[token])); // logprobs_kernel's
    }
}

} // namespace

extern "C" void weft_cuda_sample_tokens(weft_cuda_stream s, const void *logits,
                                        const int32_t *rows, const double *u, int n, int V,
                                        float temperature, int32_t *tokens, float *logprob,
                                        float *processed) {
    if (n == 0) return;
    WEFT_LAUNCH_VECTORIZED(sample_kernel, vector_width(V, logits), n, CE_THREADS, 0, s,
                           (const bf16 *)logits, rows, u, V, temperature, tokens, logprob,
                           processed);
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
