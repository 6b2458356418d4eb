// Finite-difference check of every backward op of the CPU backend, in fp32, plus direct checks of
// the ops that have no backward (matmul, adamw, reductions) against naive double-precision code.
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

// ---------------------------------------------------------------------------------------------
// Small helpers: host arrays, device transfers, error measures, reporting.

static float *host_normal(size_t n, double mean, double sd) {
    float *x = weft_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(mean + sd * weft_rng_normal(&rng));
    return x;
}

static float *host_copy(const float *x, size_t n) {
    float *y = weft_alloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static float *host_fill(size_t n, float value) {
    float *x = weft_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}

static void upload(void *dev, const float *host, size_t n) {
    B->to_device(B, dev, host, n * sizeof(float));
}

static void download(float *host, const void *dev, size_t n) {
    B->synchronize(B);
    B->to_host(B, host, dev, n * sizeof(float));
}

static void *dev_f32(const float *host, size_t n) {
    void *d = B->alloc(B, n * sizeof(float));
    if (host) upload(d, host, n);
    return d;
}

static int32_t *dev_i32(const int32_t *host, size_t n) {
    int32_t *d = B->alloc(B, n * sizeof(int32_t));
    B->to_device(B, d, host, n * sizeof(int32_t));
    return d;
}

// sum(dev * R) in double: the objective J for an output on the device.
static double dot_dev(const void *dev, const float *R, size_t n) {
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

static void acc_add(err_acc *e, double got, double want) {
    double d = fabs(got - want);
    if (isnan(d)) e->nan = true;
    if (d > e->diff) e->diff = d;
    if (fabs(want) > e->ref) e->ref = fabs(want);
}

static double acc_rel(const err_acc *e) {
    if (e->nan) return NAN;
    if (e->ref == 0) return e->diff == 0 ? 0 : INFINITY;
    return e->diff / e->ref;
}

static double rel_err(const float *got, const float *want, size_t n) {
    err_acc e = {0};
    for (size_t i = 0; i < n; i++) acc_add(&e, got[i], want[i]);
    return acc_rel(&e);
}

static double rel_err_d(const float *got, const double *want, size_t n) {
    err_acc e = {0};
    for (size_t i = 0; i < n; i++) acc_add(&e, got[i], want[i]);
    return acc_rel(&e);
}

static void report(const char *what, double err, double tol) {
    bool ok = err <= tol; // false for NaN
    printf("%s: max rel err %.3e (tol %.0e) %s\n", what, err, tol, ok ? "ok" : "FAIL");
    fflush(stdout);
    if (!ok) failures++;
}

// The finite-difference loop. J(ctx) evaluates the objective from the host inputs it holds, one
// of which is x (n elements); every element of x is perturbed in turn by +-h and restored.
// Returns max |fd - analytic| / max |analytic|.
typedef double (*objective_fn)(void *ctx);

static double fd_rel_err(objective_fn J, void *ctx, float *x, size_t n, const float *analytic,
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
static void check_prefilled(const char *what, const float *onto_zero, const float *prefill,
                            const float *onto_prefill, size_t n, bool accumulates) {
    float *got = weft_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) got[i] = accumulates ? onto_prefill[i] - prefill[i] : onto_prefill[i];
    report(what, rel_err(got, onto_zero, n), TOL_ACCUMULATE);
    weft_free(got);
}

// ---------------------------------------------------------------------------------------------
// embedding: out (T, C) = table[ids]; dtable += scatter(dout).

typedef struct emb_ctx {
    int T, C, V;
    const int32_t *ids_d;
    float *table;
    void *table_d, *out_d;
    const float *R;
} emb_ctx;

static double emb_J(void *p) {
    emb_ctx *c = p;
    upload(c->table_d, c->table, (size_t)c->V * c->C);
    B->embedding_forward(B, c->ids_d, c->table_d, c->out_d, c->T, c->C);
    return dot_dev(c->out_d, c->R, (size_t)c->T * c->C);
}

static void test_embedding(void) {
    enum { T = 9, C = 5, V = 7 };
    // Row 3 is read three times, rows 0 and 1 twice, rows 2 and 4 never: the scatter must add.
    const int32_t ids[T] = {3, 0, 3, 6, 1, 3, 0, 5, 1};
    emb_ctx c = {.T = T, .C = C, .V = V, .ids_d = dev_i32(ids, T), .table = host_normal(V * C, 0, 1),
                 .R = host_normal(T * C, 0, 1)};
    c.table_d = dev_f32(c.table, V * C);
    c.out_d = dev_f32(NULL, T * C);

    float out[T * C];
    B->embedding_forward(B, c.ids_d, c.table_d, c.out_d, T, C);
    download(out, c.out_d, T * C);
    float want[T * C];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < C; j++) want[t * C + j] = c.table[ids[t] * C + j];
    report("embedding_forward vs gather", rel_err(out, want, T * C), 0);

    void *dout_d = dev_f32(c.R, T * C);
    float *dtable_d = dev_f32(NULL, V * C);
    float g[V * C], g_pre[V * C];
    B->embedding_backward(B, c.ids_d, dout_d, dtable_d, T, C);
    download(g, dtable_d, V * C);
    float *prefill = host_normal(V * C, 0, 1);
    upload(dtable_d, prefill, V * C);
    B->embedding_backward(B, c.ids_d, dout_d, dtable_d, T, C);
    download(g_pre, dtable_d, V * C);

    report("embedding_backward dtable (fd)", fd_rel_err(emb_J, &c, c.table, V * C, g, H_LINEAR),
           TOL_FD_LINEAR);
    check_prefilled("embedding_backward dtable accumulates (+=)", g, prefill, g_pre, V * C, true);
}

// ---------------------------------------------------------------------------------------------
// rmsnorm: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); dx +=, dw +=.

typedef struct rms_ctx {
    int T, C;
    float eps;
    float *x, *w;
    void *x_d, *w_d, *out_d;
    float *rstd_d;
    const float *R;
} rms_ctx;

static double rms_J(void *p) {
    rms_ctx *c = p;
    upload(c->x_d, c->x, (size_t)c->T * c->C);
    upload(c->w_d, c->w, c->C);
    B->rmsnorm_forward(B, c->x_d, c->w_d, c->eps, c->out_d, c->rstd_d, c->T, c->C);
    return dot_dev(c->out_d, c->R, (size_t)c->T * c->C);
}

// Forward against double: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
static void check_rmsnorm_forward(const char *what, rms_ctx *c) {
    int T = c->T, C = c->C;
    rms_J(c); // runs the forward on c->x
    float *out = weft_alloc(sizeof(float) * T * C), *rstd = weft_alloc(sizeof(float) * T);
    double *want_out = weft_alloc(sizeof(double) * T * C), *want_rstd = weft_alloc(sizeof(double) * T);
    download(out, c->out_d, (size_t)T * C);
    download(rstd, c->rstd_d, T);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int j = 0; j < C; j++) ss += (double)c->x[t * C + j] * c->x[t * C + j];
        want_rstd[t] = 1 / sqrt(ss / C + c->eps);
        for (int j = 0; j < C; j++) want_out[t * C + j] = c->x[t * C + j] * want_rstd[t] * c->w[j];
    }
    char line[128];
    snprintf(line, sizeof line, "%s out vs double", what);
    report(line, rel_err_d(out, want_out, (size_t)T * C), 1e-5);
    snprintf(line, sizeof line, "%s rstd vs double", what);
    report(line, rel_err_d(rstd, want_rstd, T), 1e-5);
    weft_free(out), weft_free(rstd), weft_free(want_out), weft_free(want_rstd);
}

