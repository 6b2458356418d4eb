// rl: the policy-gradient objective of DESIGN.md section 12 (PPO-clip with dual clip, or GSPO;
// KL to a reference; entropy bonus; verl's aggregation modes) over a mini-batch of RL rows, as a
// trainer's token objective. Every denominator is a global count of the mini-batch: the rows'
// masks, which every rank holds, give it without communication.
#pragma once
#include <jansson.h>

#include "rl/config.h"
#include "train/step.h"

typedef struct weft_rl_metrics {
    double loss;              // pg_loss + kl_loss_coef * kl_loss - entropy_coeff * entropy
    double pg_loss, kl_loss;  // aggregated with rl.loss_agg_mode, without their coefficients
    double entropy;           // aggregated likewise
    double pg_clipfrac;       // token mean: the clipped branch taken
    double pg_clipfrac_lower; // token mean: the dual clip taken (negative advantages)
    double ppo_kl;            // token mean of old_logp - logp
    double tis_weight;        // token mean of the truncated importance weight (1 when off)
    double tis_capped;        // token mean: the weight held at rl.tis_imp_ratio_cap
    long n_targets, n_sequences;
} weft_rl_metrics;

typedef struct weft_rl_objective weft_rl_objective;

// loss_scale_factor replaces cfg's when cfg's is 0; `source` names the rows in errors.
weft_rl_objective *weft_rl_objective_create(const weft_rl_config *cfg, double loss_scale_factor,
                                            const char *source);
void weft_rl_objective_free(weft_rl_objective *o);
// The hooks a trainer runs (weft_trainer_set_objective); valid while o lives.
const weft_token_objective *weft_rl_objective_hooks(weft_rl_objective *o);
// The last pass's metrics (every rank holds them after the pass).
weft_rl_metrics weft_rl_objective_metrics(const weft_rl_objective *o);
json_t *weft_rl_metrics_json(const weft_rl_metrics *m);
// KL to the reference of one token (type: weft_kl_type): k1 = logp - ref, k2 = (logp - ref)^2 / 2,
// k3 = exp(ref - logp) - (ref - logp) - 1 clamped to [-10, 10]; its derivative with respect to
// logp into d_logp unless NULL.
double weft_rl_kl(int type, double logp, double ref, double *d_logp);
