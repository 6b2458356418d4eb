#include "parallel/config.h"

weft_parallel_config weft_parallel_config_default(void) {
    return (weft_parallel_config){.use_distributed_optimizer = true,
                                  .overlap_grad_reduce = true,
                                  .context_parallel_size = 1,
                                  .max_seqlen_per_rank = 4096,
                                  // `weft calibrate` of the built-in model, 4 ranks on 2
                                  // cores (seconds); calibrate for any other model or machine.
                                  .cost_alpha = 2.2e-7,
                                  .cost_beta = 1.5e-4,
                                  .cost_gamma = 3.7e-4,
                                  .cost_delta = 1.7e-5,
                                  .debug_collectives = false,
                                  .collective_timeout = 300.0,
                                  .bucket_mb = 16};
}
