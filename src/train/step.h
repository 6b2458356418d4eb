// train: one optimizer step over a global batch, with the token-mean loss of DESIGN.md section 3,
// on one rank or over many. The planner (parallel/planner.h) says which micro-batches this rank
// runs at which context-parallel degree; the trainer runs them and reduces the results.
#pragma once
#include "comm/comm.h"
#include "data/jsonl.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/cp.h"
#include "parallel/dp.h"
#include "parallel/planner.h"
#include "train/config.h"

// A per-token objective over the main head's targets in place of its cross-entropy (the MTP heads
// keep theirs): the rl layer's policy losses. Each micro-batch's weights dL/dlogp_t and dL/dH_t are
// asked for between its forward and its backward, so they come from the log-probs of the same
// pass; denominators are the objective's own business (global counts, DESIGN.md section 3).
typedef struct weft_token_rows {
    int n;
    const int *doc;       // (n) the pass's document whose token the row predicts; -1: no target
    const int *token;     // (n) that token's index in its document
    const float *logprob; // (n) log p(token | tokens before it) under the current parameters
    const float *entropy; // (n) the entropy of the row's whole distribution; NULL unless asked
} weft_token_rows;

typedef struct weft_token_objective {
    void *ctx;
    bool entropy;        // weights() reads entropy and writes d_entropy
    bool whole_logprobs; // begin() needs every target's current log-prob: a scoring pass first
    // Every rank, before a pass's first micro-batch: its documents and, with whole_logprobs,
    // their current log-probs (document i's token t at the sum of the earlier lengths + t).
    void (*begin)(void *ctx, const weft_document *docs, int n_docs, const float *logprobs);
    // Host arrays (rows->n): the rows' weights, 0 on rows without a target.
    void (*weights)(void *ctx, const weft_token_rows *rows, float *d_logprob, float *d_entropy);
    // Every rank, after the pass: the objective over the whole batch (it may all-reduce).
    double (*end)(void *ctx, weft_comm *world);
} weft_token_objective;

typedef struct weft_trainer {
    weft_model *model;
    weft_comm *world;
    weft_dp *dp;
    weft_cp *cp;         // context-parallel groups (size 1: documents stay whole)
    weft_optimizer *opt; // NULL for gradient-only use
    weft_optim_segment *segs;
    int n_segs;
    weft_job_config cfg;
    weft_plan_layout layout;
    weft_batch batch;    // reused packing buffer
    double *head_sums;   // (2 * heads + 1) f64 on the device: the step's loss and correct sums
                         // per head, then this rank's share of the squared gradient norm
    // The last pass's micro-batches on this rank (degrees and documents), and the busy seconds of
    // each (wall time minus time inside CP collectives), for load-balance reports.
    weft_local_plan last;
    double *micro_busy;
    const weft_token_objective *objective; // NULL: cross-entropy (or the rows' logprob_weights)
    bool asleep; // weft_trainer_sleep: optimizer state in host memory, no gradient buffers
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
    long host_waits;          // times the host waited for the device during the step
} weft_step_result;

// Host arrays a pass fills, rows in batch order (T_total = the batch's tokens), each optional.
typedef struct weft_trainer_outputs {
    float *logits;   // (T_total, V): one process only
    float *logprobs; // (T_total): at every target token t, log p(token t | tokens before it);
                     // 0 elsewhere; gathered from every rank
    float *entropy;  // (T_total): at the same places, the entropy of the distribution that
                     // predicts token t
} weft_trainer_outputs;

// The model a trainer of this job needs, on `be`: buffers padded for the layout's sharding,
// recomputation as train.recompute says; forward_only: no gradient buffer (a model that is only
// scored: the RL reference policy, weft grad --score).
weft_model *weft_trainer_build_model(weft_backend *be, const weft_comm *world,
                                     const weft_model_config *mc, const weft_job_config *cfg,
                                     bool forward_only);
weft_trainer *weft_trainer_create(weft_model *m, weft_comm *world, const weft_job_config *cfg,
                                  bool with_optimizer);
void weft_trainer_free(weft_trainer *t);
// The longest document the job's layout trains whole; *why receives the settings that make it.
int weft_trainer_max_document_len(const weft_job_config *cfg, int world, char *why,
                                  size_t why_size);

// Zeroes the gradients, then leaves in them the gradient of the global batch's objective, summed
// over all ranks: the token-mean cross-entropy (plus the MTP losses), or, when the documents carry
// logprob_weights, sum over targets t of w_t log p(token t | tokens before it) (plus the MTP
// losses). `out` may be NULL.
weft_step_result weft_trainer_gradients(weft_trainer *t, const weft_document *docs, int n_docs,
                                        const weft_trainer_outputs *out);
// The forward alone, in the same layout: losses, and the outputs asked for; no gradient.
weft_step_result weft_trainer_score(weft_trainer *t, const weft_document *docs, int n_docs,
                                    const weft_trainer_outputs *out);
// Gradient passes from now on minimize `objective` (NULL: the cross-entropy again); their
// weft_step_result.loss is its value.
void weft_trainer_set_objective(weft_trainer *t, const weft_token_objective *objective);
// Makes the planner's row limit `rows` per rank (weft calibrate sizes one micro-batch per group).
void weft_trainer_set_row_limit(weft_trainer *t, int rows);
// Gradients, clipping and one AdamW step.
weft_step_result weft_trainer_step(weft_trainer *t, const weft_document *docs, int n_docs);
// Makes every rank's gradient buffer hold the full summed gradient (for output).
void weft_trainer_gather_gradients(weft_trainer *t);
weft_memory_report weft_trainer_memory(const weft_trainer *t);
// The hybrid RL loop's rollout phase (rl.offload_training_state): the optimizer state moves to
// host memory, the gradient buffers and the activation memory a training pass sized are freed, so
// the KV pool can have their device memory. Scoring still runs (with activation memory of its own
// size); gradients and steps wait for weft_trainer_wake,
// which brings the state back bit for bit and the gradients zeroed.
void weft_trainer_sleep(weft_trainer *t);
void weft_trainer_wake(weft_trainer *t);
