#include "rl/config.h"

#include <math.h>
#include <stdio.h>

weft_rl_config weft_rl_config_default(void) {
    return (weft_rl_config){.policy_loss = WEFT_POLICY_LOSS_PPO, .clip_ratio_low = 0.2,
                            .clip_ratio_high = 0.2, .clip_ratio_c = 3.0,
                            .kl_loss_type = WEFT_KL_K3, .loss_agg_mode = WEFT_AGG_TOKEN_MEAN,
                            .kl_penalty = WEFT_KL_K1, .kl_ctrl = WEFT_KL_CTRL_FIXED,
                            .kl_coef = 0.001, .kl_target = 0.1, .kl_horizon = 10000,
                            .adv_estimator = WEFT_ADV_GRPO, .norm_adv_by_std = true,
                            .ppo_epochs = 1, .min_terms = 2, .max_terms = 4, .term_below = 10,
                            .eval_prompts = 128, .eval_every = 5, .eval_n = 1,
                            .max_gen_batches = 10,
                            .overlong_penalty = 1.0, .recompute_old_logprobs = true,
                            .exchange_timeout = 3600.0};
}

weft_reward_config weft_reward_config_default(void) {
    weft_reward_config c = {.type = WEFT_REWARD_EXACT_MATCH, .timeout = 30.0, .processes = 1,
                            .overlap = true};
    snprintf(c.pattern, sizeof c.pattern, "so (-?[0-9]+)\\s*$");
    return c;
}

void weft_rl_config_validate(const weft_rl_config *c) {
    WEFT_CHECK(c->clip_ratio_low >= 0 && c->clip_ratio_low < 1 && c->clip_ratio_high >= 0 &&
                   isfinite(c->clip_ratio_high),
               "rl.clip_ratio_low = %g must lie in [0, 1) and rl.clip_ratio_high = %g be finite "
               "and not negative", c->clip_ratio_low, c->clip_ratio_high);
    WEFT_CHECK(c->clip_ratio_c == 0 || (c->clip_ratio_c > 1 && isfinite(c->clip_ratio_c)),
               "rl.clip_ratio_c = %g: the dual clip's bound must be above 1 (0: off)",
               c->clip_ratio_c);
    WEFT_CHECK(isfinite(c->kl_loss_coef) && c->kl_loss_coef >= 0,
               "rl.kl_loss_coef = %g must be finite and not negative (0: no KL term)",
               c->kl_loss_coef);
    WEFT_CHECK(isfinite(c->kl_coef) && c->kl_coef >= 0, "rl.kl_coef = %g must be finite and not "
               "negative", c->kl_coef);
    WEFT_CHECK(c->kl_ctrl != WEFT_KL_CTRL_ADAPTIVE ||
                   (c->kl_target > 0 && isfinite(c->kl_target) && c->kl_horizon > 0 &&
                    isfinite(c->kl_horizon) && c->kl_coef > 0),
               "rl.kl_ctrl=adaptive needs rl.kl_target > 0 (now %g), rl.kl_horizon > 0 (now %g) "
               "and rl.kl_coef > 0 to start from (now %g): the coefficient is multiplied each "
               "step", c->kl_target, c->kl_horizon, c->kl_coef);
    WEFT_CHECK(isfinite(c->tis_imp_ratio_cap) && c->tis_imp_ratio_cap >= 0,
               "rl.tis_imp_ratio_cap = %g must be finite and not negative (0: off; verl's "
               "examples use 2)", c->tis_imp_ratio_cap);
    WEFT_CHECK(isfinite(c->entropy_coeff), "rl.entropy_coeff = %g must be finite",
               c->entropy_coeff);
    WEFT_CHECK(isfinite(c->loss_scale_factor) && c->loss_scale_factor >= 0,
               "rl.loss_scale_factor = %g must be positive (0: sampling.max_tokens)",
               c->loss_scale_factor);
    WEFT_CHECK(c->ppo_epochs >= 1, "rl.ppo_epochs = %d: give at least 1", c->ppo_epochs);
    WEFT_CHECK(c->ppo_mini_batch_size >= 0, "rl.ppo_mini_batch_size = %d must not be negative "
               "(0: the whole step's prompts)", c->ppo_mini_batch_size);
    WEFT_CHECK(c->min_terms >= 2 && c->max_terms >= c->min_terms && c->max_terms <= 48,
               "rl.min_terms = %d and rl.max_terms = %d must satisfy 2 <= min <= max <= 48",
               c->min_terms, c->max_terms);
    WEFT_CHECK(c->max_gen_batches >= 1, "rl.max_gen_batches = %d: give at least 1 round",
               c->max_gen_batches);
    WEFT_CHECK(c->overlong_buffer >= 0 && isfinite(c->overlong_penalty) &&
                   c->overlong_penalty >= 0,
               "rl.overlong_buffer = %d and rl.overlong_penalty = %g must not be negative (a "
               "buffer of 0: no penalty)", c->overlong_buffer, c->overlong_penalty);
    WEFT_CHECK(c->term_below >= 0 && c->term_below <= 1000000000, "rl.term_below = %d must lie "
               "in [0, 1e9] (0: the SFT task's numbers)", c->term_below);
    WEFT_CHECK(c->rollout_ranks >= 0, "rl.rollout_ranks = %d must not be negative (0: every "
               "rank trains and generates)", c->rollout_ranks);
    WEFT_CHECK(!c->one_step_off_policy || c->rollout_ranks > 0, "rl.one_step_off_policy=true "
               "needs rl.rollout_ranks > 0: when every rank both trains and generates, nothing "
               "would overlap; give some ranks to generation, or drop the setting");
    WEFT_CHECK(isfinite(c->exchange_timeout) && c->exchange_timeout > 0, "rl.exchange_timeout = "
               "%g must be a positive number of seconds", c->exchange_timeout);
    WEFT_CHECK(c->policy_loss != WEFT_POLICY_LOSS_GEO_MEAN || c->tis_imp_ratio_cap == 0,
               "rl.policy_loss=geo_mean with rl.tis_imp_ratio_cap=%g: GMPO's objective is one "
               "ratio per sequence, which a per-token importance weight does not fit; use "
               "rl.policy_loss=ppo, gspo or cispo with it, or drop the cap", c->tis_imp_ratio_cap);
    WEFT_CHECK(c->eval_n >= 1 && c->eval_n <= WEFT_MAX_SAMPLES, "rl.eval_n = %d: give 1 to %d "
               "responses per held-out problem", c->eval_n, WEFT_MAX_SAMPLES);
    WEFT_CHECK(isfinite(c->eval_temperature) && c->eval_temperature >= 0, "rl.eval_temperature "
               "= %g must be finite and not negative (0: greedy)", c->eval_temperature);
    WEFT_CHECK(c->eval_n == 1 || c->eval_temperature > 0, "rl.eval_n = %d with "
               "rl.eval_temperature = 0: greedy responses to one problem are all the same one; "
               "give a temperature (verl's validations sample at 0.6 to 1), or rl.eval_n=1",
               c->eval_n);
    WEFT_CHECK(c->eval_prompts >= 0 && c->eval_every >= 0, "rl.eval_prompts and rl.eval_every "
               "must not be negative (0: no evaluation)");
}