static void test_rmsnorm(void) {
    enum { T = 4, C = 8 };
    rms_ctx c = {.T = T, .C = C, .eps = 1e-5f, .x = host_normal(T * C, 0, 1),
                 .w = host_normal(C, 1, 0.3), .R = host_normal(T * C, 0, 1)};
    c.x_d = dev_f32(c.x, T * C);
    c.w_d = dev_f32(c.w, C);
    c.out_d = dev_f32(NULL, T * C);
    c.rstd_d = dev_f32(NULL, T);

    check_rmsnorm_forward("rmsnorm_forward", &c);
    // Rows with mean(x^2) ~ eps, where eps must sit inside the square root: 1/sqrt(ms + eps).
    float *x_small = host_normal(T * C, 0, 3e-3);
    rms_ctx small = c;
    small.x = x_small;
    check_rmsnorm_forward("rmsnorm_forward, mean(x^2) ~ eps,", &small);
    rms_J(&c); // the forward on x again: backward reads its rstd

    void *dout_d = dev_f32(c.R, T * C), *dx_d = dev_f32(NULL, T * C);
    float *dw_d = dev_f32(NULL, C);
    float gx[T * C], gw[C], gx_pre[T * C], gw_pre[C];
    B->rmsnorm_backward(B, c.x_d, c.w_d, c.rstd_d, dout_d, dx_d, dw_d, T, C);
    download(gx, dx_d, T * C);
    download(gw, dw_d, C);
    float *px = host_normal(T * C, 0, 1), *pw = host_normal(C, 0, 1);
    upload(dx_d, px, T * C);
    upload(dw_d, pw, C);
    B->rmsnorm_backward(B, c.x_d, c.w_d, c.rstd_d, dout_d, dx_d, dw_d, T, C);
    download(gx_pre, dx_d, T * C);
    download(gw_pre, dw_d, C);

    report("rmsnorm_backward dx (fd)", fd_rel_err(rms_J, &c, c.x, T * C, gx, H_NONLINEAR),
           TOL_FD_NONLINEAR);
    report("rmsnorm_backward dw (fd)", fd_rel_err(rms_J, &c, c.w, C, gw, H_LINEAR), TOL_FD_LINEAR);
    check_prefilled("rmsnorm_backward dx accumulates (+=)", gx, px, gx_pre, T * C, true);
    check_prefilled("rmsnorm_backward dw accumulates (+=)", gw, pw, gw_pre, C, true);
}

// ---------------------------------------------------------------------------------------------
// bias: x (T, C) += bias (C); dbias += column sums of dout.

typedef struct bias_ctx {
    int T, C;
    const float *x;
    float *bias;
    void *x_d, *bias_d;
    const float *R;
} bias_ctx;

static double bias_J(void *p) {
    bias_ctx *c = p;
    upload(c->x_d, c->x, (size_t)c->T * c->C);
    upload(c->bias_d, c->bias, c->C);
    B->bias_forward(B, c->x_d, c->bias_d, c->T, c->C);
    return dot_dev(c->x_d, c->R, (size_t)c->T * c->C);
}

static void test_bias(void) {
    enum { T = 5, C = 6 };
    bias_ctx c = {.T = T, .C = C, .x = host_normal(T * C, 0, 1), .bias = host_normal(C, 0, 1),
                  .R = host_normal(T * C, 0, 1)};
    c.x_d = dev_f32(c.x, T * C);
    c.bias_d = dev_f32(c.bias, C);

    B->bias_forward(B, c.x_d, c.bias_d, T, C);
    float out[T * C], want[T * C];
    download(out, c.x_d, T * C);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < C; j++) want[t * C + j] = c.x[t * C + j] + c.bias[j];
    report("bias_forward vs x + bias", rel_err(out, want, T * C), 0);

    void *dout_d = dev_f32(c.R, T * C);
    float *db_d = dev_f32(NULL, C);
    float g[C], g_pre[C];
    B->bias_backward(B, dout_d, db_d, T, C);
    download(g, db_d, C);
    float *prefill = host_normal(C, 0, 1);
    upload(db_d, prefill, C);
    B->bias_backward(B, dout_d, db_d, T, C);
    download(g_pre, db_d, C);

    report("bias_backward dbias (fd)", fd_rel_err(bias_J, &c, c.bias, C, g, H_LINEAR),
           TOL_FD_LINEAR);
    check_prefilled("bias_backward dbias accumulates (+=)", g, prefill, g_pre, C, true);
}

