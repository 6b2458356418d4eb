// Sampling draws from the processed distribution the header defines, and nothing else: for each
// setting (temperature 1 and 0.7, top-k, top-p at a temperature, min-p, and all of them at once)
// 20,000 tokens drawn with the counter-based uniforms of 20,000 sample indices match the exact
// distribution, computed here from the definition, by a Pearson chi-square test (p > 1e-3); no
// filtered-out token is ever drawn; the recorded log-prob is the exact one (1e-12). The same counts
// fail the test (p < 1e-3) against a nucleus without its crossing token and against a temperature
// off by 0.05, and draw tokens that ties broken to the higher id would forbid, so the test can
// fail. The uniforms are Philox-4x64-10's (known answers from Random123 and numpy), deterministic,
// uniform and uncorrelated along each counter. Greedy takes the first maximum with log-prob 0. On
// a larger vocabulary the library's distribution (candidate buckets, quickselect) is the
// definition's.
#include <math.h>

#include "../testing.h"
#include "rollout/sampling.h"

enum { V = 40, DRAWS = 20000, BINS = 20 };
static const uint64_t SEED = 20240611, POSITION = 17;

// A dominant token (7), two runners-up, a cluster where the filters cut (with ties: 11 and 34 at
// top-k 5's boundary, 4 and 6), a tail, and tokens no temperature can draw (13, 23, 26, 33).
static const float logits[V] = {
    0.9f,  0.3f,  -0.3f, 3.4f,  0.7f,   0.2f,  0.7f,  5.0f,  -1.7f,     0.5f,   //  0-9
    -2.5f, 0.95f, -0.8f, -1e30f, 0.25f, -1.1f, 1.35f, 0.6f,  0.0f,      -0.4f,  // 10-19
    0.45f, -2.0f, 3.5f,  -60.0f, 0.75f, -0.6f, -INFINITY, -3.5f, 0.55f, 0.8f,   // 20-29
    -1.4f, -0.05f, -0.9f, -1000.0f, 0.95f, -2.2f, -0.7f, -3.0f, 0.85f, 0.1f,   // 30-39
};

static weft_sampling_config sampling(double temperature, int top_k, double top_p, double min_p) {
    weft_sampling_config c = weft_sampling_config_default();
    c.temperature = temperature;
    c.top_k = top_k;
    c.top_p = top_p;
    c.min_p = min_p;
    return c;
}

// ---------------------------------------------------------------------------------------------
// The processed distribution, written from the header's definition as plainly as possible (a
// softmax, a full sort, one renormalization per filter), and wrong on purpose for the controls.

typedef enum { EXACT, NUCLEUS_WITHOUT_CROSSING_TOKEN, TIES_TO_HIGHER_ID } reference_variant;

static const double *sort_probs; // qsort's comparator has no context argument
static reference_variant sort_variant;

static int more_likely_first(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    if (sort_probs[i] != sort_probs[j]) return sort_probs[i] > sort_probs[j] ? -1 : 1;
    return sort_variant == TIES_TO_HIGHER_ID ? j - i : i - j;
}

// p over the kept tokens only, summing to 1.
static void keep_and_renormalize(double *p, const bool *kept, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += kept[i] ? p[i] : 0;
    for (int i = 0; i < n; i++) p[i] = kept[i] ? p[i] / sum : 0;
}

static void reference_distribution(const weft_sampling_config *c, const float *z, int n,
                                   reference_variant variant, double *p) {
    int *order = malloc((size_t)n * sizeof *order);
    bool *kept = malloc((size_t)n);
    int first_max = 0;
    for (int i = 0; i < n; i++) {
        if (z[i] > z[first_max]) first_max = i;
        order[i] = i;
        kept[i] = true;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) {
        p[i] = c->temperature == 0 ? i == first_max
                                   : exp(z[i] / c->temperature - z[first_max] / c->temperature);
        sum += p[i];
    }
    for (int i = 0; i < n; i++) p[i] /= sum;
    sort_probs = p;
    sort_variant = variant;
    qsort(order, (size_t)n, sizeof *order, more_likely_first);
    if (c->top_k > 0)
        for (int r = c->top_k; r < n; r++) kept[order[r]] = false;
    keep_and_renormalize(p, kept, n);
    double cumulative = 0;
    for (int r = 0; r < n && c->top_p < 1; r++) {
        const int i = order[r];
        if (!kept[i]) continue;
        const bool crosses = cumulative < c->top_p && cumulative + p[i] >= c->top_p;
        kept[i] = cumulative < c->top_p && !(crosses && variant == NUCLEUS_WITHOUT_CROSSING_TOKEN);
        cumulative += p[i];
    }
    keep_and_renormalize(p, kept, n);
    double p_max = 0;
    for (int i = 0; i < n; i++) p_max = fmax(p_max, p[i]);
    for (int i = 0; i < n; i++) kept[i] = kept[i] && p[i] >= c->min_p * p_max;
    keep_and_renormalize(p, kept, n);
    free(order);
    free(kept);
}

