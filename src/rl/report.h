// rl: what one RL step measured, and how the job reports it: a metrics.jsonl line, the progress
// line, the memory line and the --stats JSON.
#pragma once
#include <stdio.h>

#include "rl/evaluate.h"
#include "rl/objective.h"
#include "rl/rollout.h"

// What one step measured, written as one line of metrics.jsonl.
typedef struct weft_rl_step_metrics {
    double reward_mean, reward_std, accuracy;
    double length_mean, length_max, clip_frac; // responses; clip: stopped by max_tokens
    weft_rl_metrics loss;                      // averaged over the step's updates
    double grad_norm, lr;
    double mismatch_max, mismatch_mean, mismatch_k3; // rollout vs trainer log-probs
    double rollout_seconds, rollout_tokens, old_logprob_seconds, update_seconds, step_seconds;
    double reward_seconds, rewards_while_generating; // summed over the step's rounds
    double sample_wait_seconds; // the trainers waiting for the rollout ranks' samples
    int rollout_weight_version; // the weights the samples were generated with
    weft_rl_eval eval; // total.accuracy < 0: not evaluated this step
    // KL in the reward: the responses' mean per-token KL to the reference and the coefficient
    // the step's rewards were charged at (< 0: rl.use_kl_in_reward is off).
    double reward_kl, reward_kl_coef;
    weft_rl_rollout_stats rollout; // the last generation round's
    int gen_rounds, groups, groups_dropped; // dynamic sampling: rounds run, groups trained on
    // Measured device bytes (the backend's live allocations): before the wake, the rollout
    // phase's peak, after the sleep, and the training phase's peak.
    double bytes_before_rollout, rollout_peak_bytes, bytes_after_sleep, training_peak_bytes;
    double offloaded_bytes; // rl.offload_training_state: device bytes given up for rollout
} weft_rl_step_metrics;

void weft_rl_write_metrics(FILE *f, int step, const weft_rl_step_metrics *m);
void weft_rl_print_step(int step, int steps, const weft_rl_step_metrics *m, bool disaggregated);
// The two phases' memory in the last step.
void weft_rl_print_memory(const weft_rl_step_metrics *m, bool disaggregated);
// "<prefix>0.512" (mean@n), then " (pass@8 0.700)" when there are several responses a problem.
char *weft_rl_describe_eval(char *out, size_t size, const char *prefix, const weft_rl_eval *e);
// Held-out accuracy (and pass@k) at the start and the end, and the steps; path NULL: nothing.
void weft_rl_save_stats(const char *path, const weft_rl_eval *start, const weft_rl_eval *end,
                        int steps);
