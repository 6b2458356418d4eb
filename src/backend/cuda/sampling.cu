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

// A row's processed weights exp((l - max) / temperature) of the tokens the filters keep (the rank
// cut, then min_p: a weight of at least min_p, the largest being 1), 0 elsewhere, in double as
// the host's sampling computes them. Walked in token order: a thread walks its own span from its
// first token with a fresh copy, which keeps the rank of the cut's ties it passes.
struct processed_walk {
    const bf16 *row;
    float max_logit, temperature;
    rank_cut cut;
    double min_p;
    int rank; // ties of the cut's key before the walk's next token
    __device__ double operator()(int i) {
        bool ranked = within_cut(cut, logit_key(row + i), &rank);
        double w = token_weight(to_f32(row[i]), max_logit, temperature);
        return ranked && w >= min_p ? w : 0.0;
    }
};

// The processed walk of a row whose largest logit is max_logit (every thread of the block calls).
__device__ processed_walk processed_of(const bf16 *row, int V, float max_logit, float temperature,
                                       draw_filters f) {
    span own = own_span(V);
    rank_cut cut = rank_filters(row, V, own, max_logit, temperature, f);
    int rank0 = cut.key >= 0 ? ties_before(row, own, cut.key) : 0;
    return processed_walk{row, max_logit, temperature, cut, f.min_p, rank0};
}

// Each span's weight summed into scan (SAMPLE_SPANS, shared), then scanned: the cumulative weight
// at every span's end, the same additions in the same order for every row; returns the total, and
// into *weight_x (shared) the weight of token x (none: x < 0), to every thread. *last_kept
// (shared) receives the last token of nonzero weight.
template <typename Walk>
__device__ double span_scan(int V, Walk walk, double *scan, int x, double *weight_x,
                            int *last_kept) {
    span own = own_span(V);
    int t = (int)threadIdx.x, mine_last = -1;
    double mine = 0.0;
    for (int i = own.lo; i < own.hi; i++) {
        double w = walk(i);
        mine += w;
        if (w > 0.0) mine_last = i;
        if (i == x) *weight_x = w;
    }
    if (t < SAMPLE_SPANS) scan[t] = mine;
    if (t == 0) *last_kept = -1;
    __syncthreads();
    atomicMax(last_kept, mine_last); // a max: the same whatever the order
    inclusive_scan(scan);
    return scan[SAMPLE_SPANS - 1];
}

// The total of a walk's weights (span_scan's bits) and into *weight_x the weight of token x.
template <typename Walk> __device__ double walked_total(int V, Walk walk, int x, double *weight_x) {
    __shared__ double scan[SAMPLE_SPANS], at_x;
    __shared__ int last_kept;
    double total = span_scan(V, walk, scan, x, &at_x, &last_kept);
    *weight_x = at_x;
    __syncthreads(); // scan and at_x are reused by the next call
    return total;
}

// The first token whose cumulative weight in token order exceeds u times the total (into *total,
// span_scan's), to every thread: the thread whose span holds the point walks it.
template <typename Walk> __device__ int draw_walked(int V, double u, Walk walk, double *total) {
    __shared__ double scan[SAMPLE_SPANS], unused;
    __shared__ int chosen, last_kept;
    span own = own_span(V);
    int t = (int)threadIdx.x;
    if (t == 0) chosen = -1;
    double mass = span_scan(V, walk, scan, -1, &unused, &last_kept), target = u * mass;
    double before = t > 0 && t < SAMPLE_SPANS ? scan[t - 1] : 0.0;
    if (t < SAMPLE_SPANS && before <= target && target < scan[t]) { // at most one span
        double cumulative = before;
        int mine_last = -1;
        bool found = false;
        for (int i = own.lo; i < own.hi && !found; i++) {
            double w = walk(i);
            cumulative += w;
            if (w > 0.0) mine_last = i;
            found = target < cumulative;
        }
        chosen = mine_last; // past the walk's end: round-off between the scan's sums and the walk's
    }
    __syncthreads();
    int token = chosen >= 0 ? chosen : last_kept; // u beyond the rounded total
    *total = mass;
    __syncthreads(); // chosen and scan are reused by the next call
    return token;
}

// Speculative sampling's residual max(0, p - q) of two processed rows (each over its total).
struct residual_walk {
    processed_walk p, q;
    double mass_p, mass_q;
    __device__ double operator()(int i) {
        double r = p(i) / mass_p - q(i) / mass_q;
        return r > 0.0 ? r : 0.0;
    }
};

// The bits the logprobs op gives token y of a row with softmax state s.
__device__ __forceinline__ float base_logprob(const bf16 *row, softmax_state s, int y) {
    return -(s.max + logf(s.sum) - to_f32(row[y])); // logprobs_kernel's
}

