// The CPU backend's output-head ops: cross-entropy (the row turned into its gradient in place),
// per-token log-probs and entropies, and the gradient of a weighted sum of both (RL objectives).
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/internal.h"

// Every head op finds a row's max, argmax and sum of exp(x - max) the same way (row_softmax), so
// cross_entropy's loss, logprobs and logits_backward agree to the bit.

typedef struct softmax_row {
    float max;
    int arg;    // first index of the max
    double sum; // of exp(x - max), weft_cpu_exp_sum's
} softmax_row;

static softmax_row row_max(const float *row, int V) {
    softmax_row s = {weft_cpu_row_max(row, V), 0, 0.0};
    while (s.arg < V - 1 && !(row[s.arg] == s.max)) s.arg++;
    return s;
}

// e (V floats, or NULL) receives exp(x - max).
static softmax_row row_softmax(const float *row, int V, float *e) {
    softmax_row s = row_max(row, V);
    s.sum = weft_cpu_exp_sum(row, 1.0f, s.max, e, (size_t)V);
    return s;
}

static float row_loss_of(const softmax_row *s, float target_logit) {
    return (float)(s->max + log(s->sum) - target_logit);
}

// H = -sum_j p_j log p_j = log(sum) - sum_j e_j (x_j - max) / sum, with e_j = exp(x_j - max).
static double row_entropy(const float *row, const float *e, const softmax_row *s, int V) {
    return log(s->sum) - weft_cpu_dot_shifted(e, row, s->max, (size_t)V) / s->sum;
}

// The row becomes scale * (softmax - onehot(y)); returns its loss.
static float cross_entropy_row(float *row, int y, float scale, int V, bool *correct) {
    float target_logit = row[y];
    softmax_row s = row_softmax(row, V, row);
    *correct = s.arg == y;
    float k = (float)(scale / s.sum);
    for (int j = 0; j < V; j++) row[j] *= k;
    row[y] -= scale;
    return row_loss_of(&s, target_logit);
}

void weft_cpu_cross_entropy(weft_backend *self, void *logitsv, const int32_t *targets,
                            float scale, float *row_loss, float *correct, int T, int V) {
    float *logits = logitsv;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *row = logits + (size_t)t * V;
        int y = targets[t];
        bool right = false;
        if (y < 0) memset(row, 0, sizeof(float) * V);
        row_loss[t] = y < 0 ? 0.0f : cross_entropy_row(row, y, scale, V, &right);
        if (correct) correct[t] = right ? 1.0f : 0.0f;
    }
}

static void logprob_rows(weft_backend *self, const float *logits, const int32_t *targets,
                         float *logprob, float *entropy, float *correct, int T, int V) {
    float *e = entropy ? weft_cpu_scratch(self, 0, (size_t)V) : NULL;
#pragma omp for schedule(static) nowait
    for (int t = 0; t < T; t++) {
        const float *row = logits + (size_t)t * V;
        int y = targets[t];
        softmax_row s = y < 0 ? (softmax_row){0} : row_softmax(row, V, e);
        logprob[t] = y < 0 ? 0.0f : -row_loss_of(&s, row[y]);
        if (entropy) entropy[t] = y < 0 ? 0.0f : (float)row_entropy(row, e, &s, V);
        if (correct) correct[t] = y >= 0 && s.arg == y ? 1.0f : 0.0f;
    }
}

void weft_cpu_logprobs(weft_backend *self, const void *logits, const int32_t *targets,
                       float *logprob, float *entropy, float *correct, int T, int V) {
    WEFT_CPU_PARALLEL((size_t)T * V,
                      logprob_rows(self, logits, targets, logprob, entropy, correct, T, V));
}

// d/dx_j of (w logp_y + u H) = w (onehot_j - p_j) - u p_j (log p_j + H); e: V floats of scratch.
static void weighted_row(float *row, float *e, int y, float w, float u, int V) {
    softmax_row s = row_softmax(row, V, e);
    double H = row_entropy(row, e, &s, V), lse = s.max + log(s.sum);
    for (int j = 0; j < V; j++) {
        double logp = row[j] - lse, p = exp(logp);
        row[j] = (float)(w * ((j == y) - p) - u * p * (logp + H));
    }
}

void weft_cpu_logits_backward(weft_backend *self, void *logitsv, const int32_t *targets,
                              const float *d_logprob, const float *d_entropy, int T, int V) {
    float *logits = logitsv;
#pragma omp parallel
    {
        float *e = d_entropy ? weft_cpu_scratch(self, 0, (size_t)V) : NULL;
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            float *row = logits + (size_t)t * V;
            int y = targets[t];
            float w = d_logprob ? d_logprob[t] : 0.0f, u = d_entropy ? d_entropy[t] : 0.0f;
            bool right;
            if (y < 0) memset(row, 0, sizeof(float) * V);
            else if (u == 0.0f) cross_entropy_row(row, y, -w, V, &right); // the SFT path's bits
            else weighted_row(row, e, y, w, u, V);
        }
    }
}