// ---------------------------------------------------------------------------------------------
// rope: in place on x (T, H, D), rotate-half convention; backward is the inverse rotation.

typedef struct rope_ctx {
    int T, H, D;
    double theta;
    const int32_t *pos_d;
    float *x;
    void *x_d;
    const float *R;
} rope_ctx;

static double rope_J(void *p) {
    rope_ctx *c = p;
    size_t n = (size_t)c->T * c->H * c->D;
    upload(c->x_d, c->x, n);
    B->rope_forward(B, c->x_d, c->pos_d, c->theta, c->T, c->H, c->D);
    return dot_dev(c->x_d, c->R, n);
}

static void test_rope(void) {
    enum { T = 10, H = 2, D = 8, N = T * H * D };
    // Positions restart per packed document, as the trainer passes them, plus one far position.
    const int32_t pos[T] = {0, 1, 2, 3, 4, 0, 1, 2, 0, 57};
    rope_ctx c = {.T = T, .H = H, .D = D, .theta = 10000.0, .pos_d = dev_i32(pos, T),
                  .x = host_normal(N, 0, 1), .R = host_normal(N, 0, 1)};
    c.x_d = dev_f32(c.x, N);

    // Forward against the Hugging Face formula: for i < D/2, angle = pos * theta^(-2i/D),
    // out[i] = x[i] cos - x[i + D/2] sin, out[i + D/2] = x[i + D/2] cos + x[i] sin.
    B->rope_forward(B, c.x_d, c.pos_d, c.theta, T, H, D);
    float out[N];
    double want[N];
    download(out, c.x_d, N);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                double a = pos[t] * pow(c.theta, -2.0 * i / D);
                const float *x = c.x + ((size_t)t * H + h) * D;
                double *o = want + ((size_t)t * H + h) * D;
                o[i] = x[i] * cos(a) - x[i + D / 2] * sin(a);
                o[i + D / 2] = x[i + D / 2] * cos(a) + x[i] * sin(a);
            }
    report("rope_forward vs rotate-half formula", rel_err_d(out, want, N), 1e-4);

    // Inverse: backward(forward(x)) == x, since a rotation's adjoint is its inverse.
    B->rope_backward(B, c.x_d, c.pos_d, c.theta, T, H, D);
    float back[N];
    download(back, c.x_d, N);
    report("rope_backward(rope_forward(x)) == x", rel_err(back, c.x, N), 1e-6);

    // Vector-Jacobian product: g = rope_backward(R); <rope(x), R> must equal <x, g>.
    float g[N];
    void *g_d = dev_f32(c.R, N);
    B->rope_backward(B, g_d, c.pos_d, c.theta, T, H, D);
    download(g, g_d, N);
    double lhs = rope_J(&c), rhs = 0, scale = 0;
    for (int i = 0; i < N; i++) {
        rhs += (double)c.x[i] * g[i];
        scale += fabs((double)c.x[i] * g[i]);
    }
    report("rope <rope(x), R> == <x, rope_backward(R)>", fabs(lhs - rhs) / scale, 1e-6);

    report("rope_backward dx (fd)", fd_rel_err(rope_J, &c, c.x, N, g, H_LINEAR), TOL_FD_LINEAR);
}

// ---------------------------------------------------------------------------------------------
// attention: causal within packed documents, grouped-query heads.

typedef struct attn_ctx {
    int T, H, KV, D, n_docs;
    const int32_t *cu_d;
    weft_attention_layout layout; // queries and keys are the same rows
    float *q, *k, *v;
    void *q_d, *k_d, *v_d, *out_d;
    float *lse_d;
    const float *R;
} attn_ctx;

static void attn_forward(attn_ctx *c) {
    upload(c->q_d, c->q, (size_t)c->T * c->H * c->D);
    upload(c->k_d, c->k, (size_t)c->T * c->KV * c->D);
    upload(c->v_d, c->v, (size_t)c->T * c->KV * c->D);
    B->attention_forward(B, c->q_d, c->k_d, c->v_d, &c->layout, c->out_d, c->lse_d, c->H, c->KV,
                         c->D);
}

static double attn_J(void *p) {
    attn_ctx *c = p;
    attn_forward(c);
    return dot_dev(c->out_d, c->R, (size_t)c->T * c->H * c->D);
}

// Naive attention in double, softmax scale 1/sqrt(D): out (T, H, D), lse (H, T).
static void attn_reference(const attn_ctx *c, const int32_t *cu, double *out, double *lse) {
    int T = c->T, H = c->H, KV = c->KV, D = c->D;
    double *s = weft_alloc(sizeof(double) * T);
    memset(out, 0, sizeof(double) * T * H * D);
    for (int d = 0; d < c->n_docs; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++)
            for (int h = 0; h < H; h++) {
                int kh = h / (H / KV);
                const float *q = c->q + ((size_t)t * H + h) * D;
                double mx = -INFINITY, sum = 0;
                for (int j = cu[d]; j <= t; j++) {
                    s[j] = 0;
                    for (int i = 0; i < D; i++) s[j] += (double)q[i] * c->k[((size_t)j * KV + kh) * D + i];
                    s[j] /= sqrt((double)D);
                    mx = fmax(mx, s[j]);
                }
                for (int j = cu[d]; j <= t; j++) sum += exp(s[j] - mx);
                lse[(size_t)h * T + t] = mx + log(sum);
                for (int j = cu[d]; j <= t; j++)
                    for (int i = 0; i < D; i++)
                        out[((size_t)t * H + h) * D + i] +=
                            exp(s[j] - lse[(size_t)h * T + t]) * c->v[((size_t)j * KV + kh) * D + i];
            }
    weft_free(s);
}