// A token drawn at u from the row's processed distribution (its softmax state s), to every
// thread; its log-probability under that distribution into *processed. Greedy: the first
// largest logit, processed 0.
__device__ int draw_processed(const bf16 *row, int V, softmax_state s, float temperature,
                              draw_filters filters, double u, float *processed) {
    *processed = 0.0f;
    if (temperature == 0.0f) return s.arg;
    processed_walk walk = processed_of(row, V, s.max, temperature, filters);
    double mass;
    int token = draw_walked(V, u, walk, &mass);
    *processed = (float)log(token_weight(to_f32(row[token]), s.max, temperature) / mass);
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
    float processed_logp;
    int token = draw_processed(row, V, s, temperature, filters, u[blockIdx.x], &processed_logp);
    if (threadIdx.x == 0) {
        tokens[blockIdx.x] = token, processed[blockIdx.x] = processed_logp;
        logprob[blockIdx.x] = base_logprob(row, s, token);
    }
}

// One sequence's drafts checked at depth d against the target row p (whose softmax state is sp):
// the token emitted there, into *processed its log-probability under p's processed distribution;
// *accepted whether it is the draft. Greedy: the draft passes where it is p's first largest
// logit, which is emitted otherwise. Else with the processed weights of p and of the draft's row
// q: x passes where u_accept q(x) < p(x), else the token is drawn at u_residual from max(0, p - q)
// (from p where rounding left that no mass).
template <int VEC>
__device__ int check_draft(const bf16 *p, softmax_state sp, const bf16 *q, int x, double u_accept,
                           double u_residual, int V, float temperature, draw_filters filters,
                           float *processed, bool *accepted) {
    *processed = 0.0f;
    if (temperature == 0.0f) {
        *accepted = x == sp.arg;
        return sp.arg;
    }
    __shared__ float unused;
    processed_walk pw = processed_of(p, V, sp.max, temperature, filters);
    __syncthreads();
    softmax_state sq = row_softmax<VEC>(q, V, -1, &unused);
    processed_walk qw = processed_of(q, V, sq.max, temperature, filters);
    double px, qx, mass_p = walked_total(V, pw, x, &px), mass_q = walked_total(V, qw, x, &qx);
    int token = x;
    *accepted = u_accept * (qx / mass_q) < px / mass_p;
    if (!*accepted) {
        double mass_r;
        token = draw_walked(V, u_residual, residual_walk{pw, qw, mass_p, mass_q}, &mass_r);
        if (!(mass_r > 0.0)) token = draw_walked(V, u_residual, pw, &mass_r);
    }
    *processed = (float)log(token_weight(to_f32(p[token]), sp.max, temperature) / mass_p);
    return token;
}

// One block a sequence: its drafts checked in order (check_draft) until one fails, or the bonus
// token drawn from the row after the last (sample_kernel's draw). A block an SM at most: with
// two rows' filters it spilled at the sample kernel's register budget.
template <int VEC>
__global__ void __launch_bounds__(CE_THREADS, 1)
    verify_kernel(const bf16 *logits, const bf16 *draft_logits, const int32_t *draft_tokens,
                  const int32_t *index, const double *u, int k, int V, float temperature,
                  draw_filters filters, int32_t *tokens, float *logprob, float *processed,
                  int32_t *count) {
    wait_for_earlier_kernels();
    __shared__ float unused;
    const int32_t *ix = index + (size_t)blockIdx.x * (2 + k), *q_rows = ix + 2;
    const double *uu = u + (size_t)blockIdx.x * (2 * k + 1);
    int p_row = ix[0], n_drafts = ix[1], out = (int)blockIdx.x * (k + 1), d = 0;
    for (;; d++) {
        const bf16 *p = logits + (size_t)(p_row + d) * V;
        softmax_state sp = row_softmax<VEC>(p, V, -1, &unused);
        __syncthreads(); // row_softmax's partial sums are reused
        float processed_logp;
        bool accepted = false;
        int token = d < n_drafts
                        ? check_draft<VEC>(p, sp, draft_logits + (size_t)q_rows[d] * V,
                                           draft_tokens[q_rows[d]], uu[d], uu[k + d], V,
                                           temperature, filters, &processed_logp, &accepted)
                        : draw_processed(p, V, sp, temperature, filters, uu[2 * k],
                                         &processed_logp);
        if (threadIdx.x == 0) {
            tokens[out + d] = token, processed[out + d] = processed_logp;
            logprob[out + d] = base_logprob(p, sp, token);
        }
        __syncthreads();
        if (!accepted) break;
    }
    if (threadIdx.x == 0) count[blockIdx.x] = d + 1;
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

extern "C" void weft_cuda_verify_drafts(weft_cuda_stream s, const void *logits,
                                        const void *draft_logits, const int32_t *draft_tokens,
                                        const int32_t *index, const double *u, int n, int k, int V,
                                        float temperature, int top_k, double top_p, double min_p,
                                        int32_t *tokens, float *logprob, float *processed,
                                        int32_t *count) {
    if (n == 0) return;
    WEFT_LAUNCH_VECTORIZED(verify_kernel, vector_width(V, logits, draft_logits), n, CE_THREADS,
                           0, s, (const bf16 *)logits, (const bf16 *)draft_logits, draft_tokens,
                           index, u, k, V, temperature, draw_filters{top_k, top_p, min_p}, tokens,
                           logprob, processed, count);
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
