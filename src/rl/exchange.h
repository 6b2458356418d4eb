// rl: the disaggregated layout's traffic (rl.rollout_ranks = R > 0, DESIGN.md section 11). Of the
// world's W ranks the first W - R train and the last R generate. Each batch goes from the rollout
// ranks to every trainer, and weights from trainer 0 to every rollout rank; both sides call
// these in the same order. Waits last up to rl.exchange_timeout: one side's wait spans the other
// side's generation or training.
#pragma once
#include "comm/comm.h"
#include "model/model.h"
#include "train/config.h"

typedef struct weft_rl_exchange weft_rl_exchange;

// NULL when rl.rollout_ranks is 0 (every rank trains and generates); collective over world. A
// layout that leaves no trainer is one error naming the settings.
weft_rl_exchange *weft_rl_exchange_create(weft_comm *world, weft_backend *be,
                                          const weft_job_config *cfg);
void weft_rl_exchange_free(weft_rl_exchange *x);
// This rank generates only.
bool weft_rl_exchange_generates(const weft_rl_exchange *x);
// The ranks of this rank's side: the trainers, or the rollout ranks.
weft_comm *weft_rl_exchange_side(const weft_rl_exchange *x);
int weft_rl_exchange_trainers(const weft_rl_exchange *x);
// The model's parameter buffer from trainer 0 to every rollout rank (other trainers: nothing).
void weft_rl_exchange_weights(weft_rl_exchange *x, weft_model *m);
// bytes from trainer 0 to every rank of the world (the state a job starts from).
void weft_rl_exchange_share(weft_rl_exchange *x, void *buf, size_t bytes);
// A packed batch from the rollout ranks (each passes its own copy, `packed`, `len`) to every
// trainer, which receives it (weft_alloc'd, *len set); the rollout ranks get NULL.
double *weft_rl_exchange_batch(weft_rl_exchange *x, const double *packed, size_t *len);
