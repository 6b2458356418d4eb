// parallel: the settings of a job's parallel layout (the `parallel.*` keys), read by dp.c (data
// parallelism and the distributed optimizer), cp.c (context-parallel groups), the planner (who runs
// which documents) and comm's configuration (debug checks, timeouts).
#pragma once
#include "core/core.h"

typedef enum { WEFT_DCP_UNIFORM, WEFT_DCP_HETEROGENEOUS } weft_dcp_mode;

typedef struct weft_parallel_config {
    bool use_distributed_optimizer; // parallel.use_distributed_optimizer (read only by dp.c)
    bool overlap_grad_reduce;       // parallel.overlap_grad_reduce: buckets reduce during backward
    int context_parallel_size;      // parallel.context_parallel_size (static CP)
    bool dynamic_context_parallel;  // parallel.dynamic_context_parallel: a CP degree per micro-batch
    int max_seqlen_per_rank;        // parallel.max_seqlen_per_rank: DCP's rows per rank
    int dcp_mode;                   // parallel.dcp_mode: a weft_dcp_mode
    // parallel.cost_*: the planner's cost model (weft_cost_model), fitted by `weft calibrate`
    double cost_alpha, cost_beta, cost_gamma, cost_delta, cost_epsilon;
    bool debug_collectives;         // parallel.debug_collectives: cross-check every collective
    double collective_timeout;      // parallel.collective_timeout: seconds before a wait aborts
    int bucket_mb;                  // parallel.bucket_mb: gradient bucket size
} weft_parallel_config;

weft_parallel_config weft_parallel_config_default(void);