// No leakage across documents or from the future: perturbing token p (its q, k and v) must leave
// every output row outside p's document, and every row before p in it, bit for bit the same, and
// must change row p. Returns the largest change in a row that must not change; *own_row_changed
// says whether every perturbed row changed.
static double attn_leak(attn_ctx *c, const int32_t *cu, const float *out, bool *own_row_changed) {
    int T = c->T, HD = c->H * c->D, KD = c->KV * c->D;
    float *q0 = host_copy(c->q, (size_t)T * HD), *k0 = host_copy(c->k, (size_t)T * KD),
          *v0 = host_copy(c->v, (size_t)T * KD), *pert = weft_alloc(sizeof(float) * T * HD);
    double leak = 0;
    *own_row_changed = true;
    for (int d = 0; d < c->n_docs; d++) {
        int p = (cu[d] + cu[d + 1]) / 2; // a middle token (the only one of a length-1 document)
        for (int i = 0; i < HD; i++) c->q[(size_t)p * HD + i] += 3.0f;
        for (int i = 0; i < KD; i++) c->k[(size_t)p * KD + i] -= 2.0f, c->v[(size_t)p * KD + i] += 5.0f;
        attn_forward(c);
        download(pert, c->out_d, (size_t)T * HD);
        memcpy(c->q, q0, sizeof(float) * T * HD);
        memcpy(c->k, k0, sizeof(float) * T * KD);
        memcpy(c->v, v0, sizeof(float) * T * KD);
        for (int t = 0; t < T; t++) {
            double row = 0;
            for (int i = 0; i < HD; i++)
                row = fmax(row, fabs((double)pert[(size_t)t * HD + i] - out[(size_t)t * HD + i]));
            if (!(t >= p && t < cu[d + 1])) leak = fmax(leak, row);
            if (t == p && !(row > 0)) *own_row_changed = false;
        }
    }
    weft_free(q0), weft_free(k0), weft_free(v0), weft_free(pert);
    return leak;
}

static void test_attention(const char *label, int H, int KV, int D, const int32_t *cu, int n_docs) {
    int T = cu[n_docs];
    size_t NQ = (size_t)T * H * D, NK = (size_t)T * KV * D, NL = (size_t)H * T;
    attn_ctx c = {.T = T, .H = H, .KV = KV, .D = D, .n_docs = n_docs, .cu_d = dev_i32(cu, n_docs + 1),
                  .q = host_normal(NQ, 0, 1), .k = host_normal(NK, 0, 1), .v = host_normal(NK, 0, 1),
                  .R = host_normal(NQ, 0, 1)};
    int32_t *pos = weft_alloc(sizeof(int32_t) * (T > 0 ? T : 1));
    for (int d = 0; d < n_docs; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++) pos[t] = t - cu[d];
    c.layout = (weft_attention_layout){.n_docs = n_docs, .Tq = T, .Tkv = T, .cu_q = c.cu_d,
                                       .cu_kv = c.cu_d, .q_pos = dev_i32(pos, T)};
    weft_free(pos);
    c.q_d = dev_f32(c.q, NQ);
    c.k_d = dev_f32(c.k, NK);
    c.v_d = dev_f32(c.v, NK);
    c.out_d = dev_f32(NULL, NQ);
    c.lse_d = dev_f32(NULL, NL);
    char what[160];
#define ATTN_REPORT(fmt, err, tol) (snprintf(what, sizeof what, "attention %s " fmt, label), report(what, err, tol))

    attn_forward(&c);
    float *out = weft_alloc(sizeof(float) * NQ), *lse = weft_alloc(sizeof(float) * NL);
    download(out, c.out_d, NQ);
    download(lse, c.lse_d, NL);
    double *want_out = weft_alloc(sizeof(double) * NQ), *want_lse = weft_alloc(sizeof(double) * NL);
    attn_reference(&c, cu, want_out, want_lse);
    ATTN_REPORT("forward out vs naive double", rel_err_d(out, want_out, NQ), 1e-5);
    ATTN_REPORT("forward lse vs naive double", rel_err_d(lse, want_lse, NL), 1e-5);

    bool own_row_changed;
    ATTN_REPORT("forward cross-document/future leakage (max abs change)", attn_leak(&c, cu, out, &own_row_changed), 0);
    ATTN_REPORT("forward perturbed token's own row changes (0 = yes)", own_row_changed ? 0 : 1, 0);

    // Backward with dout = R, onto zeros and then onto garbage: dq, dk, dv are overwritten.
    attn_forward(&c);
    void *dout_d = dev_f32(c.R, NQ), *dq_d = dev_f32(NULL, NQ), *dk_d = dev_f32(NULL, NK),
         *dv_d = dev_f32(NULL, NK);
    float *g = weft_alloc(sizeof(float) * 2 * (NQ + 2 * NK));
    float *gq = g, *gk = gq + NQ, *gv = gk + NK, *gq2 = gv + NK, *gk2 = gq2 + NQ, *gv2 = gk2 + NK;
    B->attention_backward(B, c.q_d, c.k_d, c.v_d, &c.layout, c.out_d, c.lse_d, dout_d, dq_d,
                          dk_d, dv_d, H, KV, D);
    download(gq, dq_d, NQ);
    download(gk, dk_d, NK);
    download(gv, dv_d, NK);
    float *garbage = host_fill(NQ, 777.0f);
    upload(dq_d, garbage, NQ);
    upload(dk_d, garbage, NK);
    upload(dv_d, garbage, NK);
    B->attention_backward(B, c.q_d, c.k_d, c.v_d, &c.layout, c.out_d, c.lse_d, dout_d, dq_d,
                          dk_d, dv_d, H, KV, D);
    download(gq2, dq_d, NQ);
    download(gk2, dk_d, NK);
    download(gv2, dv_d, NK);
    snprintf(what, sizeof what, "attention %s backward dq overwrites", label);
    check_prefilled(what, gq, garbage, gq2, NQ, false);
    snprintf(what, sizeof what, "attention %s backward dk overwrites", label);
    check_prefilled(what, gk, garbage, gk2, NK, false);
    snprintf(what, sizeof what, "attention %s backward dv overwrites", label);
    check_prefilled(what, gv, garbage, gv2, NK, false);

    ATTN_REPORT("backward dq (fd)", fd_rel_err(attn_J, &c, c.q, NQ, gq, H_NONLINEAR), TOL_FD_NONLINEAR);
    ATTN_REPORT("backward dk (fd)", fd_rel_err(attn_J, &c, c.k, NK, gk, H_NONLINEAR), TOL_FD_NONLINEAR);
    ATTN_REPORT("backward dv (fd)", fd_rel_err(attn_J, &c, c.v, NK, gv, H_LINEAR), TOL_FD_LINEAR);
#undef ATTN_REPORT
}

