#include "rollout/config.h"

weft_sampling_config weft_sampling_config_default(void) {
    return (weft_sampling_config){.temperature = 1.0, .top_p = 1.0, .max_tokens = 256, .n = 1,
                                  .n_stop_token_ids = -1};
}

weft_rollout_config weft_rollout_config_default(void) {
    return (weft_rollout_config){.block_size = 16, .kv_cache_fraction = 0.5,
                                 .max_batch_tokens = 4096, .draft_bf16 = true,
                                 .cuda_graphs = true, .async_scheduling = true,
                                 .prefix_caching = true};
}

void weft_sampling_config_validate(const weft_sampling_config *c) {
    WEFT_CHECK(c->temperature >= 0, "sampling.temperature = %g must not be negative (0: greedy)",
               c->temperature);
    WEFT_CHECK(c->top_p > 0 && c->top_p <= 1, "sampling.top_p = %g must lie in (0, 1] (1: off)",
               c->top_p);
    WEFT_CHECK(c->min_p >= 0 && c->min_p <= 1, "sampling.min_p = %g must lie in [0, 1] (0: off)",
               c->min_p);
    WEFT_CHECK(c->top_k >= 0, "sampling.top_k = %d must not be negative (0: off)", c->top_k);
    WEFT_CHECK(c->n >= 1, "sampling.n = %d: give at least 1 sample per prompt", c->n);
    WEFT_CHECK(c->max_tokens >= 1, "sampling.max_tokens = %d: give at least 1 new token",
               c->max_tokens);
}

void weft_rollout_config_validate(const weft_rollout_config *c, int mtp_depth, const char *model) {
    WEFT_CHECK(c->block_size >= 1, "rollout.block_size = %d: give at least 1 position per block",
               c->block_size);
    WEFT_CHECK(c->speculative_tokens >= 0, "rollout.speculative_tokens = %d must not be negative "
               "(0: no speculation)", c->speculative_tokens);
    WEFT_CHECK(c->speculative_tokens == 0 || mtp_depth > 0, "rollout.speculative_tokens = %d, but "
               "the model %s has no MTP modules to draft with; set it to 0, or train the model "
               "with model.mtp_layers", c->speculative_tokens, model);
    WEFT_CHECK(c->speculative_tokens <= mtp_depth, "rollout.speculative_tokens = %d, but the model "
               "%s has %d MTP modules (depth %d); set it to at most %d", c->speculative_tokens,
               model, mtp_depth, mtp_depth, mtp_depth);
    WEFT_CHECK(c->max_batch_tokens >= 1 + c->speculative_tokens, "rollout.max_batch_tokens = %d "
               "cannot hold a sequence's token and its %d drafts; raise it", c->max_batch_tokens,
               c->speculative_tokens);
}
