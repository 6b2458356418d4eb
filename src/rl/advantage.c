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

// REINFORCE++-baseline's second half (Hu et al. 2025, verl's reinforce_plus_plus_baseline): each
// sample's value stands for every token of its response, and the batch's tokens are whitened:
// minus their mean, over the square root of their unbiased variance plus 1e-8 (verl's
// masked_whiten).
static void whiten_over_tokens(const int *lengths, int N, double *a) {
    double tokens = 0, sum = 0, var = 0;
    for (int i = 0; i < N; i++) tokens += lengths[i], sum += lengths[i] * a[i];
    double mean = tokens > 0 ? sum / tokens : 0.0;
    for (int i = 0; i < N; i++) var += lengths[i] * (a[i] - mean) * (a[i] - mean);
    var = tokens > 1 ? var / (tokens - 1) : 0.0;
    double scale = 1.0 / sqrt(var + 1e-8);
    for (int i = 0; i < N; i++) a[i] = (a[i] - mean) * scale;
}

void weft_advantages(const weft_rl_config *cfg, const double *rewards, const int *lengths,
                     int n_groups, int n, double *advantages) {
    for (int g = 0; g < n_groups; g++)
        group_advantages(cfg, rewards + (size_t)g * n, n, advantages + (size_t)g * n);
    if (cfg->adv_estimator == WEFT_ADV_REINFORCE_PP_BASELINE)
        whiten_over_tokens(lengths, n_groups * n, advantages);
}

double weft_kl_penalty_sum(const weft_rl_config *cfg, const float *old_logprobs,
                           const float *ref_logprobs, int len) {
    double sum = 0;
    for (int t = 0; t < len; t++)
        sum += weft_rl_kl(cfg->kl_penalty, old_logprobs[t], ref_logprobs[t], NULL);
    return sum;
}

double weft_kl_coef_next(const weft_rl_config *cfg, double coef, double current_kl, int n_samples) {
    if (cfg->kl_ctrl == WEFT_KL_CTRL_FIXED) return coef;
    double error = fmin(fmax(current_kl / cfg->kl_target - 1.0, -0.2), 0.2);
    return coef * (1.0 + error * n_samples / cfg->kl_horizon);
}