// Context parallelism's use of the op: rank r of c passes as queries only its chunks r and
// 2c-1-r of each (padded) document, with their global positions, against the whole document's
// keys. Its output rows must equal the whole-document call's rows, its dq those rows' dq, and the
// dk, dv of the c ranks must sum to the whole call's dk, dv. Documents are padded to a multiple
// of 2c, as the CP split does.
static void test_attention_query_chunks(int H, int KV, int D, const int32_t *cu, int n_docs,
                                        int c) {
    int T = cu[n_docs], parts = 2 * c, HD = H * D, KD = KV * D;
    float *q = host_normal((size_t)T * HD, 0, 1), *k = host_normal((size_t)T * KD, 0, 1),
          *v = host_normal((size_t)T * KD, 0, 1), *dout = host_normal((size_t)T * HD, 0, 1);
    int32_t *pos = weft_alloc(sizeof(int32_t) * T);
    for (int d = 0; d < n_docs; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++) pos[t] = t - cu[d];
    void *q_d = dev_f32(q, (size_t)T * HD), *k_d = dev_f32(k, (size_t)T * KD),
         *v_d = dev_f32(v, (size_t)T * KD), *dout_d = dev_f32(dout, (size_t)T * HD);
    int32_t *cu_d = dev_i32(cu, n_docs + 1);
    weft_attention_layout whole = {n_docs, T, T, cu_d, cu_d, dev_i32(pos, T)};
    void *out_d = dev_f32(NULL, (size_t)T * HD), *dq_d = dev_f32(NULL, (size_t)T * HD),
         *dk_d = dev_f32(NULL, (size_t)T * KD), *dv_d = dev_f32(NULL, (size_t)T * KD);
    float *lse_d = dev_f32(NULL, (size_t)H * T);
    B->attention_forward(B, q_d, k_d, v_d, &whole, out_d, lse_d, H, KV, D);
    B->attention_backward(B, q_d, k_d, v_d, &whole, out_d, lse_d, dout_d, dq_d, dk_d, dv_d, H, KV, D);
    float *want_out = weft_alloc(sizeof(float) * T * HD), *want_dq = weft_alloc(sizeof(float) * T * HD),
          *want_dk = weft_alloc(sizeof(float) * T * KD), *want_dv = weft_alloc(sizeof(float) * T * KD);
    download(want_out, out_d, (size_t)T * HD);
    download(want_dq, dq_d, (size_t)T * HD);
    download(want_dk, dk_d, (size_t)T * KD);
    download(want_dv, dv_d, (size_t)T * KD);

    int Tq = T / c;
    int32_t *rows = weft_alloc(sizeof(int32_t) * Tq), *cu_q = weft_alloc(sizeof(int32_t) * (n_docs + 1)),
            *qpos = weft_alloc(sizeof(int32_t) * Tq);
    float *qr = weft_alloc(sizeof(float) * Tq * HD), *dor = weft_alloc(sizeof(float) * Tq * HD),
          *got = weft_alloc(sizeof(float) * Tq * HD), *want = weft_alloc(sizeof(float) * Tq * HD),
          *sum_dk = weft_alloc(sizeof(float) * T * KD), *sum_dv = weft_alloc(sizeof(float) * T * KD),
          *part = weft_alloc(sizeof(float) * T * KD);
    double err_out = 0, err_dq = 0;
    for (int r = 0; r < c; r++) {
        int n = 0;
        cu_q[0] = 0;
        for (int d = 0; d < n_docs; d++) {
            int s = (cu[d + 1] - cu[d]) / parts;
            for (int j = 0; j < 2; j++)
                for (int i = 0; i < s; i++) rows[n++] = cu[d] + (j ? parts - 1 - r : r) * s + i;
            cu_q[d + 1] = n;
        }
        for (int i = 0; i < Tq; i++) {
            qpos[i] = pos[rows[i]];
            memcpy(qr + (size_t)i * HD, q + (size_t)rows[i] * HD, sizeof(float) * HD);
            memcpy(dor + (size_t)i * HD, dout + (size_t)rows[i] * HD, sizeof(float) * HD);
        }
        weft_attention_layout chunks = {n_docs, Tq, T, dev_i32(cu_q, n_docs + 1), cu_d,
                                        dev_i32(qpos, Tq)};
        void *qr_d = dev_f32(qr, (size_t)Tq * HD), *dor_d = dev_f32(dor, (size_t)Tq * HD);
        void *or_d = dev_f32(NULL, (size_t)Tq * HD), *dqr_d = dev_f32(NULL, (size_t)Tq * HD);
        float *lser_d = dev_f32(NULL, (size_t)H * Tq);
        B->attention_forward(B, qr_d, k_d, v_d, &chunks, or_d, lser_d, H, KV, D);
        B->attention_backward(B, qr_d, k_d, v_d, &chunks, or_d, lser_d, dor_d, dqr_d, dk_d, dv_d,
                              H, KV, D);
        for (int pass = 0; pass < 2; pass++) {
            download(got, pass ? dqr_d : or_d, (size_t)Tq * HD);
            const float *src = pass ? want_dq : want_out;
            for (int i = 0; i < Tq; i++)
                memcpy(want + (size_t)i * HD, src + (size_t)rows[i] * HD, sizeof(float) * HD);
            double e = rel_err(got, want, (size_t)Tq * HD);
            if (pass) err_dq = fmax(err_dq, e);
            else err_out = fmax(err_out, e);
        }
        download(part, dk_d, (size_t)T * KD);
        for (size_t i = 0; i < (size_t)T * KD; i++) sum_dk[i] += part[i];
        download(part, dv_d, (size_t)T * KD);
        for (size_t i = 0; i < (size_t)T * KD; i++) sum_dv[i] += part[i];
        B->free(B, qr_d), B->free(B, dor_d), B->free(B, or_d), B->free(B, dqr_d), B->free(B, lser_d);
        B->free(B, (void *)chunks.cu_q), B->free(B, (void *)chunks.q_pos);
    }
    char what[160];
    snprintf(what, sizeof what, "attention on cp=%d query chunks: out rows == whole call's", c);
    report(what, err_out, 1e-6);
    snprintf(what, sizeof what, "attention on cp=%d query chunks: dq rows == whole call's", c);
    report(what, err_dq, 1e-6);
    snprintf(what, sizeof what, "attention on cp=%d query chunks: sum of ranks' dk == whole dk", c);
    report(what, rel_err(sum_dk, want_dk, (size_t)T * KD), 1e-6);
    snprintf(what, sizeof what, "attention on cp=%d query chunks: sum of ranks' dv == whole dv", c);
    report(what, rel_err(sum_dv, want_dv, (size_t)T * KD), 1e-6);
    weft_free(q), weft_free(k), weft_free(v), weft_free(dout), weft_free(pos), weft_free(rows);
    weft_free(cu_q), weft_free(qpos), weft_free(qr), weft_free(dor), weft_free(got), weft_free(want);
    weft_free(sum_dk), weft_free(sum_dv), weft_free(part), weft_free(want_out), weft_free(want_dq);
    weft_free(want_dk), weft_free(want_dv);
}

