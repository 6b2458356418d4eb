// train: one optimizer step over a global batch, with the token-mean loss of DESIGN.md section 3,
// on one rank or data-parallel over many.
#pragma once
#include "comm/comm.h"
#include "data/jsonl.h"
#include "data/microbatch.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/cp.h"
#include "parallel/dcp.h"
#include "parallel/dp.h"
#include "train/config.h"

typedef struct weft_trainer {
    weft_model *model;
    weft_comm *world;
    weft_dp *dp;
    weft_cp *cp;         // context-parallel groups (size 1: documents stay whole)
    weft_optimizer *opt; // NULL for gradient-only use
    weft_optim_segment *segs;
    int n_segs;
    weft_job_config cfg;
    weft_batch batch; // reused packing buffer
    // The last gradient computation's micro-batches on this rank: CP degree and busy seconds
    // (wall time minus time inside CP collectives), for load-balance reports.
    int n_micro, micro_capacity;
    int *micro_degree;
    double *micro_busy;
} weft_trainer;

typedef struct weft_step_result {
    double loss;      // token-mean cross-entropy over the global batch
    double accuracy;  // top-1 over the targets
    int mtp_depth;
    double mtp_loss[WEFT_MAX_MTP];     // per depth k = 1..D: token mean over its own targets
    double mtp_accuracy[WEFT_MAX_MTP]; // top-1, the proxy for speculative-decoding acceptance
    double grad_norm; // before clipping
    double lr;
    long n_targets, n_tokens;   // global
    long local_docs, local_tokens;
    double seconds;
    double sync_wait_seconds; // time blocked finishing the gradient collectives after backward
    double cp_comm_seconds;   // time in context-parallel key/value collectives
} weft_step_result;

// The longest document a job on `world` ranks can train whole: each rank's rows of it must fit
// train.max_tokens_per_microbatch (0: no limit), or parallel.max_seqlen_per_rank under dynamic
// CP, and context parallelism spreads a document over parallel.context_parallel_size ranks (all
// of them under dynamic CP). `why` receives the settings that make the limit.
int weft_trainer_max_document_len(const weft_job_config *cfg, int world, char *why,
                                  size_t why_size);

// Builds the model the job's parallel layout needs (buffers padded for sharding) on `be`.
weft_model *weft_trainer_build_model(weft_backend *be, const weft_comm *world,
                                     const weft_model_config *mc);
weft_trainer *weft_trainer_create(weft_model *m, weft_comm *world, const weft_job_config *cfg,
                                  bool with_optimizer);
void weft_trainer_free(weft_trainer *t);

// Zeroes the gradients, then leaves in them the gradient of the global batch's objective: this
// rank's context-parallel group takes its cost-balanced share of docs (the whole batch with one
// group), this rank its chunks of them, packed into micro-batches; gradients are summed over all
// ranks. Optional outputs, rows = the batch's tokens in batch order (T_total): out->logits
// (T_total, V), one rank only; out->logprobs (T_total): log p(token t | tokens before it) at
// every target token t (loss_mask[t] = 1), 0 elsewhere, gathered from every rank.
weft_step_result weft_trainer_gradients(weft_trainer *t, const weft_document *docs, int n_docs,
                                        const weft_model_outputs *out);
// Gradients, clipping and one AdamW step.
weft_step_result weft_trainer_step(weft_trainer *t, const weft_document *docs, int n_docs);
// Makes every rank's gradient buffer hold the full summed gradient (for output).
void weft_trainer_gather_gradients(weft_trainer *t);
weft_memory_report weft_trainer_memory(const weft_trainer *t);
void weft_print_memory_report(const weft_memory_report *r);
