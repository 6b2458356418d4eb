// train: one optimizer step over a global batch, with the token-mean loss of DESIGN.md section 3.
#pragma once
#include "data/jsonl.h"
#include "data/microbatch.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "train/config.h"

typedef struct weft_trainer {
    weft_model *model;
    weft_optimizer *opt; // NULL for gradient-only use
    weft_optim_segment *segs;
    int n_segs;
    weft_job_config cfg;
    weft_batch batch; // reused packing buffer
} weft_trainer;

typedef struct weft_step_result {
    double loss;      // token-mean cross-entropy over the global batch
    double accuracy;  // top-1 over the targets
    int mtp_depth;
    double mtp_loss[WEFT_MAX_MTP];     // per depth k = 1..D: token mean over its own targets
    double mtp_accuracy[WEFT_MAX_MTP]; // top-1, the proxy for speculative-decoding acceptance
    double grad_norm; // before clipping
    double lr;
    long n_targets, n_tokens;
    double seconds;
} weft_step_result;

weft_trainer *weft_trainer_create(weft_model *m, const weft_job_config *cfg, bool with_optimizer);
void weft_trainer_free(weft_trainer *t);

// Zeroes the gradients, then leaves in them the gradient of the global batch's token-mean loss,
// accumulated over the plan's micro-batches. With logits_host (T_total, V) also returns the
// logits of every token in plan order.
weft_step_result weft_trainer_gradients(weft_trainer *t, const weft_document *docs, int n_docs,
                                        const weft_microbatch_plan *plan, float *logits_host);
// Gradients, clipping and one AdamW step.
weft_step_result weft_trainer_step(weft_trainer *t, const weft_document *docs, int n_docs,
                                   const weft_microbatch_plan *plan);
weft_memory_report weft_trainer_memory(const weft_trainer *t);
void weft_print_memory_report(const weft_memory_report *r);
