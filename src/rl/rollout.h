// rl: one step's generation in the hybrid engine. The KV pool exists only inside this call (wake
// at its start, sleep at its end); the engine reads the trainer's own parameter buffer. Prompts
// are spread over the ranks by estimated cost, each rank scores its own samples, and every rank
// leaves with all of them (the trainer's layout needs the whole batch on every rank).
#pragma once
#include "comm/comm.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "rl/reward.h"
#include "rl/task.h"
#include "rollout/config.h"

typedef struct weft_rl_sample {
    int32_t *tokens; // (len) the response's tokens, the stop token included
    float *logprobs; // (len) as the rollout recorded them
    int len;
    bool truncated;  // stopped by sampling.max_tokens
    double reward;
} weft_rl_sample;

typedef struct weft_rl_rollout_stats {
    double seconds;        // generation and rewards, this rank
    double reward_seconds; // waiting for rewards after generation, this rank
    long rewards_while_generating; // rewards in before their rank's generation ended, all ranks
    long tokens;           // generated, all ranks
    long preemptions;      // all ranks
    long prefix_hits;      // positions the prefix cache held instead of computing, all ranks
    double pool_bytes;     // the KV pool this rank allocated at wake and freed at sleep
    // Speculative decoding (rollout.speculative_tokens = k > 0), all ranks: per depth the share
    // of drafts accepted, and tokens emitted per verification.
    int spec_depth;
    double spec_acceptance[WEFT_MAX_MTP], spec_tokens_per_verify;
} weft_rl_rollout_stats;

typedef struct weft_rl_rollout_request {
    const weft_rollout_config *rollout;
    const weft_sampling_config *sampling;
    const weft_tokenizer *tok;
    weft_reward *reward;
    const weft_rl_prompt *const *prompts; // (n_prompts)
    int n_prompts;
    long stream; // the random streams of prompt k are those of index stream + k
    bool overlap_rewards; // reward.overlap: each sample scored as it finishes
} weft_rl_rollout_request;

// out: n_prompts * sampling.n samples, prompt k's sample s at k * n + s (weft_rl_samples_free).
weft_rl_rollout_stats weft_rl_rollout(weft_model *m, weft_comm *world,
                                      const weft_rl_rollout_request *rq, weft_rl_sample *out);
void weft_rl_samples_free(weft_rl_sample *s, int n);