// ---------------------------------------------------------------------------------------------
// swiglu: out = silu(gate) * up; dgate, dup overwritten.

typedef struct swiglu_ctx {
    size_t N;
    float *gate, *up;
    void *gate_d, *up_d, *out_d;
    const float *R;
} swiglu_ctx;

static double swiglu_J(void *p) {
    swiglu_ctx *c = p;
    upload(c->gate_d, c->gate, c->N);
    upload(c->up_d, c->up, c->N);
    B->swiglu_forward(B, c->gate_d, c->up_d, c->out_d, c->N);
    return dot_dev(c->out_d, c->R, c->N);
}

static void test_swiglu(void) {
    enum { N = 40 };
    swiglu_ctx c = {.N = N, .gate = host_normal(N, 0, 2), .up = host_normal(N, 0, 1),
                    .R = host_normal(N, 0, 1)};
    c.gate_d = dev_f32(c.gate, N);
    c.up_d = dev_f32(c.up, N);
    c.out_d = dev_f32(NULL, N);

    B->swiglu_forward(B, c.gate_d, c.up_d, c.out_d, N);
    float out[N];
    double want[N];
    download(out, c.out_d, N);
    for (int i = 0; i < N; i++) want[i] = c.gate[i] / (1 + exp(-(double)c.gate[i])) * c.up[i];
    report("swiglu_forward vs double", rel_err_d(out, want, N), 1e-5);

    void *dout_d = dev_f32(c.R, N), *dg_d = dev_f32(NULL, N), *du_d = dev_f32(NULL, N);
    float gg[N], gu[N], gg2[N], gu2[N];
    B->swiglu_backward(B, c.gate_d, c.up_d, dout_d, dg_d, du_d, N);
    download(gg, dg_d, N);
    download(gu, du_d, N);
    float *garbage = host_fill(N, 777.0f);
    upload(dg_d, garbage, N);
    upload(du_d, garbage, N);
    B->swiglu_backward(B, c.gate_d, c.up_d, dout_d, dg_d, du_d, N);
    download(gg2, dg_d, N);
    download(gu2, du_d, N);
    check_prefilled("swiglu_backward dgate overwrites", gg, garbage, gg2, N, false);
    check_prefilled("swiglu_backward dup overwrites", gu, garbage, gu2, N, false);

    report("swiglu_backward dgate (fd)", fd_rel_err(swiglu_J, &c, c.gate, N, gg, H_NONLINEAR),
           TOL_FD_NONLINEAR);
    report("swiglu_backward dup (fd)", fd_rel_err(swiglu_J, &c, c.up, N, gu, H_LINEAR),
           TOL_FD_LINEAR);
}

