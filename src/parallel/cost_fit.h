// parallel: fitting the planner's cost model (weft_cost_model, parallel/planner.h) to timed
// micro-batches, for `weft calibrate`.
#pragma once
#include "parallel/planner.h"

// One timed micro-batch: n_docs documents of len tokens at CP degree `degree`, and the seconds one
// rank spent computing (wall time minus its exchange) and inside the key/value exchange.
typedef struct weft_cost_sample {
    int len, n_docs, degree;
    double compute, comm;
} weft_cost_sample;

typedef struct weft_cost_fit_error {
    double compute_rms, compute_max; // relative: |predicted - measured| / measured
    double comm_rms, comm_max;       // over the samples with degree > 1 (0 when none)
} weft_cost_fit_error;

// The model's compute for a sample: n_docs times the per-document cost, plus epsilon.
double weft_cost_sample_compute(const weft_cost_model *cm, const weft_cost_sample *s);

// Least squares in relative error, coefficients kept non-negative: alpha, beta, gamma and
// epsilon from every sample's compute, delta from the exchange of those with degree > 1 (0 when
// none).
weft_cost_model weft_cost_fit(const weft_cost_sample *s, int n, weft_cost_fit_error *err);
