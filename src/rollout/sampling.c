#include "rollout/sampling.h"

#include <math.h>
#include <string.h>

// ---------------------------------------------------------------------------------------------
// The uniform: Philox-4x64-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as
// 1, 2, 3", SC 2011; the Random123 library, numpy.random.Philox, JAX and cuRAND's Philox family).
// Philox is a keyed bijection of a 256-bit counter, made for this use: no state, any counter value
// computed directly, and outputs for distinct counters that behave as independent uniforms (it
// passes TestU01's BigCrush with the counter stepped along any one of its words, which is how every
// stream here advances; 10 rounds is Random123's default, a margin over the fewest that pass). So
// the counter is (position, sample, prompt, 0) and the key (seed, 0): successive positions, the n
// samples of a prompt and the prompts are distinct counters, and, the map being a bijection, never
// collide the way a 64-bit hash of the four numbers could. A simpler 64-bit mix of a hash
// (SplitMix64) would be one word of output from a 64-bit input, so four 64-bit counters would have
// to be folded first. A draw uses the top 53 bits of one of the block's four words: the first for
// the token, the second for a draft token, the third for speculative decoding's accept test.

enum { PHILOX_ROUNDS = 10 };

static void philox_round(uint64_t counter[4], const uint64_t key[2]) {
    const unsigned __int128 p0 = (unsigned __int128)0xD2E7470EE14C6C93ULL * counter[0];
    const unsigned __int128 p1 = (unsigned __int128)0xCA5A826395121157ULL * counter[2];
    const uint64_t hi0 = (uint64_t)(p0 >> 64), lo0 = (uint64_t)p0;
    const uint64_t hi1 = (uint64_t)(p1 >> 64), lo1 = (uint64_t)p1;
    counter[0] = hi1 ^ counter[1] ^ key[0];
    counter[1] = lo1;
    counter[2] = hi0 ^ counter[3] ^ key[1];
    counter[3] = lo0;
}

double weft_sampling_uniform(uint64_t seed, uint64_t prompt, uint64_t sample, uint64_t position,
                             weft_draw_kind kind) {
    uint64_t counter[4] = {position, sample, prompt, 0}, key[2] = {seed, 0};
    for (int round = 0; round < PHILOX_ROUNDS; round++) {
        if (round > 0) { // the key schedule: Weyl increments (golden ratio, sqrt(3) - 1)
            key[0] += 0x9E3779B97F4A7C15ULL;
            key[1] += 0xBB67AE8584CAA73BULL;
        }
        philox_round(counter, key);
    }
    return (double)(counter[kind] >> 11) * 0x1.0p-53;
}

// ---------------------------------------------------------------------------------------------
// The processed distribution. Probabilities are kept unnormalized until the end, as weights
// exp((z - z_max) / T): the most likely token weighs exactly 1, so min-p's threshold is min_p
// itself, and top-p compares a cumulative weight with top_p times the survivors' total weight.
// The filters that rank tokens (top-k, top-p) need no sort: each keeps the tokens ranked at or
// before one token, which quickselect finds in expected linear time (a sort of V = 150k tokens per
// draw costs tens of milliseconds). Quickselect runs on candidates only: the tokens of the heaviest
// power-of-two weight buckets that together hold k tokens or the nucleus's weight, usually a few
// hundred of V. The nucleus's cumulative weight is summed in partition order rather than rank
// order: the same up to round-off.

typedef struct ranked_token {
    double weight;
    int id;
} ranked_token;

// The ranking of the header: higher probability first, ties to the lower token id. A strict total
// order (ids differ), so quickselect never meets equal keys.
static bool less_likely(ranked_token a, ranked_token b) {
    return a.weight < b.weight || (a.weight == b.weight && a.id > b.id);
}

enum { N_BUCKETS = 64 };

// Bucket b holds the weights in [2^-b, 2^(1-b)) (the most likely token, weight 1, is in bucket 0);
// the last one also holds everything lighter, zero, and a NaN from a NaN logit.
static int weight_bucket(double weight) {
    uint64_t bits;
    memcpy(&bits, &weight, sizeof bits);
    const unsigned below_one = 1023u - (unsigned)(bits >> 52); // 1023: the exponent bias
    return below_one < N_BUCKETS - 1 ? (int)below_one : N_BUCKETS - 1;
}

// Gathers into order the tokens of the heaviest buckets that together hold at least k tokens and
// `target` weight: a set of the most likely tokens (every gathered one outweighs every other) that
// holds top-k's survivors or top-p's nucleus. Returns how many.
static int gather_candidates(const double *weight, int V, int k, double target,
                             ranked_token *order) {
    int count[N_BUCKETS] = {0};
    double bucket_mass[N_BUCKETS] = {0};
    for (int i = 0; i < V; i++) {
        const int b = weight_bucket(weight[i]);
        count[b]++;
        bucket_mass[b] += weight[i];
    }
    int last = 0, n = count[0];
    for (double held = bucket_mass[0]; last < N_BUCKETS - 1 && (n < k || held < target);) {
        n += count[++last];
        held += bucket_mass[last];
    }
    int gathered = 0;
    for (int i = 0; i < V; i++)
        if (weight_bucket(weight[i]) <= last) order[gathered++] = (ranked_token){weight[i], i};
    return gathered;
}

static void swap_tokens(ranked_token *order, int i, int j) {
    const ranked_token t = order[i];
    order[i] = order[j];
    order[j] = t;
}

// The median of three tokens of order, by rank: the index of the one between the other two.
static int median_of_three(const ranked_token *order, int a, int b, int c) {
    if (less_likely(order[a], order[b])) {
        if (less_likely(order[b], order[c])) return b;
        return less_likely(order[a], order[c]) ? c : a;
    }
    if (less_likely(order[a], order[c])) return a;
    return less_likely(order[b], order[c]) ? c : b;
}