// exact: the definition's distribution of z (n) under c, which the library's must equal (same kept
// tokens, probabilities within 1e-12); returns how many tokens it keeps. library: n of scratch.
static int exact_distribution_is_the_librarys(const weft_sampling_config *c, const float *z, int n,
                                              double *exact, double *library, void *scratch) {
    reference_distribution(c, z, n, EXACT, exact);
    weft_sampling_distribution(c, z, n, library, scratch);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        CHECK((exact[i] > 0) == (library[i] > 0) && fabs(exact[i] - library[i]) < 1e-12);
        kept += exact[i] > 0;
    }
    return kept;
}

// ---------------------------------------------------------------------------------------------
// Pearson's chi-square test, with the p-value from the regularized upper incomplete gamma function
// Q(df / 2, statistic / 2) (Numerical Recipes' series and Lentz continued fraction).

static double upper_incomplete_gamma(double a, double x) {
    if (x <= 0) return 1;
    if (isinf(x)) return 0;
    const double prefactor = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1) { // the series for P = 1 - Q converges fast here
        double term = 1 / a, sum = term;
        for (int n = 1; n < 10000 && term > sum * 1e-17; n++) {
            term *= x / (a + n);
            sum += term;
        }
        return 1 - sum * prefactor;
    }
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        const double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        c = b + an / c;
        d = 1 / (fabs(d) < tiny ? tiny : d);
        c = fabs(c) < tiny ? tiny : c;
        h *= d * c;
        if (fabs(d * c - 1) < 1e-16) break;
    }
    return prefactor * h;
}

typedef struct {
    double statistic, p_value;
    int df;
} chi_square;

// Observed counts of n (at most V) cells against expected counts draws * probs. The cells expecting
// fewer than 5 are pooled into one, itself folded into the smallest other cell if it still expects
// fewer than 5 (as with the filtered-out tokens, which expect 0).
static chi_square pearson(const long *observed, const double *probs, int n, long draws) {
    CHECK(n <= V);
    double cell_observed[V + 1], cell_expected[V + 1], pooled_observed = 0, pooled_expected = 0;
    int cells = 0, smallest = -1;
    for (int i = 0; i < n; i++) {
        const double expected = (double)draws * probs[i];
        if (expected < 5) {
            pooled_observed += (double)observed[i];
            pooled_expected += expected;
            continue;
        }
        if (smallest < 0 || expected < cell_expected[smallest]) smallest = cells;
        cell_observed[cells] = (double)observed[i];
        cell_expected[cells++] = expected;
    }
    CHECK(smallest >= 0);
    if (pooled_expected >= 5) {
        cell_observed[cells] = pooled_observed;
        cell_expected[cells++] = pooled_expected;
    } else {
        cell_observed[smallest] += pooled_observed;
        cell_expected[smallest] += pooled_expected;
    }
    CHECK(cells >= 2);
    chi_square r = {.df = cells - 1};
    for (int j = 0; j < cells; j++) {
        const double deviation = cell_observed[j] - cell_expected[j];
        r.statistic += deviation * deviation / cell_expected[j];
    }
    r.p_value = upper_incomplete_gamma(r.df / 2.0, r.statistic / 2);
    return r;
}

// The textbook values: 5% critical points of 1, 10 and 30 degrees of freedom, and Q(1, x) = e^-x.
static void check_p_values(void) {
    CHECK(fabs(upper_incomplete_gamma(0.5, 3.841459 / 2) - 0.05) < 1e-6);
    CHECK(fabs(upper_incomplete_gamma(5, 18.307038 / 2) - 0.05) < 1e-6);
    CHECK(fabs(upper_incomplete_gamma(15, 43.772972 / 2) - 0.05) < 1e-6);
    for (double x = 0.25; x < 60; x *= 2)
        CHECK(fabs(upper_incomplete_gamma(1, x) / exp(-x) - 1) < 1e-12);
}

