// train: `weft grad`, the loss and full gradients of one global batch, written as safetensors. The
// tool users run to check a model or a data pipeline against another implementation, and our
// tests run against the PyTorch reference.
#pragma once
#include <jansson.h>

#include "train/config.h"
#include "train/session.h"

typedef struct weft_grad_request {
    const char *model_dir; // Hugging Face directory: config.json and model.safetensors
    const char *batch;     // JSONL read as data.source is, all of it one global batch; NULL:
                           // data.source's first global batch, as training draws it
    const char *out;       // safetensors written by rank 0
    const char *stats;     // JSON statistics (NULL: none)
    bool logits;           // also "logits" (T, V): one process only
    bool logprobs;         // also "logprobs" (T): log p(token t | tokens before it) at targets
    bool entropy;          // also "entropy" (T): at targets, of the distribution predicting them
    bool score;            // forward only: losses and the outputs asked for, no gradients
    bool busy;             // every rank's micro-batches and busy seconds (printed and in stats)
    weft_job_config cfg;   // train.steps = K > 0 also takes K AdamW steps and writes param.*
    // Batches of RL rows (documents carrying "advantages") minimize this objective, which the
    // cli takes from the rl layer; rl_report gives its statistics after the pass ("rl" in stats).
    const struct weft_token_objective *rl_objective;
    json_t *(*rl_report)(const struct weft_token_objective *objective);
} weft_grad_request;

// The settings `weft grad` starts from: the job defaults with no optimizer step and the batch cut
// by train.micro_batches (no token budget).
weft_job_config weft_grad_defaults(void);
int weft_grad_run(const weft_grad_request *r, weft_session *session);
