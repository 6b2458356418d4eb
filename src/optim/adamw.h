// optim: AdamW over (slices of) the flat parameter buffer, global-norm clipping, LR schedule.
#pragma once
#include "backend/backend.h"

typedef struct weft_optim_config {
    double lr, min_lr, beta1, beta2, eps, weight_decay, clip_grad;
    int warmup_steps, total_steps;
} weft_optim_config;

weft_optim_config weft_optim_config_default(void);
// Learning rate of step s (1-based): linear warmup to lr, then cosine decay to min_lr at the end.
double weft_lr_at(const weft_optim_config *cfg, int step);

// A tensor of the flat buffer as the optimizer sees it: where it is and whether it decays.
typedef struct weft_optim_segment {
    size_t offset, numel;
    bool weight_decay;
} weft_optim_segment;

// Elements [lo, hi) of the flat buffer.
typedef struct weft_optim_range {
    size_t lo, hi;
} weft_optim_range;

typedef struct weft_optimizer {
    weft_backend *be;
    weft_optim_config cfg;
    weft_optim_range *ranges; // the elements this optimizer updates, ascending and disjoint
    int n_ranges;
    size_t numel;             // their count: m, v and master hold them, range after range
    float *m, *v, *master;    // (numel) f32 each; master only when params are not f32
    // m, v (and master) in host memory (the backend's host_alloc, pinned on CUDA): allocated at
    // the first offload and kept, since the state leaves every RL step.
    float *host_state;
    bool offloaded;           // the state is in host_state, not on the device
    int step;
} weft_optimizer;

// State for the elements of ranges: all of them for DDP, the slices a rank owns for the
// distributed optimizer.
weft_optimizer *weft_optimizer_create(weft_backend *be, const weft_optim_config *cfg,
                                      const weft_optim_range *ranges, int n_ranges,
                                      const void *params);
void weft_optimizer_free(weft_optimizer *o);
size_t weft_optimizer_state_bytes(const weft_optimizer *o);
// While rollout runs (rl.offload_training_state) the state may wait in host memory: offload
// copies m, v and master there and frees them on the device; reload brings them back bit for
// bit (its copies may still be in flight when it returns: the host copy is kept unchanged until
// the next offload, which the stream orders after them). Nothing may step or read the state in
// between.
void weft_optimizer_offload(weft_optimizer *o);
void weft_optimizer_reload(weft_optimizer *o);
// Global-norm clipping factor for a squared norm summed over every gradient element:
// min(1, clip / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_; 1 when clipping is off.
double weft_clip_factor(const weft_optim_config *cfg, double grad_norm);
// One AdamW step over the optimizer's ranges with the gradients already clipped; returns the
// step's LR.
double weft_optimizer_step(weft_optimizer *o, void *params, const float *grads,
                           const weft_optim_segment *segs, int n_segs);
