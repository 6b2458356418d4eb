#include "rl/advantage.h"

#include <math.h>

#include "rl/objective.h"

// verl's epsilon: a group whose rewards are all equal gets advantages 0, not 0/0.
static const double STD_EPS = 1e-6;

static void group_advantages(const weft_rl_config *cfg, const double *r, int n, double *a) {
    double sum = 0;
    for (int s = 0; s < n; s++) sum += r[s];
    double mean = sum / n;
    if (cfg->adv_estimator == WEFT_ADV_REINFORCE_PP_BASELINE) { // a group of one: no baseline
        for (int s = 0; s < n; s++) a[s] = n > 1 ? r[s] - mean : r[s];
        return;
    }
    if (cfg->adv_estimator == WEFT_ADV_RLOO) {
        for (int s = 0; s < n; s++) a[s] = n > 1 ? n / (n - 1.0) * (r[s] - mean) : 0.0;
        return;
    }
    double var = 0;
    for (int s = 0; s < n; s++) var += (r[s] - mean) * (r[s] - mean);
    double std = n > 1 ? sqrt(var / (n - 1)) : 0.0; // torch.std: unbiased, as verl uses
    for (int s = 0; s < n; s++)
        a[s] = cfg->norm_adv_by_std ? (r[s] - mean) / (std + STD_EPS) : r[s] - mean;
}

// x (n) whitened in place, each value standing for w of them (NULL: one each): minus their mean,
// over the square root of their unbiased variance plus 1e-8 (verl's masked_whiten over the
// batch's response tokens, where a sample's value stands for each of its tokens).
static void whiten(double *x, const int *w, size_t n) {
    double count = 0, sum = 0, var = 0;
    for (size_t i = 0; i < n; i++) count += w ? w[i] : 1, sum += (w ? w[i] : 1) * x[i];
    double mean = count > 0 ? sum / count : 0.0;
    for (size_t i = 0; i < n; i++) var += (w ? w[i] : 1) * (x[i] - mean) * (x[i] - mean);
    var = count > 1 ? var / (count - 1) : 0.0;
    double scale = 1.0 / sqrt(var + 1e-8);
    for (size_t i = 0; i < n; i++) x[i] = (x[i] - mean) * scale;
}

void weft_advantages(const weft_rl_config *cfg, const double *rewards, const int *lengths,
                     int n_groups, int n, double *advantages) {
    for (int g = 0; g < n_groups; g++)
        group_advantages(cfg, rewards + (size_t)g * n, n, advantages + (size_t)g * n);
    if (cfg->adv_estimator == WEFT_ADV_REINFORCE_PP_BASELINE)
        whiten(advantages, lengths, (size_t)n_groups * n);
}

void weft_reinforce_pp_advantages(const double *scores, const double *const *kl, double coef,
                                  const int *lengths, int N, float *const *out) {
    size_t T = 0;
    for (int i = 0; i < N; i++) T += (size_t)lengths[i];
    double *returns = weft_alloc(sizeof(double) * (T > 0 ? T : 1)), *at = returns;
    for (int i = 0; i < N; at += lengths[i], i++) {
        double running = 0;
        for (int t = lengths[i] - 1; t >= 0; t--) {
            running += (t == lengths[i] - 1 ? scores[i] : 0.0) - (kl ? coef * kl[i][t] : 0.0);
            at[t] = running;
        }
    }
    whiten(returns, NULL, T);
    at = returns;
    for (int i = 0; i < N; at += lengths[i], i++)
        for (int t = 0; t < lengths[i]; t++) out[i][t] = (float)at[t];
    weft_free(returns);
}

void weft_kl_penalties(const weft_rl_config *cfg, const float *old_logprobs,
                       const float *ref_logprobs, int len, double *out) {
    for (int t = 0; t < len; t++)
        out[t] = weft_rl_kl(cfg->kl_penalty, old_logprobs[t], ref_logprobs[t], NULL);
}

double weft_kl_coef_next(const weft_rl_config *cfg, double coef, double current_kl, int n_samples) {
    if (cfg->kl_ctrl == WEFT_KL_CTRL_FIXED) return coef;
    double error = fmin(fmax(current_kl / cfg->kl_target - 1.0, -0.2), 0.2);
    return coef * (1.0 + error * n_samples / cfg->kl_horizon);
}
