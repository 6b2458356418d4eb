// rl: advantages of a step's samples, per group of the n samples of one prompt (DESIGN.md
// section 12): GRPO (reward minus the group mean, optionally over the group's std: Dr. GRPO
// leaves it out), RLOO (reward minus the mean of the other samples) and REINFORCE++-baseline
// (reward minus the group mean, then whitened over the batch's response tokens); REINFORCE++'s
// per-token returns; and the rewards' KL penalty with its coefficient's controller.
#pragma once
#include "rl/config.h"

// rewards, lengths and advantages (n_groups * n), group g's samples at g * n ... g * n + n - 1;
// lengths: each response's tokens, by which REINFORCE++-baseline's whitening weighs a sample.
void weft_advantages(const weft_rl_config *cfg, const double *rewards, const int *lengths,
                     int n_groups, int n, double *advantages);

// REINFORCE++ (Hu et al. 2025, verl's reinforce_plus_plus): at token t of response i the return
// scores[i] - coef sum over t' >= t of kl[i][t'] (the reward at the last token, the KL in the
// reward at every token; kl NULL: none), whitened over the batch's response tokens as
// REINFORCE++-baseline's. lengths (N); kl and out (N) arrays of lengths[i].
void weft_reinforce_pp_advantages(const double *scores, const double *const *kl, double coef,
                                  const int *lengths, int N, float *const *out);
// KL in the reward: kl_penalty(old_t, ref_t) at each of a response's len tokens into out, the
// log-probs of the rollout policy and of the reference (rl.kl_penalty: weft_rl_kl's types).
void weft_kl_penalties(const weft_rl_config *cfg, const float *old_logprobs,
                       const float *ref_logprobs, int len, double *out);
// The coefficient for the next step, after one whose n_samples responses had a mean per-token
// KL of current_kl: unchanged with rl.kl_ctrl=fixed; adaptive: coef (1 + e n_samples / horizon),
// e = current_kl / kl_target - 1 clipped to [-0.2, 0.2].
double weft_kl_coef_next(const weft_rl_config *cfg, double coef, double current_kl, int n_samples);
