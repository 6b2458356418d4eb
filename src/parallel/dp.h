// parallel: data parallelism over the world group, with or without the distributed optimizer
// (DESIGN.md section 5). Gradients are SUMMED over ranks; the 1/N of the token mean is already in
// them (section 3), so no rank count appears anywhere.
#pragma once
#include "comm/comm.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/config.h"

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

// The hook a micro-batch's backward calls as gradients become final (weft_pass_options).
weft_grad_hook weft_dp_grad_hook(weft_dp *dp);
// Gradient sync of one step: arm before the last micro-batch's backward (buckets then start
// reducing as backward produces them); finish after it. Afterwards the owned range holds the
// gradient summed over all ranks (DDP: every element does).
void weft_dp_arm_last_microbatch(weft_dp *dp);
void weft_dp_finish_gradients(weft_dp *dp);
// After the optimizer step: all ranks get the updated parameters (distributed optimizer).
void weft_dp_gather_parameters(weft_dp *dp);
// Makes every rank's whole gradient buffer the summed gradient (for `weft grad` output).
void weft_dp_gather_gradients(weft_dp *dp);