// ---------------------------------------------------------------------------------------------
// Drawing.

// DRAWS tokens as n samples of one prompt at one position draw them: sample index i, uniform i.
// Each token must be possible under the exact distribution and come with its exact log-prob.
static void draw(const weft_sampling_config *c, uint64_t prompt, const double *exact, long *counts,
                 void *scratch) {
    memset(counts, 0, V * sizeof *counts);
    for (int i = 0; i < DRAWS; i++) {
        const double u = weft_sampling_uniform(SEED, prompt, (uint64_t)i, POSITION, WEFT_DRAW_TOKEN);
        double logprob;
        const int token = weft_sample_token(c, logits, V, u, &logprob, scratch);
        CHECK(token >= 0 && token < V && exact[token] > 0);
        CHECK(fabs(logprob - log(exact[token])) <= 1e-12);
        counts[token]++;
    }
}

// The tokens a u of 0 and a u just below 1 give: the first and the last possible token.
static void check_extreme_uniforms(const weft_sampling_config *c, const double *exact,
                                   void *scratch) {
    int first = -1, last = -1;
    for (int i = 0; i < V; i++)
        if (exact[i] > 0) last = first < 0 ? (first = i) : i;
    CHECK(weft_sample_token(c, logits, V, 0.0, NULL, scratch) == first);
    CHECK(weft_sample_token(c, logits, V, 1 - 0x1.0p-53, NULL, scratch) == last);
}

// Prints the comparison of counts with probs and returns its chi-square p-value; *outside: the
// draws of tokens that probs forbids.
static double compare(const char *what, const long *counts, const double *probs, long *outside) {
    const chi_square r = pearson(counts, probs, V, DRAWS);
    *outside = 0;
    for (int i = 0; i < V; i++) *outside += probs[i] > 0 ? 0 : counts[i];
    printf("%-52s chi-square %7.2f  df %2d  p %-9.3g  %3ld drawn outside\n", what, r.statistic,
           r.df, r.p_value, *outside);
    return r.p_value;
}

// Each setting's draws match its exact distribution, and the library's own distribution is the
// exact one.
static void check_settings(void *scratch) {
    enum { TEMPERATURE_1, TEMPERATURE_07, TOP_K_5, TOP_P_08, MIN_P_01, ALL_FILTERS, N_SETTINGS };
    const struct {
        const char *name;
        weft_sampling_config config;
    } settings[N_SETTINGS] = {
        [TEMPERATURE_1] = {"temperature 1", sampling(1, 0, 1, 0)},
        [TEMPERATURE_07] = {"temperature 0.7", sampling(0.7, 0, 1, 0)},
        [TOP_K_5] = {"top_k 5 (a tie at the boundary)", sampling(1, 5, 1, 0)},
        [TOP_P_08] = {"top_p 0.8 at temperature 1.5", sampling(1.5, 0, 0.8, 0)},
        [MIN_P_01] = {"min_p 0.1", sampling(1, 0, 1, 0.1)},
        [ALL_FILTERS] = {"top_k 10, top_p 0.9, min_p 0.05 at temperature 1.3",
                         sampling(1.3, 10, 0.9, 0.05)},
    };
    long counts[N_SETTINGS][V];
    double exact[V], library[V];
    for (int s = 0; s < N_SETTINGS; s++) {
        const weft_sampling_config *c = &settings[s].config;
        exact_distribution_is_the_librarys(c, logits, V, exact, library, scratch);
        draw(c, (uint64_t)s, exact, counts[s], scratch);
        check_extreme_uniforms(c, exact, scratch);
        long outside;
        CHECK(compare(settings[s].name, counts[s], exact, &outside) > 1e-3 && outside == 0);
    }

    // The controls: the same draws against wrong distributions must fail.
    double wrong[V];
    long outside;
    reference_distribution(&settings[TOP_P_08].config, logits, V, NUCLEUS_WITHOUT_CROSSING_TOKEN,
                           wrong);
    CHECK(compare("control: top_p 0.8 without its crossing token", counts[TOP_P_08], wrong,
                  &outside) < 1e-3);
    const weft_sampling_config warmer = sampling(0.75, 0, 1, 0);
    reference_distribution(&warmer, logits, V, EXACT, wrong);
    CHECK(compare("control: temperature 0.7 drawn, 0.75 expected", counts[TEMPERATURE_07], wrong,
                  &outside) < 1e-3);
    // Swapping two equally likely tokens escapes the chi-square once the forbidden one's cell is
    // pooled into its twin's; the draws outside the support catch it.
    reference_distribution(&settings[TOP_K_5].config, logits, V, TIES_TO_HIGHER_ID, wrong);
    compare("control: top_k 5 with ties to the higher id", counts[TOP_K_5], wrong, &outside);
    CHECK(outside > 0);
}

