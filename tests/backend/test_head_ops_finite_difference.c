// Finite-difference check of the CPU backend's output-head ops: the fused cross-entropy, the
// targets' log-probs and entropy (against double precision), and the backward of a per-row weighted
// objective sum_t w_t logp_t + u_t H_t (against finite differences of logprobs, and bit for bit
// against cross_entropy when u = 0 and w = -scale). The method and the tolerances:
// finite_difference.h.
#include "finite_difference.h"

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
// logprobs: logp (T) and entropy H (T) of the targets' rows; logits_backward: their weighted sum's
// gradient in place.

typedef struct lp_ctx {
    int T, V;
    float *logits, *w, *u;
    void *logits_d;
    const int32_t *targets_d;
    float *logp_d, *H_d;
} lp_ctx;

// J = sum_t w_t logp_t + u_t H_t, from the forward op alone.
static double lp_J(void *p) {
    lp_ctx *c = p;
    upload(c->logits_d, c->logits, (size_t)c->T * c->V);
    B->logprobs(B, c->logits_d, c->targets_d, c->logp_d, c->H_d, NULL, c->T, c->V);
    float logp[64], H[64];
    download(logp, c->logp_d, c->T);
    download(H, c->H_d, c->T);
    double s = 0;
    for (int t = 0; t < c->T; t++) s += (double)c->w[t] * logp[t] + (double)c->u[t] * H[t];
    return s;
}

static void check_logprobs_forward(lp_ctx *c, const int32_t *targets) {
    int T = c->T, V = c->V;
    float *correct_d = dev_f32(NULL, T), logp[64], H[64], correct[64];
    B->logprobs(B, c->logits_d, c->targets_d, c->logp_d, c->H_d, correct_d, T, V);
    download(logp, c->logp_d, T);
    download(H, c->H_d, T);
    download(correct, correct_d, T);
    double want_logp[64], want_H[64], wrong = 0;
    for (int t = 0; t < T; t++) {
        const float *z = c->logits + t * V;
        double mx = -INFINITY, sum = 0, ent = 0;
        int arg = 0;
        for (int j = 0; j < V; j++)
            if (z[j] > mx) mx = z[j], arg = j;
        for (int j = 0; j < V; j++) sum += exp(z[j] - mx);
        for (int j = 0; j < V; j++) ent -= exp(z[j] - mx) / sum * (z[j] - mx - log(sum));
        want_logp[t] = targets[t] >= 0 ? z[targets[t]] - mx - log(sum) : 0;
        want_H[t] = targets[t] >= 0 ? ent : 0;
        wrong += fabs(correct[t] - (targets[t] >= 0 && arg == targets[t]));
    }
    report("logprobs logp vs double", rel_err_d(logp, want_logp, T), 1e-5);
    report("logprobs entropy vs double", rel_err_d(H, want_H, T), 1e-5);
    report("logprobs correct flags (count wrong)", wrong, 0);
    B->free(B, correct_d);
}

// With u = 0 and w = -scale on target rows, logits_backward is cross_entropy's gradient, bit for
// bit (the SFT fast path and the weighted path give the same gradients).
static void check_cross_entropy_bits(lp_ctx *c) {
    int T = c->T, V = c->V;
    float scale = 0.25f, ce[64 * 8], weighted[64 * 8], *w = host_fill(T, -scale);
    float *w_d = dev_f32(w, T), *loss_d = dev_f32(NULL, T);
    upload(c->logits_d, c->logits, (size_t)T * V);
    B->cross_entropy(B, c->logits_d, c->targets_d, scale, loss_d, NULL, T, V);
    download(ce, c->logits_d, (size_t)T * V);
    upload(c->logits_d, c->logits, (size_t)T * V);
    B->logits_backward(B, c->logits_d, c->targets_d, w_d, NULL, T, V);
    download(weighted, c->logits_d, (size_t)T * V);
    report("logits_backward with w = -scale vs cross_entropy (bits differing)",
           memcmp(ce, weighted, sizeof(float) * T * V) ? 1 : 0, 0);
    weft_free(w);
    B->free(B, w_d), B->free(B, loss_d);
}

static void test_logprobs(void) {
    enum { T = 6, V = 7 };
    const int32_t targets[T] = {2, -1, 0, 6, -1, 3};
    lp_ctx c = {.T = T, .V = V, .logits = host_normal(T * V, 0, 2), .w = host_normal(T, 0, 1),
                .u = host_normal(T, 0, 1), .targets_d = dev_i32(targets, T)};
    c.logits[0 * V + 2] += 6;
    c.logits[3 * V + 6] += 6;
    c.logits_d = dev_f32(c.logits, T * V);
    c.logp_d = dev_f32(NULL, T);
    c.H_d = dev_f32(NULL, T);
    check_logprobs_forward(&c, targets);
    check_cross_entropy_bits(&c);

    float *w_d = dev_f32(c.w, T), *u_d = dev_f32(c.u, T), grad[T * V];
    upload(c.logits_d, c.logits, T * V);
    B->logits_backward(B, c.logits_d, c.targets_d, w_d, u_d, T, V);
    download(grad, c.logits_d, T * V);
    double ignored = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; t < T && targets[t] < 0 && j < V; j++) ignored = fmax(ignored, fabs(grad[t * V + j]));
    report("logits_backward target -1 rows: 0 grad (max abs)", ignored, 0);
    report("logits_backward grad (fd of sum w logp + u H)",
           fd_rel_err(lp_J, &c, c.logits, T * V, grad, H_NONLINEAR), TOL_FD_NONLINEAR);
    B->free(B, w_d), B->free(B, u_d);
}

// accumulate_f32 adds scale * sum(x), or scale * sum(x^2), to a device double, as sum_f32 and
// sumsq_f32 sum (tol as theirs).
static void test_accumulate(void) {
    enum { N = 100003 };
    float *x = host_normal(N, 0.5, 1);
    float *x_d = dev_f32(x, N);
    double *acc_d = B->alloc(B, sizeof(double)), acc = 0.75, sum = 0, sumsq = 0;
    for (int i = 0; i < N; i++) sum += x[i], sumsq += (double)x[i] * x[i];
    B->to_device(B, acc_d, &acc, sizeof acc);
    B->accumulate_f32(B, x_d, N, false, -2.0, acc_d);
    B->accumulate_f32(B, x_d, N, false, 1.0, acc_d);
    B->accumulate_f32(B, x_d, N, true, 0.5, acc_d);
    B->to_host(B, &acc, acc_d, sizeof acc);
    report("accumulate_f32 (0.75 - 2 sum + sum + sumsq / 2) vs double",
           fabs(acc - (0.75 - sum + 0.5 * sumsq)) / fabs(sumsq), 1e-9);
    weft_free(x);
    B->free(B, x_d), B->free(B, acc_d);
}

int main(void) {
    fd_begin();
    double t0 = weft_now_seconds();
    test_cross_entropy();
    test_logprobs();
    test_accumulate();
    return fd_end(t0);
}
