#include "rollout/config.h"

weft_sampling_config weft_sampling_config_default(void) {
    return (weft_sampling_config){.temperature = 1.0, .top_p = 1.0, .max_tokens = 256, .n = 1,
                                  .n_stop_token_ids = -1};
}

weft_rollout_config weft_rollout_config_default(void) {
    return (weft_rollout_config){.block_size = 16, .kv_cache_fraction = 0.5,
                                 .max_batch_tokens = 4096};
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
