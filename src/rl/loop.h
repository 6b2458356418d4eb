// rl: `weft rl`, the hybrid-engine loop of DESIGN.md section 12. Every rank trains and generates:
// per step, train.global_batch_size prompts x sampling.n samples are generated with the trainer's
// own parameters (the KV pool exists only while they are), rewarded, turned into group
// advantages; the trainer recomputes the old log-probs in its own layout, then takes
// rl.ppo_epochs passes of rl.ppo_mini_batch_size-prompt policy updates; the weights' version
// goes up by one. With rl.rollout_ranks the last ranks generate and the others train
// (rl/exchange.h), in lockstep or one step off policy.
#pragma once
#include "train/config.h"
#include "train/session.h"

// The default RL job: GRPO on the built-in task's harder problems, from the default SFT job's
// final checkpoint.
weft_job_config weft_rl_defaults(void);
int weft_rl_run(const weft_job_config *cfg, weft_session *session, const char *stats_path);
