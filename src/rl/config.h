// rl: the settings of the RL objective, `rl.*` (names follow verl's), a plain struct the job's
// settings registry fills.
#pragma once
#include "core/core.h"

typedef enum {
    WEFT_POLICY_LOSS_PPO,
    WEFT_POLICY_LOSS_GSPO,
    WEFT_POLICY_LOSS_CISPO,
    WEFT_POLICY_LOSS_GEO_MEAN,
} weft_policy_loss;
typedef enum { WEFT_KL_K1, WEFT_KL_K2, WEFT_KL_K3 } weft_kl_type;
// How per-token losses become one number (DESIGN.md section 12): token-mean over the mini-batch's
// targets; the others a mean over its sequences of each one's token mean, token sum, or token sum
// over rl.loss_scale_factor.
typedef enum {
    WEFT_AGG_TOKEN_MEAN,
    WEFT_AGG_SEQ_MEAN_TOKEN_MEAN,
    WEFT_AGG_SEQ_MEAN_TOKEN_SUM,
    WEFT_AGG_SEQ_MEAN_TOKEN_SUM_NORM,
} weft_loss_agg_mode;

typedef enum {
    WEFT_ADV_GRPO,
    WEFT_ADV_RLOO,
    WEFT_ADV_REINFORCE_PP_BASELINE,
    WEFT_ADV_REINFORCE_PP,
} weft_adv_estimator;
typedef enum { WEFT_KL_CTRL_FIXED, WEFT_KL_CTRL_ADAPTIVE } weft_kl_ctrl;
typedef enum { WEFT_REWARD_EXACT_MATCH, WEFT_REWARD_COMMAND } weft_reward_type;
enum { WEFT_REWARD_TEXT_MAX = 1024, WEFT_MAX_SAMPLES = 1024 };

typedef struct weft_reward_config {
    int type;                             // weft_reward_type
    char pattern[WEFT_REWARD_TEXT_MAX];   // exact_match: PCRE2; group 1 (else the match) is the answer
    char command[WEFT_REWARD_TEXT_MAX];   // command: a shell command line, one process per rank
    double timeout;                       // command: seconds per answer
    int processes;                        // command: processes per rank
    bool overlap; // score each response as its sample finishes, while the others generate
} weft_reward_config;

typedef struct weft_rl_config {
    int policy_loss;         // weft_policy_loss
    double clip_ratio_low;   // the ratio is clipped to [1 - low, 1 + high]
    double clip_ratio_high;  // (DAPO's clip-higher raises this one)
    double clip_ratio_c;     // dual clip for negative advantages (> 1; 0: off); PPO only
    double kl_loss_coef;     // 0: no KL term and no reference log-probs needed
    int kl_loss_type;        // weft_kl_type
    double entropy_coeff;    // weight of the entropy bonus
    // Truncated importance sampling (verl's tis_imp_ratio_cap): each token's policy-gradient term
    // times min(exp(old_logp - rollout_logp), cap), which corrects for the rollout engine's
    // log-probs differing from the trainer's (bf16 on a GPU; 0 on the CPU). 0: off.
    double tis_imp_ratio_cap;
    int loss_agg_mode;       // weft_loss_agg_mode
    // KL to the reference in the reward (verl's use_kl_in_reward): a sample's reward less
    // kl_coef times the sum over its response of kl_penalty(old logp, ref logp), before the
    // advantages. The coefficient stays fixed, or adapts after each step toward a per-token KL of
    // kl_target with horizon kl_horizon samples (Ziegler et al. 2019, as verl's kl_ctrl).
    bool use_kl_in_reward;
    int kl_penalty;          // weft_kl_type
    int kl_ctrl;             // weft_kl_ctrl
    double kl_coef;          // the coefficient (adaptive: its start)
    double kl_target, kl_horizon;
    double loss_scale_factor; // seq-mean-token-sum-norm's divisor; 0: sampling.max_tokens
    // The loop: train.steps RL steps of train.global_batch_size prompts x sampling.n samples.
    int adv_estimator;       // weft_adv_estimator
    bool norm_adv_by_std;    // GRPO divides by the group's std (false: Dr. GRPO)
    int ppo_epochs;          // passes over the step's samples
    int ppo_mini_batch_size; // prompts per policy update (0: the whole step's)
    // The built-in task's RL problems (harder than SFT's: more terms) and held-out evaluation.
    int min_terms, max_terms;
    int term_below; // every term is below this (0: the SFT task's mix of 1 to 4 digits)
    int eval_prompts, eval_every; // held-out problems scored every eval_every steps
    int eval_n;                   // responses per held-out problem (pass@k for k up to it)
    double eval_temperature;      // 0: greedy
    // DAPO: drop groups whose rewards are all equal and generate more, at most max_gen_batches
    // rounds per step; a soft penalty on responses within overlong_buffer tokens of
    // sampling.max_tokens, reaching -overlong_penalty at it (0: off).
    bool dynamic_sampling;
    int max_gen_batches;
    int overlong_buffer;
    double overlong_penalty;
    bool save_rollouts; // each step's samples to <train.output_dir>/rollouts/step_NNNNNN.jsonl
    // true: the trainer scores the samples for the old log-probs and the job measures how far
    // the rollout's were (DESIGN.md section 11); false: the rollout's recorded log-probs serve as
    // old, a scoring pass fewer (the same bits on the CPU; within bf16 round-off on a GPU, there
    // unmeasured).
    bool recompute_old_logprobs;
    // While rollout runs, AdamW's state (m, v, the fp32 master) waits in host memory and the
    // gradient buffers and the training passes' activation memory, which hold nothing between
    // steps, are freed: the KV pool gets their device memory, at the cost of two copies of the
    // state per step (verl's optimizer_offload, with the gradients and activations too).
    bool offload_training_state;
    // The disaggregated layout (DESIGN.md section 11): the last rollout_ranks ranks only
    // generate and score, the others only train (their own DP/CP layout); each step's samples
    // go to the trainers and the new weights back. one_step_off_policy: the rollout ranks
    // generate step k + 1 while the trainers train on step k, with the weights of step k - 1
    // (verl's one-step off-policy); every sample carries its weight version. exchange_timeout:
    // the longest either side waits for the other (a step's generation or training).
    int rollout_ranks;
    bool one_step_off_policy;
    double exchange_timeout;
} weft_rl_config;

weft_rl_config weft_rl_config_default(void);
weft_reward_config weft_reward_config_default(void);
void weft_rl_config_validate(const weft_rl_config *c);
