// Shared by the finite-difference tests of the CPU backend's ops (test_*_finite_difference.c):
// the method and tolerances below, host/device helpers, error measures and the report line.
// Header-only like testing.h: each test is its own executable.
//
// Method, for an op out = f(x): a fixed random R, the scalar objective J(x) = sum(out * R)
// accumulated in double, the analytic gradient from the backward op given dout = R, and central
// differences fd_i = (J(x + h e_i) - J(x - h e_i)) / (2h) for every input element. The op itself
// runs in fp32 at the perturbed inputs; the step actually taken is (float)(x + h) - (float)(x - h),
// so rounding of the perturbed input does not count as an error. A check passes when
// max_i |fd_i - analytic_i| / max_i |analytic_i| <= tol. Each line of output is one check:
// "<op> <what>: max rel err X (tol Y) ok|FAIL"; the exit status is 1 if any check failed.
//
// Tolerances:
//   TOL_FD_NONLINEAR = 1e-2 for smooth nonlinear ops (rmsnorm dx, attention dq/dk, swiglu dgate,
//     cross_entropy) with h = 1e-2: the truncation error of central differences is h^2/6 * f''',
//     about 1e-5 to 1e-4 of the gradient's scale for O(1) inputs, and fp32 rounding of J adds
//     about 6e-8 * sum|out * R| / 2h, about 1e-4 for these sizes. 1e-2 leaves two orders of
//     margin; a wrong backward (a missing term, a wrong sign or index) is off by O(1).
//   TOL_FD_LINEAR = 1e-5 where out is linear in the perturbed input (embedding, rmsnorm dw, bias,
//     rope, attention dv, swiglu dup): central differences are then exact for any step, so the
//     step is h = 1 (not 1e-2) to shrink the fp32 rounding of J relative to the difference; what
//     remains is a few ulp of the affected outputs, about 1e-7 of the gradient's scale.
//   Forward references in double: 1e-5 (a handful of fp32 roundings per output), 1e-4 for rope,
//     whose angle pos * theta^(-2i/D) may be computed in fp32 (ulp(57) ~ 4e-6 rad).
#pragma once
#include "backend/backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { SEED = 20240611 };
static const double H_NONLINEAR = 1e-2, H_LINEAR = 1.0;
static const double TOL_FD_NONLINEAR = 1e-2, TOL_FD_LINEAR = 1e-5;
// Accumulate / overwrite checks compare a backward run onto prefilled P with one onto zeros:
// fl(P + g) - P recovers g to about one ulp of max(|P|, |g|), ~1e-7 relative.
static const double TOL_ACCUMULATE = 1e-5;

static weft_backend *B;
static weft_rng rng;
static int failures;

// The CPU backend in fp32 and the seeded generator every check draws from.
static inline void fd_begin(void) {
    B = weft_backend_cpu_create();
    WEFT_CHECK(B->act_dtype == WEFT_F32 && B->param_dtype == WEFT_F32,
               "this test expects the CPU backend's activations and parameters in fp32");
    weft_rng_seed(&rng, SEED);
}

// Prints the summary line and returns the exit status.
static inline int fd_end(double t0) {
    printf("%d check(s) failed, %.2f s\n", failures, weft_now_seconds() - t0);
    weft_backend_destroy(B);
    return failures ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// Small helpers: host arrays, device transfers, error measures, reporting.

static inline float *host_normal(size_t n, double mean, double sd) {
    float *x = weft_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(mean + sd * weft_rng_normal(&rng));
    return x;
}

static inline float *host_copy(const float *x, size_t n) {
    float *y = weft_alloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static inline float *host_fill(size_t n, float value) {
    float *x = weft_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}

static inline void upload(void *dev, const float *host, size_t n) {
    B->to_device(B, dev, host, n * sizeof(float));
}

static inline void download(float *host, const void *dev, size_t n) {
    B->synchronize(B);
    B->to_host(B, host, dev, n * sizeof(float));
}

static inline void *dev_f32(const float *host, size_t n) {
    void *d = B->alloc(B, n * sizeof(float));
    if (host) upload(d, host, n);
    return d;
}

static inline int32_t *dev_i32(const int32_t *host, size_t n) {
    int32_t *d = B->alloc(B, n * sizeof(int32_t));
    B->to_device(B, d, host, n * sizeof(int32_t));
    return d;
}

// sum(dev * R) in double: the objective J for an output on the device.
static inline double dot_dev(const void *dev, const float *R, size_t n) {
    float *h = weft_alloc(n * sizeof(float));
    download(h, dev, n);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)h[i] * R[i];
    weft_free(h);
    return s;
}

// max |got - want| / max |want|, NaN-aware (a NaN anywhere makes the error NaN, which fails).
typedef struct err_acc {
    double diff, ref;
    bool nan;
} err_acc;

static inline void acc_add(err_acc *e, double got, double want) {
    double d = fabs(got - want);
    if (isnan(d)) e->nan = true;
    if (d > e->diff) e->diff = d;
    if (fabs(want) > e->ref) e->ref = fabs(want);
}

static inline double acc_rel(const err_acc *e) {
    if (e->nan) return NAN;
    if (e->ref == 0) return e->diff == 0 ? 0 : INFINITY;
    return e->diff / e->ref;
}

static inline double rel_err(const float *got, const float *want, size_t n) {
    err_acc e = {0};
    for (size_t i = 0; i < n; i++) acc_add(&e, got[i], want[i]);
    return acc_rel(&e);
}

static inline double rel_err_d(const float *got, const double *want, size_t n) {
    err_acc e = {0};
    for (size_t i = 0; i < n; i++) acc_add(&e, got[i], want[i]);
    return acc_rel(&e);
}

static inline void report(const char *what, double err, double tol) {
    bool ok = err <= tol; // false for NaN
    printf("%s: max rel err %.3e (tol %.0e) %s\n", what, err, tol, ok ? "ok" : "FAIL");
    fflush(stdout);
    if (!ok) failures++;
}

// The finite-difference loop. J(ctx) evaluates the objective from the host inputs it holds, one
// of which is x (n elements); every element of x is perturbed in turn by +-h and restored.
// Returns max |fd - analytic| / max |analytic|.
typedef double (*objective_fn)(void *ctx);

static inline double fd_rel_err(objective_fn J, void *ctx, float *x, size_t n, const float *analytic,
                         double h) {
    err_acc e = {0};
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i], xp = (float)(x0 + h), xm = (float)(x0 - h);
        x[i] = xp;
        double jp = J(ctx);
        x[i] = xm;
        double jm = J(ctx);
        x[i] = x0;
        acc_add(&e, (jp - jm) / ((double)xp - (double)xm), analytic[i]);
    }
    return acc_rel(&e);
}

// A backward op run onto prefilled gradients P must give P + (its result onto zeros) when it
// accumulates ("+="), and exactly its result onto zeros when it overwrites.
static inline void check_prefilled(const char *what, const float *onto_zero, const float *prefill,
                            const float *onto_prefill, size_t n, bool accumulates) {
    float *got = weft_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) got[i] = accumulates ? onto_prefill[i] - prefill[i] : onto_prefill[i];
    report(what, rel_err(got, onto_zero, n), TOL_ACCUMULATE);
    weft_free(got);
}