// ---------------------------------------------------------------------------------------------
// cross_entropy: logits (T, V) become scale * (softmax - onehot) in place; per-row loss.

typedef struct ce_ctx {
    int T, V;
    float scale;
    float *logits;
    void *logits_d;
    const int32_t *targets_d;
    float *loss_d;
} ce_ctx;

// J = scale * sum of row losses (its gradient is what cross_entropy writes).
static double ce_J(void *p) {
    ce_ctx *c = p;
    upload(c->logits_d, c->logits, (size_t)c->T * c->V);
    B->cross_entropy(B, c->logits_d, c->targets_d, c->scale, c->loss_d, NULL, c->T, c->V);
    float loss[64];
    download(loss, c->loss_d, c->T);
    double s = 0;
    for (int t = 0; t < c->T; t++) s += loss[t];
    return c->scale * s;
}

static void test_cross_entropy(void) {
    enum { T = 6, V = 7 };
    const int32_t targets[T] = {2, -1, 0, 6, -1, 3};
    ce_ctx c = {.T = T, .V = V, .scale = 0.25f, .logits = host_normal(T * V, 0, 2),
                .targets_d = dev_i32(targets, T)};
    c.logits[0 * V + 2] += 6; // rows 0 and 3: the target is the argmax; the others most likely not
    c.logits[3 * V + 6] += 6;
    c.logits_d = dev_f32(c.logits, T * V);
    c.loss_d = dev_f32(NULL, T);
    float *correct_d = dev_f32(NULL, T);

    B->cross_entropy(B, c.logits_d, c.targets_d, c.scale, c.loss_d, correct_d, T, V);
    float grad[T * V], loss[T], correct[T];
    download(grad, c.logits_d, T * V);
    download(loss, c.loss_d, T);
    download(correct, correct_d, T);

    double want_loss[T], want_correct[T];
    double ignored = 0, wrong_correct = 0;
    for (int t = 0; t < T; t++) {
        const float *z = c.logits + t * V;
        double mx = -INFINITY, sum = 0;
        int arg = 0;
        for (int j = 0; j < V; j++) {
            if (z[j] > mx) mx = z[j], arg = j;
        }
        for (int j = 0; j < V; j++) sum += exp(z[j] - mx);
        want_loss[t] = targets[t] >= 0 ? mx + log(sum) - z[targets[t]] : 0;
        want_correct[t] = targets[t] >= 0 && arg == targets[t];
        wrong_correct += fabs(correct[t] - want_correct[t]);
        if (targets[t] < 0) {
            ignored = fmax(ignored, fabs(loss[t]));
            for (int j = 0; j < V; j++) ignored = fmax(ignored, fabs(grad[t * V + j]));
        }
    }
    report("cross_entropy row loss vs double", rel_err_d(loss, want_loss, T), 1e-5);
    report("cross_entropy correct flags (count wrong)", wrong_correct, 0);
    report("cross_entropy target -1 rows: 0 loss, 0 grad (max abs)", ignored, 0);
    report("cross_entropy grad (fd of scale * sum loss)",
           fd_rel_err(ce_J, &c, c.logits, T * V, grad, H_NONLINEAR), TOL_FD_NONLINEAR);
}

// ---------------------------------------------------------------------------------------------
// matmul: C = alpha op(A) op(B) + beta C against a naive triple loop in double, every transpose
// combination, padded row strides (padding holds huge values that must never be read, and C's
// padding must not be written).

static void test_matmul(void) {
    enum { M = 3, N = 4, K = 5, PAD = 2 };
    const float alphas[3] = {1.0f, 0.5f, -1.5f}, betas[3] = {0.0f, 1.0f, 0.25f};
    const weft_matmul_types f32 = {WEFT_F32, WEFT_F32, WEFT_F32};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + PAD;
            int b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + PAD;
            int ldc = N + PAD;
            float *a = host_fill((size_t)a_rows * lda, 1e30f), *b = host_fill((size_t)b_rows * ldb, 1e30f);
            for (int r = 0; r < a_rows; r++)
                for (int j = 0; j < a_cols; j++) a[r * lda + j] = (float)weft_rng_normal(&rng);
            for (int r = 0; r < b_rows; r++)
                for (int j = 0; j < b_cols; j++) b[r * ldb + j] = (float)weft_rng_normal(&rng);
            void *a_d = dev_f32(a, (size_t)a_rows * lda), *b_d = dev_f32(b, (size_t)b_rows * ldb);
            err_acc e = {0};
            double pad_written = 0;
            for (int s = 0; s < 3; s++) {
                float *c0 = host_normal((size_t)M * ldc, 0, 1);
                float cout[M * (N + PAD)];
                for (int i = 0; i < M; i++)
                    for (int j = N; j < ldc; j++) c0[i * ldc + j] = -7.0f;
                void *c_d = dev_f32(c0, (size_t)M * ldc);
                B->matmul(B, ta, tb, M, N, K, alphas[s], a_d, lda, b_d, ldb, betas[s], c_d, ldc, f32);
                download(cout, c_d, (size_t)M * ldc);
                for (int i = 0; i < M; i++) {
                    for (int j = 0; j < N; j++) {
                        double acc = 0;
                        for (int p = 0; p < K; p++) {
                            double av = ta ? a[p * lda + i] : a[i * lda + p];
                            double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                            acc += av * bv;
                        }
                        acc_add(&e, cout[i * ldc + j], alphas[s] * acc + betas[s] * c0[i * ldc + j]);
                    }
                    for (int j = N; j < ldc; j++) pad_written = fmax(pad_written, fabs(cout[i * ldc + j] + 7.0f));
                }
                B->free(B, c_d);
                weft_free(c0);
            }
            char what[96];
            snprintf(what, sizeof what, "matmul trans_a=%d trans_b=%d, 3 (alpha, beta) vs naive", ta, tb);
            report(what, pad_written > 0 ? INFINITY : acc_rel(&e), 1e-5);
            B->free(B, a_d), B->free(B, b_d);
            weft_free(a), weft_free(b);
        }
}

