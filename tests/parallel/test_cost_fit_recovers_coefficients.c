// The cost-model fit of `weft calibrate`: timings made exactly by a known model give back its
// five coefficients (to 1e-9 relative) and zero fit error; timings with 3% noise give alpha, beta
// and delta back within 5% (gamma, a small share of every sample, within 40%) and report an error
// of that size; a model without a fixed cost fitted to
// noisy timings keeps every coefficient non-negative; samples that cannot be positive times are
// one clear error.
#include <math.h>

#include "../testing.h"
#include "parallel/cost_fit.h"

static int make_samples(const weft_cost_model *truth, double noise, weft_rng *rng,
                        weft_cost_sample *s) {
    int n = 0;
    for (int len = 4096; len >= 16; len /= 2)
        for (int k = 1; k <= 16; k *= 2) {
            s[n] = (weft_cost_sample){.len = len, .n_docs = k, .degree = 1};
            s[n].compute = weft_cost_sample_compute(truth, &s[n]) * (1 + noise * weft_rng_normal(rng));
            n++;
        }
    for (int c = 2; c <= 8; c *= 2)
        for (int len = 512 * c; len <= 2048 * c; len *= 4) {
            s[n] = (weft_cost_sample){.len = len, .n_docs = 1, .degree = c};
            s[n].compute = weft_cost_sample_compute(truth, &s[n]) * (1 + noise * weft_rng_normal(rng));
            s[n].comm = weft_cost_comm(truth, len, c) * (1 + noise * weft_rng_normal(rng));
            n++;
        }
    return n;
}

static double rel(double got, double want) { return fabs(got - want) / fabs(want); }

// A zero time, which the fit's relative weighting cannot take. (The label is the error's.)
static void zero_time_sample(const char *label) {
    weft_cost_sample s = {.len = 16, .n_docs = 1, .degree = 1, .compute = 0};
    (void)label;
    weft_cost_fit(&s, 1, NULL);
}

int main(void) {
    weft_rng rng;
    weft_rng_seed(&rng, 5);
    weft_cost_sample s[128];
    const weft_cost_model truth = {2.2e-7, 1.5e-4, 3.7e-4, 1.7e-5, 7e-4};
    weft_cost_fit_error e;

    int n = make_samples(&truth, 0, &rng, s);
    weft_cost_model cm = weft_cost_fit(s, n, &e);
    printf("exact: alpha %.6g beta %.6g gamma %.6g delta %.6g epsilon %.6g, error %.2e / %.2e\n",
           cm.alpha, cm.beta, cm.gamma, cm.delta, cm.epsilon, e.compute_max, e.comm_max);
    CHECK(rel(cm.alpha, truth.alpha) < 1e-9 && rel(cm.beta, truth.beta) < 1e-9);
    CHECK(rel(cm.gamma, truth.gamma) < 1e-9 && rel(cm.delta, truth.delta) < 1e-9);
    CHECK(rel(cm.epsilon, truth.epsilon) < 1e-9);
    CHECK(e.compute_max < 1e-9 && e.comm_max < 1e-9);

    n = make_samples(&truth, 0.03, &rng, s);
    cm = weft_cost_fit(s, n, &e);
    printf("3%% noise: alpha %.6g beta %.6g gamma %.6g delta %.6g epsilon %.6g, RMS error %.3f / "
           "%.3f\n", cm.alpha, cm.beta, cm.gamma, cm.delta, cm.epsilon, e.compute_rms, e.comm_rms);
    CHECK(rel(cm.alpha, truth.alpha) < 0.05 && rel(cm.beta, truth.beta) < 0.05);
    CHECK(rel(cm.gamma, truth.gamma) < 0.4 && rel(cm.delta, truth.delta) < 0.05);
    CHECK(e.compute_rms > 0.01 && e.compute_rms < 0.06 && e.comm_rms > 0.005 && e.comm_rms < 0.06);

    const weft_cost_model no_fixed = {2.2e-7, 1.5e-4, 0, 1.7e-5, 0};
    for (int trial = 0; trial < 20; trial++) {
        n = make_samples(&no_fixed, 0.05, &rng, s);
        cm = weft_cost_fit(s, n, &e);
        CHECK(cm.alpha >= 0 && cm.beta >= 0 && cm.gamma >= 0 && cm.delta >= 0 && cm.epsilon >= 0);
    }
    EXPECT_FATAL(zero_time_sample, "calibrate: sample 1", "no positive time");
    printf("ok\n");
    return 0;
}