// Partitions order[lo, hi) (hi - lo >= 2) around a pivot: the tokens more likely than the pivot,
// the pivot, the rest. Returns the pivot's index and in *mass_before the weight of the tokens
// before it. The pivot is the median of three tokens at positions drawn from a hash of the range:
// fixed positions (first, middle, last) meet rows they split badly again and again (an interleaved
// ramp of logits took 25 times as long), positions no row knows of do not.
static int partition(ranked_token *order, int lo, int hi, double *mass_before) {
    uint64_t h = ((uint64_t)lo << 32 | (uint32_t)hi) * 0x9E3779B97F4A7C15ULL;
    h = (h ^ (h >> 29)) * 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    const uint64_t n = (uint64_t)(hi - lo);
    const int last = hi - 1;
    swap_tokens(order, median_of_three(order, lo + (int)(h % n), lo + (int)((h >> 21) % n),
                                       lo + (int)((h >> 42) % n)),
                last);
    const ranked_token pivot = order[last];
    int store = lo;
    *mass_before = 0;
    for (int i = lo; i < last; i++)
        if (less_likely(pivot, order[i])) {
            *mass_before += order[i].weight;
            swap_tokens(order, i, store++);
        }
    swap_tokens(order, store, last);
    return store;
}

// Rearranges order[0, n) so that its k-th most likely token is order[k - 1], the more likely ones
// before it.
static void select_kth_most_likely(ranked_token *order, int n, int k) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        double unused;
        const int p = partition(order, lo, hi, &unused);
        if (p == k - 1) return;
        if (p < k - 1) lo = p + 1;
        else hi = p;
    }
}

// The token of order[0, n) whose cumulative weight in rank order, its own included, first reaches
// target: the nucleus's last token. (If round-off keeps the total below target, the least likely.)
static ranked_token nucleus_crossing(ranked_token *order, int n, double target) {
    int lo = 0, hi = n; // the crossing lies in [lo, hi); target: what remains after order[0, lo)
    while (hi - lo > 1) {
        double before;
        const int p = partition(order, lo, hi, &before);
        if (before >= target) {
            hi = p;
        } else if (before + order[p].weight >= target) {
            return order[p];
        } else {
            target -= before + order[p].weight;
            lo = p + 1;
        }
    }
    return order[lo];
}

// Top-k, then top-p on the survivors: false if both are off; else true and in *last_kept the least
// likely token they keep (they keep exactly the tokens ranked at or before it). mass: the total
// weight of all V tokens. order: V ranked_token of scratch.
static bool rank_filters(const weft_sampling_config *c, const double *weight, int V, double mass,
                         ranked_token *order, ranked_token *last_kept) {
    const bool top_k_on = c->top_k > 0 && c->top_k < V, top_p_on = c->top_p < 1;
    if (!top_k_on && !top_p_on) return false;
    const int k = top_k_on ? c->top_k : 1;
    int n = gather_candidates(weight, V, k, top_k_on ? 0 : c->top_p * mass, order);
    if (top_k_on) {
        select_kth_most_likely(order, n, k);
        n = k;
        *last_kept = order[n - 1];
        mass = 0; // top-p sees the top-k survivors renormalized
        for (int j = 0; j < n; j++) mass += order[j].weight;
    }
    if (top_p_on) *last_kept = nucleus_crossing(order, n, c->top_p * mass);
    return true;
}

void weft_sampling_distribution(const weft_sampling_config *c, const float *logits, int V,
                                double *probs, void *scratch) {
    WEFT_CHECK(V > 0, "sampling: a row of %d logits", V);
    int first_max = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[first_max]) first_max = i;
    if (c->temperature == 0) {
        memset(probs, 0, (size_t)V * sizeof *probs);
        probs[first_max] = 1;
        return;
    }
    const double max_logit = logits[first_max];
    WEFT_CHECK(isfinite(max_logit), "sampling: the largest logit is %g, not a finite number",
               max_logit);
    double mass = 0;
    for (int i = 0; i < V; i++) { // a float difference is exact in double
        probs[i] = exp(((double)logits[i] - max_logit) / c->temperature);
        mass += probs[i];
    }
    ranked_token last_kept;
    const bool ranked = rank_filters(c, probs, V, mass, scratch, &last_kept);
    double kept_mass = 0; // at least the most likely token's weight, 1
    for (int i = 0; i < V; i++) {
        const bool kept = probs[i] >= c->min_p && // min_p times the largest weight, 1
                          !(ranked && less_likely((ranked_token){probs[i], i}, last_kept));
        if (!kept) probs[i] = 0;
        kept_mass += probs[i];
    }
    for (int i = 0; i < V; i++) probs[i] /= kept_mass;
}

size_t weft_sampling_scratch_bytes(int V) {
    // weft_sample_token's probabilities, then the ranking's candidates.
    return (size_t)V * (sizeof(double) + sizeof(ranked_token));
}

int weft_sample_token(const weft_sampling_config *c, const float *logits, int V, double u,
                      double *logprob_processed, void *scratch) {
    double *probs = scratch;
    weft_sampling_distribution(c, logits, V, probs, probs + V);
    int token = -1;
    double cumulative = 0;
    for (int i = 0; i < V; i++) {
        if (probs[i] == 0) continue;
        token = i;
        cumulative += probs[i];
        if (u < cumulative) break; // else, past the last kept token, u beyond the rounded total
    }
    WEFT_CHECK(token >= 0, "sampling: the processed distribution kept no token");
    if (logprob_processed) *logprob_processed = log(probs[token]);
    return token;
}
