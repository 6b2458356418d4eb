// Token draws on the device, for the rollout engine's steps (top-k, top-p and min-p included): the
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
template <typename T> __device__ void inclusive_scan(T *scan) {
    for (int offset = 1; offset < SAMPLE_SPANS; offset *= 2) {
        int t = (int)threadIdx.x;
        T add = t < SAMPLE_SPANS && t >= offset ? scan[t - offset] : T(0);
        __syncthreads();
        if (t < SAMPLE_SPANS) scan[t] += add;
        __syncthreads();
    }
}

// ------------------------------------------------------------------------ top-k and top-p ----
// The filters that rank tokens keep the tokens ranked at or before one (higher logit first, ties
// to the lower id; a bf16 logit's 16 bits order the row, and equal logits are equal
// probabilities), so what they keep is a cut: the tokens whose key is above `key`, and the first
// `ties` tokens of that key in id order. The cut is found with no sort, as a radix select over
// the keys in two passes of 256 bins (the high byte, then the low byte within the chosen bin),
// the bins holding token counts for top-k and the survivors' weights for top-p. Weights are summed
// in fixed point (2^-40 units: integer additions, the same sums whatever order the atomics take),
// so the nucleus's boundary is the host's up to that round-off.

enum { KEY_BINS = 256 };
constexpr double MASS_UNIT = 0x1p40;

struct rank_cut {
    int key, ties; // key -1: every token kept
};

struct draw_filters { // off: top_k 0 or >= V, top_p 1, min_p 0
    int top_k;
    double top_p, min_p;
};

// The order-preserving key of a bf16 logit (-0 ranks as +0).
__device__ __forceinline__ int logit_key(const bf16 *x) {
    unsigned b = *reinterpret_cast<const unsigned short *>(x);
    if (b == 0x8000u) b = 0;
    return (int)(b & 0x8000u ? ~b & 0xFFFFu : b | 0x8000u);
}

// The bf16 logit of a key (logit_key's inverse).
__device__ __forceinline__ bf16 key_logit(int key) {
    unsigned short b = (unsigned short)(key & 0x8000 ? key & 0x7FFF : ~key & 0xFFFF);
    return *reinterpret_cast<const bf16 *>(&b);
}

__device__ __forceinline__ double token_weight(float logit, float max_logit, float temperature) {
    return exp(((double)logit - max_logit) / temperature); // the host's weight, in double
}

// The contiguous tokens [lo, hi) of the row that thread t owns (none past the first SAMPLE_SPANS).
struct span {
    int lo, hi;
};
__device__ __forceinline__ span own_span(int V) {
    int per = (V + SAMPLE_SPANS - 1) / SAMPLE_SPANS, t = (int)threadIdx.x;
    int lo = t < SAMPLE_SPANS ? min(t * per, V) : V;
    return span{lo, min(lo + per, V)};
}

// How many tokens of the cut's key lie in the spans before this thread's: its first tie's rank.
__device__ int ties_before(const bf16 *row, span own, int key) {
    __shared__ int count[SAMPLE_SPANS];
    int t = (int)threadIdx.x, mine = 0;
    for (int i = own.lo; i < own.hi && key >= 0; i++) mine += logit_key(row + i) == key;
    if (t < SAMPLE_SPANS) count[t] = mine;
    __syncthreads();
    inclusive_scan(count);
    int before = t < SAMPLE_SPANS ? count[t] - mine : 0;
    __syncthreads(); // count is reused by the next call
    return before;
}

// Whether the token of `key` at tie rank *rank (advanced past it when of the cut's key) is kept.
__device__ __forceinline__ bool within_cut(rank_cut cut, int key, int *rank) {
    if (cut.key < 0 || key > cut.key) return true;
    return key == cut.key && (*rank)++ < cut.ties;
}

// The cut that keeps the tokens ranked at or before the first whose cumulative amount, in rank
// order among those `prior` keeps, reaches target: amount(i) is a token's (an integer; the same
// for tokens of one key), 0 outside prior.
template <typename Amount>
__device__ rank_cut cut_at(const bf16 *row, span own, rank_cut prior, int prior_rank0,
                           unsigned long long target, Amount amount) {
    __shared__ unsigned long long bins[KEY_BINS];
    __shared__ unsigned long long above_bin;
    __shared__ int chosen;
    int t = (int)threadIdx.x, high = -1;
    unsigned long long above = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int b = t; b < KEY_BINS; b += blockDim.x) bins[b] = 0;
        __syncthreads();
        int rank = prior_rank0;
        for (int i = own.lo; i < own.hi; i++) {
            int key = logit_key(row + i);
            if (!within_cut(prior, key, &rank) || (pass == 1 && key >> 8 != high)) continue;
            atomicAdd(&bins[pass == 0 ? key >> 8 : key & 0xFF], amount(row[i]));
        }
        __syncthreads();
        if (t == 0) { // from the highest bin down, to the one where the total reaches target
            unsigned long long total = above;
            int b = KEY_BINS - 1;
            for (; b > 0 && total + bins[b] < target; b--) total += bins[b];
            chosen = b, above_bin = total;
        }
        __syncthreads();
        if (pass == 0) high = chosen;
        above = above_bin;
        __syncthreads();
    }
    int key = high << 8 | chosen;
    if (prior.key >= 0 && key < prior.key) return prior; // round-off: target past the survivors
    unsigned long long each = amount(key_logit(key));
    unsigned long long need = target > above ? target - above : 0;
    int ties = each > 0 ? (int)((need + each - 1) / each) : 1; // need > 0: above < target
    if (prior.key == key && ties > prior.ties) ties = prior.ties; // round-off past the survivors
    return rank_cut{key, ties};
}

