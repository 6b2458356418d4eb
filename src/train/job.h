// train: the pieces every verb builds a job from: the tokenizer, the documents, the backend and
// the model, each from the job's settings.
#pragma once
#include "backend/backend.h"
#include "comm/comm.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/config.h"

// The job's tokenizer: data.tokenizer (a tokenizer.json, or "bytes"), else the model
// directory's tokenizer.json, else byte-level for a model built from scratch. NULL for a model
// directory without tokenizer.json: then only pre-tokenized data can be read.
weft_tokenizer *weft_job_tokenizer(const weft_job_config *cfg);
// Whether the job tokenizes UTF-8 bytes (data.tokenizer=bytes, or a model from scratch without
// data.tokenizer): its checkpoints then write the byte-level tokenizer's files.
bool weft_job_tokenizer_is_bytes(const weft_job_config *cfg);
// The vocabulary the job's token ids must lie in: the model directory's vocab_size, else the
// tokenizer's (which a model from scratch is built with).
int weft_job_vocab_size(const weft_job_config *cfg, const weft_tokenizer *tok);
// The job's documents (data.source tokenized by data.tokenizer, checked or cut against the
// longest document `world` ranks can train); *tok receives the tokenizer.
weft_document_set *weft_job_load_data(const weft_job_config *cfg, int world,
                                      weft_tokenizer **tok);
// Documents are visited in a fresh permutation each epoch, a pure function of (seed, epoch), so a
// resumed run needs only (epoch, cursor) to continue the same order.
typedef struct weft_data_order {
    int n;
    int *perm;     // (n) this epoch's order
    uint64_t seed;
    int epoch;     // data epoch
    long cursor;   // next document of the epoch's permutation
} weft_data_order;
void weft_data_order_start(weft_data_order *o, int n, uint64_t seed, int epoch, long cursor);
// The next batch's item indices (out: batch_size of them), all from one epoch's permutation, so a
// batch never holds an item twice: an epoch's last batch_size-1 items at most are left out (the
// next epoch's shuffle gives them their turn). A batch larger than the data is an error.
void weft_data_order_take(weft_data_order *o, int batch_size, int *out);
// The next global batch: batch_size documents, as weft_data_order_take orders them.
void weft_data_order_next(weft_data_order *o, const weft_document_set *set, weft_document *out,
                          int batch_size);
void weft_data_order_free(weft_data_order *o);
// The train.global_batch_size documents of the job's first step, in training's order.
void weft_job_first_batch(const weft_job_config *cfg, const weft_document_set *data,
                          weft_document *out);
// The backend of the job's `device`, one GPU per rank of a node, with `world`'s collectives able
// to move its buffers.
weft_backend *weft_job_backend(const weft_job_config *cfg, weft_comm *world);
// The job's model: from model.path's config.json, or from the model.* settings with the
// tokenizer's `vocab` entries.
void weft_job_model_config(const weft_job_config *cfg, int vocab, weft_model_config *mc);
// Builds it on `be` for the job's layout: model.path's weights, or a random start; without a
// gradient buffer when forward_only (weft_trainer_build_model).
weft_model *weft_job_build_model(weft_backend *be, const weft_comm *world,
                                 const weft_job_config *cfg, int vocab, bool forward_only);