// Ten equal logits: each probability is the double 0.1, and ten of them add up to 1 - 2^-53, so a u
// of 1 - 2^-53 is past the rounded total and must still draw the last token.
static void check_u_past_the_rounded_total(void *scratch) {
    const float equal[10] = {0};
    const weft_sampling_config c = sampling(1, 0, 1, 0);
    double logprob;
    CHECK(weft_sample_token(&c, equal, 10, 1 - 0x1.0p-53, &logprob, scratch) == 9);
    CHECK(logprob == log(0.1));
}

// Temperature 0 takes the first of the largest logits whatever u, with log-prob 0.
static void check_greedy(void *scratch) {
    float tied[V];
    memcpy(tied, logits, sizeof tied);
    tied[31] = tied[7]; // a later token as large as the largest
    const weft_sampling_config greedy = sampling(0, 5, 0.5, 0.2);
    for (int i = 0; i < 100; i++) {
        double logprob = -1;
        const double u = weft_sampling_uniform(SEED, 99, (uint64_t)i, POSITION, WEFT_DRAW_TOKEN);
        CHECK(weft_sample_token(&greedy, tied, V, u, &logprob, scratch) == 7 && logprob == 0);
    }
    tied[V - 1] = 6; // the largest, last
    CHECK(weft_sample_token(&greedy, tied, V, 0.999, NULL, scratch) == V - 1);
    printf("greedy: the first maximum, log-prob 0\n");
}

// ---------------------------------------------------------------------------------------------
// The uniforms.

static double philox_word_as_uniform(uint64_t word) { return (double)(word >> 11) * 0x1.0p-53; }

// n uniforms with one of the four counters (seed, prompt, sample, position) counting up from base.
static void uniforms_along(const uint64_t base[4], int counter, int n, double *u) {
    uint64_t c[4] = {base[0], base[1], base[2], base[3]};
    for (int i = 0; i < n; i++) {
        c[counter] = base[counter] + (uint64_t)i;
        u[i] = weft_sampling_uniform(c[0], c[1], c[2], c[3], WEFT_DRAW_TOKEN);
    }
}

static double correlation(const double *x, const double *y, int n) {
    double mx = 0, my = 0, sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < n; i++) mx += x[i] / n, my += y[i] / n;
    for (int i = 0; i < n; i++) {
        sxy += (x[i] - mx) * (y[i] - my);
        sxx += (x[i] - mx) * (x[i] - mx);
        syy += (y[i] - my) * (y[i] - my);
    }
    return sxy / sqrt(sxx * syy);
}