// Top-k, then top-p over its survivors (renormalized): the cut that keeps both's tokens.
__device__ rank_cut rank_filters(const bf16 *row, int V, span own, float max_logit,
                                 float temperature, draw_filters f) {
    rank_cut cut{-1, 0};
    if (f.top_k > 0 && f.top_k < V)
        cut = cut_at(row, own, cut, 0, (unsigned long long)f.top_k,
                     [](bf16) { return 1ull; });
    if (f.top_p >= 1.0) return cut;
    auto fixed = [=](bf16 x) {
        return (unsigned long long)llrint(token_weight(to_f32(x), max_logit, temperature) *
                                          MASS_UNIT);
    };
    __shared__ unsigned long long mass;
    if (threadIdx.x == 0) mass = 0;
    int rank0 = ties_before(row, own, cut.key), rank = rank0; // (also orders mass's zeroing)
    unsigned long long mine = 0;
    for (int i = own.lo; i < own.hi; i++)
        if (within_cut(cut, logit_key(row + i), &rank)) mine += fixed(row[i]);
    atomicAdd(&mass, mine);
    __syncthreads();
    unsigned long long target = (unsigned long long)ceil(f.top_p * (double)mass);
    return cut_at(row, own, cut, rank0, target > 0 ? target : 1, fixed);
}

// ---------------------------------------------------------------------------------- draws ----

// The token drawn at u from weights exp((l - max) / temperature) of the tokens the filters keep
// (the rank cut, then min_p: a weight of at least min_p, the largest being 1), in double as the
// host's sampling computes them, and into *processed its log-probability under them; to every
// thread.
__device__ int draw_at(const bf16 *row, int V, float max_logit, float temperature, double u,
                       rank_cut cut, double min_p, float *processed) {
    __shared__ double scan[SAMPLE_SPANS];
    __shared__ int chosen, last_kept;
    span own = own_span(V);
    int t = (int)threadIdx.x, rank0 = cut.key >= 0 ? ties_before(row, own, cut.key) : 0;
    auto weight = [&](int i, int *rank) {
        bool ranked = within_cut(cut, logit_key(row + i), rank);
        double w = token_weight(to_f32(row[i]), max_logit, temperature);
        return ranked && w >= min_p ? w : 0.0;
    };
    double mine = 0.0;
    int mine_last = -1, rank = rank0; // the thread's last token of nonzero weight
    for (int i = own.lo; i < own.hi; i++) {
        double w = weight(i, &rank);
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
        rank = rank0;
        for (int i = own.lo; i < own.hi; i++) {
            cumulative += weight(i, &rank);
            if (target < cumulative) {
                chosen = i;
                break;
            }
        }
        if (chosen < 0) chosen = mine_last; // round-off between the scan's sums and the walk's
    }
    __syncthreads();
    int token = chosen >= 0 ? chosen : last_kept; // u beyond the rounded total
    double w = token_weight(to_f32(row[token]), max_logit, temperature);
    *processed = (float)log(w / mass);
    return token;
}

// Two blocks an SM at most: ptxas's default register budget (three) spilled the filters' state.
template <int VEC>
__global__ void __launch_bounds__(CE_THREADS, 2)
    sample_kernel(const bf16 *logits, const int32_t *rows, const double *u, int V,
                  float temperature, draw_filters filters, int32_t *tokens, float *logprob,
                  float *processed) {
    wait_for_earlier_kernels();
    __shared__ float unused;
    const bf16 *row = logits + (size_t)rows[blockIdx.x] * V;
    softmax_state s = row_softmax<VEC>(row, V, -1, &unused);
    float processed_logp = 0.0f;
    int token = s.arg;
    if (temperature != 0.0f) {
        rank_cut cut = rank_filters(row, V, own_span(V), s.max, temperature, filters);
        token = draw_at(row, V, s.max, temperature, u[blockIdx.x], cut, filters.min_p,
                        &processed_logp);
    }
    if (threadIdx.x == 0) {
        tokens[blockIdx.x] = token, processed[blockIdx.x] = processed_logp;
        logprob[blockIdx.x] = -(s.max + logf(s.sum) - to_f32(row[token])); // logprobs_kernel's
    }
}

} // namespace

extern "C" void weft_cuda_sample_tokens(weft_cuda_stream s, const void *logits,
                                        const int32_t *rows, const double *u, int n, int V,
                                        float temperature, int top_k, double top_p,
                                        double min_p, int32_t *tokens, float *logprob,
                                        float *processed) {
    if (n == 0) return;
    WEFT_LAUNCH_VECTORIZED(sample_kernel, vector_width(V, logits), n, CE_THREADS, 0, s,
                           (const bf16 *)logits, rows, u, V, temperature,
                           draw_filters{top_k, top_p, min_p}, tokens, logprob, processed);
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
