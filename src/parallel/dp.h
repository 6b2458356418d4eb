// parallel: data parallelism over the world group, with or without the distributed optimizer
// (DESIGN.md section 5). Gradients are SUMMED over ranks; the 1/N of the token mean is already in
// them (section 3), so no rank count appears anywhere.
#pragma once
#include "comm/comm.h"
#include "model/model.h"
#include "optim/adamw.h"

typedef struct weft_parallel_config {
    bool use_distributed_optimizer; // parallel.use_distributed_optimizer (read only by dp.c)
    int context_parallel_size;      // parallel.context_parallel_size (read by cp.c)
    bool dynamic_context_parallel;  // parallel.dynamic_context_parallel: a CP degree per micro-batch
    int max_seqlen_per_rank;        // parallel.max_seqlen_per_rank: DCP's rows per rank
    int dcp_mode;                   // parallel.dcp_mode: a weft_dcp_mode (uniform, heterogeneous)
    // parallel.cost_*: the planner's cost model (weft_cost_model), fitted by `weft calibrate`
    double cost_alpha, cost_beta, cost_gamma, cost_delta, cost_epsilon;
    bool debug_collectives;         // parallel.debug_collectives: cross-check every collective
    double collective_timeout;      // parallel.collective_timeout: seconds before a wait aborts
    int bucket_mb;                  // parallel.bucket_mb: DDP gradient bucket size
} weft_parallel_config;

weft_parallel_config weft_parallel_config_default(void);

typedef struct weft_dp weft_dp;

// Element multiple the model's buffers need so every rank's shard has the same size.
size_t weft_dp_pad_multiple(const weft_comm *world);
weft_dp *weft_dp_create(weft_comm *world, weft_model *m, const weft_parallel_config *cfg);
void weft_dp_free(weft_dp *dp);
// The optimizer for this rank: state for all elements (DDP) or only its shard (distributed).
weft_optimizer *weft_dp_create_optimizer(weft_dp *dp, const weft_optim_config *cfg);
// Elements [lo, hi) this rank owns: for the optimizer, and for its share of the gradient norm.
void weft_dp_owned_range(const weft_dp *dp, size_t *lo, size_t *hi);
bool weft_dp_is_sharded(const weft_dp *dp);

// Gradient sync of one step: arm before the last micro-batch's backward (DDP buckets then start
// reducing as backward produces them); finish after it. Afterwards the owned range holds the
// gradient summed over all ranks (DDP: every element does).
void weft_dp_arm_last_microbatch(weft_dp *dp);
void weft_dp_finish_gradients(weft_dp *dp);
// After the optimizer step: all ranks get the updated parameters (distributed optimizer).
void weft_dp_gather_parameters(weft_dp *dp);
// Makes every rank's whole gradient buffer the summed gradient (for `weft grad` output).
void weft_dp_gather_gradients(weft_dp *dp);
