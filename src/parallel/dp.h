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
// The elements this rank owns: all of them (DDP), or (distributed optimizer) its slice of every
// gradient bucket. The optimizer for this rank holds state for them only, concatenated in its own
// order, which the functions below know.
weft_optimizer *weft_dp_create_optimizer(weft_dp *dp, const weft_optim_config *cfg);
bool weft_dp_is_sharded(const weft_dp *dp);
// The distributed optimizer's reduce-scatter targets, given back while no backward runs (the RL
// loop's rollout, weft_trainer_sleep) and allocated again after, once the model's gradient
// buffer is back.
void weft_dp_release_buffers(weft_dp *dp);
void weft_dp_restore_buffers(weft_dp *dp);
// Adds to *acc (one f64 in device memory) this rank's share of the squared gradient norm, which
// summed over ranks is the whole norm: the sum over its owned elements, or (DDP, where every rank
// owns all) over 1/world of them. The host does not wait.
void weft_dp_owned_sumsq(weft_dp *dp, double *acc);
// Multiplies the owned gradient elements by factor (clipping).
void weft_dp_scale_owned(weft_dp *dp, float factor);
// For checkpoints: an array of the optimizer's state (owned elements, in optimizer order) laid
// out like the whole flat buffer, every rank's part (collective: every rank enters and gets all
// n_padded elements) ...
void weft_dp_gather_owned(weft_dp *dp, const float *owned, float *whole);
// ... and back: this rank's part of a whole-buffer-shaped array, in optimizer order.
void weft_dp_select_owned(const weft_dp *dp, const float *whole, float *owned);

// The hook a micro-batch's backward calls as gradients become final (weft_pass_options).
weft_grad_hook weft_dp_grad_hook(weft_dp *dp);
// Gradient sync of one step: arm before the last micro-batch's backward (with
// parallel.overlap_grad_reduce, buckets then start reducing as backward finishes them, an
// all-reduce each for DDP, a reduce-scatter for the distributed optimizer); finish after it.
// Afterwards the owned elements hold the gradient summed over all ranks (DDP: every element).
void weft_dp_arm_last_microbatch(weft_dp *dp);
void weft_dp_finish_gradients(weft_dp *dp);
// After the optimizer step: all ranks get the updated parameters (distributed optimizer).
void weft_dp_gather_parameters(weft_dp *dp);
// Makes every rank's whole gradient buffer the summed gradient (for `weft grad` output).
void weft_dp_gather_gradients(weft_dp *dp);