// ---------------------------------------------------------------------------------------------
// adamw: 3 steps against torch.optim.AdamW's update written out in double.

static void test_adamw(void) {
    enum { N = 24, STEPS = 3 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p0 = host_normal(N, 0, 1);
    double p[N], m[N] = {0}, v[N] = {0};
    for (int i = 0; i < N; i++) p[i] = p0[i];
    void *p_d = dev_f32(p0, N);
    float *g_d = dev_f32(NULL, N), *m_d = dev_f32(NULL, N), *v_d = dev_f32(NULL, N);
    for (int t = 1; t <= STEPS; t++) {
        float *g = host_normal(N, 0, 1);
        g[0] = 0;                                    // only weight decay moves it
        for (int i = 1; i < 5; i++) g[i] *= 1e-8f;   // sqrt(v_hat) ~ eps: eps placement matters
        upload(g_d, g, N);
        B->adamw(B, p_d, NULL, g_d, m_d, v_d, N, lr, b1, b2, eps, wd, t);
        double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
        for (int i = 0; i < N; i++) {
            p[i] -= (double)lr * wd * p[i];
            m[i] = b1 * m[i] + (1 - (double)b1) * g[i];
            v[i] = b2 * v[i] + (1 - (double)b2) * (double)g[i] * g[i];
            p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
        }
        weft_free(g);
    }
    float got_p[N], got_m[N], got_v[N];
    download(got_p, p_d, N);
    download(got_m, m_d, N);
    download(got_v, v_d, N);
    // Parameters are compared by their change over the 3 steps (about lr per step), which fp32
    // storage of p ~ 1 resolves to ~1e-7 / 3e-2: tolerance 1e-4.
    err_acc e = {0};
    for (int i = 0; i < N; i++) acc_add(&e, (double)got_p[i] - p0[i], p[i] - p0[i]);
    report("adamw param change after 3 steps vs double", acc_rel(&e), 1e-4);
    report("adamw m after 3 steps vs double", rel_err_d(got_m, m, N), 1e-5);
    report("adamw v after 3 steps vs double", rel_err_d(got_v, v, N), 1e-5);
}

// ---------------------------------------------------------------------------------------------
// sum_f32, sumsq_f32 (accumulated in double: with 1e5 positive terms an fp32 accumulator is off
// by 1e-7 to 1e-4, a double one by ~1e-14, hence tol 1e-9), scale_f32 and add_inplace (single
// correctly rounded fp32 operations: exact).

static void test_reductions(void) {
    enum { N = 100003 };
    float *x = weft_alloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = (float)weft_rng_uniform(&rng);
    float *x_d = dev_f32(x, N);
    double sum = 0, sumsq = 0;
    for (int i = 0; i < N; i++) sum += x[i], sumsq += (double)x[i] * x[i];
    report("sum_f32 vs double", fabs(B->sum_f32(B, x_d, N) - sum) / sum, 1e-9);
    report("sumsq_f32 vs double", fabs(B->sumsq_f32(B, x_d, N) - sumsq) / sumsq, 1e-9);

    float *got = weft_alloc(N * sizeof(float)), *want = weft_alloc(N * sizeof(float));
    B->scale_f32(B, x_d, -0.37f, N);
    download(got, x_d, N);
    for (int i = 0; i < N; i++) want[i] = x[i] * -0.37f;
    report("scale_f32 vs x * s", rel_err(got, want, N), 0);

    float *y = host_normal(N, 0, 1);
    void *y_d = dev_f32(y, N);
    upload(x_d, x, N);
    B->add_inplace(B, y_d, x_d, N);
    download(got, y_d, N);
    for (int i = 0; i < N; i++) want[i] = y[i] + x[i];
    report("add_inplace vs y + x", rel_err(got, want, N), 0);
}

int main(void) {
    B = weft_backend_cpu_create();
    WEFT_CHECK(B->act_dtype == WEFT_F32 && B->param_dtype == WEFT_F32,
               "this test expects the CPU backend's activations and parameters in fp32");
    weft_rng_seed(&rng, SEED);
    double t0 = weft_now_seconds();
    test_embedding();
    test_rmsnorm();
    test_bias();
    test_rope();
    // Documents of lengths 4, 1, 6, 3 packed back to back, grouped-query heads H = 4, KV = 2.
    const int32_t cu_small[] = {0, 4, 5, 11, 14};
    test_attention("[4,1,6,3] H4 KV2 D8", 4, 2, 8, cu_small, 4);
    // A document longer than 64 rows, so implementations that tile queries (the CPU one does, by
    // 64) are checked across a tile boundary; fewer heads keep the finite differences cheap.
    const int32_t cu_long[] = {0, 1, 68, 71};
    test_attention("[1,67,3] H2 KV1 D4", 2, 1, 4, cu_long, 3);
    // Padded documents of 8, 16 and 136 tokens: chunks of 1 to 17 rows, and tiles across chunks.
    const int32_t cu_padded[] = {0, 8, 24, 160};
    test_attention_query_chunks(4, 2, 8, cu_padded, 3, 4);
    test_attention_query_chunks(4, 2, 8, cu_padded, 3, 2);
    test_swiglu();
    test_cross_entropy();
    test_matmul();
    test_adamw();
    test_reductions();
    printf("%d check(s) failed, %.2f s\n", failures, weft_now_seconds() - t0);
    weft_backend_destroy(B);
    return failures ? 1 : 0;
}