// Known answers of Philox-4x64-10 (counter (position, sample, prompt, 0), key (seed, 0)): the zero
// vector of Random123's kat_vectors, and two of numpy.random.Philox. Then along each counter:
// deterministic, 53-bit values in [0, 1), uniform on 20 bins, consecutive values uncorrelated,
// and uncorrelated with (and unlike) the stream one step along another counter; e.g. position j of
// sample i against position j of sample i + 1, as two samples of one prompt would draw.
static void check_uniforms(void) {
    CHECK(weft_sampling_uniform(0, 0, 0, 0, WEFT_DRAW_TOKEN) == philox_word_as_uniform(0x16554d9eca36314cULL));
    // The block's other words feed the draft draw and the accept test of speculative decoding.
    CHECK(weft_sampling_uniform(0, 0, 0, 0, WEFT_DRAW_DRAFT) == philox_word_as_uniform(0xdb20fe9d672d0fdcULL));
    CHECK(weft_sampling_uniform(0, 0, 0, 0, WEFT_DRAW_ACCEPT) == philox_word_as_uniform(0xd7e772cee186176bULL));
    CHECK(weft_sampling_uniform(42, 7, 3, 1000, WEFT_DRAW_TOKEN) == philox_word_as_uniform(0x2f8602751741ab51ULL));
    CHECK(weft_sampling_uniform(UINT64_MAX, 0x8000000000000005ULL, 123456789, 0x10000000003ULL,
                                WEFT_DRAW_TOKEN) ==
          philox_word_as_uniform(0xa70d0b098be2e05bULL));
    static const char *const names[4] = {"seed", "prompt", "sample", "position"};
    const uint64_t base[4] = {SEED, 5, 0, POSITION};
    double *u = malloc(DRAWS * sizeof *u), *neighbour = malloc(DRAWS * sizeof *neighbour);
    for (int counter = 0; counter < 4; counter++) {
        uniforms_along(base, counter, DRAWS, u);
        uniforms_along(base, counter, DRAWS, neighbour);
        CHECK(memcmp(u, neighbour, DRAWS * sizeof *u) == 0);
        long bins[BINS] = {0};
        for (int i = 0; i < DRAWS; i++) {
            CHECK(u[i] >= 0 && u[i] < 1 && u[i] * 0x1.0p53 == floor(u[i] * 0x1.0p53));
            bins[(int)(u[i] * BINS)]++;
        }
        double flat[BINS];
        for (int b = 0; b < BINS; b++) flat[b] = 1.0 / BINS;
        const chi_square r = pearson(bins, flat, BINS, DRAWS);
        const double serial = correlation(u, u + 1, DRAWS - 1);
        const int other = (counter + 1) % 4;
        uint64_t next[4] = {base[0], base[1], base[2], base[3]};
        next[other]++;
        uniforms_along(next, counter, DRAWS, neighbour);
        const double across = correlation(u, neighbour, DRAWS);
        int equal = 0;
        for (int i = 0; i < DRAWS; i++) equal += u[i] == neighbour[i];
        printf("uniforms along the %-8s: 20 bins chi-square %6.2f df %d p %.3g; correlation with "
               "the next %s %+.4f, with the next %s's %+.4f\n",
               names[counter], r.statistic, r.df, r.p_value, names[counter], serial, names[other],
               across);
        CHECK(r.p_value > 1e-3 && fabs(serial) < 0.03 && fabs(across) < 0.03 && equal == 0);
    }
    free(u);
    free(neighbour);
}

// ---------------------------------------------------------------------------------------------
// A larger vocabulary, for what 40 tokens hardly exercise: quickselect over many candidates from
// the weight buckets. Top-k much smaller than V; top-p alone with nuclei from 21 tokens to 42,258
// (most of the vocabulary); top-k and top-p together; min-p alone and after top-p. Logits on a
// coarse grid, so ties abound.

enum { LARGE_V = 50000 };

static void check_large_vocabulary(void *scratch) {
    float *z = malloc(LARGE_V * sizeof *z);
    double *exact = malloc(LARGE_V * sizeof *exact), *library = malloc(LARGE_V * sizeof *library);
    weft_rng rng;
    weft_rng_seed(&rng, 11);
    for (int i = 0; i < LARGE_V; i++) z[i] = roundf(2.5f * (float)weft_rng_normal(&rng)) / 4;
    const weft_sampling_config settings[] = {
        sampling(1, 20, 1, 0),     sampling(1, 0, 1, 0.5),      sampling(0.25, 0, 0.3, 0),
        sampling(0.35, 0, 0.2, 0), sampling(0.3, 0, 0.6, 0),    sampling(0.8, 0, 0.7, 0.1),
        sampling(1, 0, 0.95, 0),   sampling(1.2, 3000, 0.9, 0), sampling(0.5, 400, 0.8, 0.05),
    };
    for (size_t s = 0; s < sizeof settings / sizeof *settings; s++) {
        const int kept =
            exact_distribution_is_the_librarys(&settings[s], z, LARGE_V, exact, library, scratch);
        printf("V %d, temperature %g, top_k %d, top_p %g, min_p %g: the definition's %d tokens\n",
               LARGE_V, settings[s].temperature, settings[s].top_k, settings[s].top_p,
               settings[s].min_p, kept);
    }
    free(z);
    free(exact);
    free(library);
}

int main(void) {
    void *scratch = weft_alloc(weft_sampling_scratch_bytes(LARGE_V));
    check_p_values();
    check_uniforms();
    check_settings(scratch);
    check_greedy(scratch);
    check_u_past_the_rounded_total(scratch);
    check_large_vocabulary(scratch);
    weft_free(scratch);
    printf("ok\n");
    return 0;
}
