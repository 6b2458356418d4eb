// train: the step loop of `weft train`.
#pragma once
#include "comm/comm.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"
#include "backend/backend.h"
#include "model/model.h"
#include "train/config.h"

// The job's tokenizer: data.tokenizer, or byte-level.
weft_tokenizer *weft_train_tokenizer(const weft_job_config *cfg);
// The job's documents (data.source tokenized by data.tokenizer, checked or cut against the
// longest document `world` ranks can train); *tok receives the tokenizer.
weft_document_set *weft_train_load_data(const weft_job_config *cfg, int world,
                                        weft_tokenizer **tok);
// The train.global_batch_size documents of the job's first step, in training's order.
void weft_train_first_batch(const weft_job_config *cfg, const weft_document_set *data,
                            weft_document *out);

// The backend of the job's `device`, one GPU per rank of a node, with `world`'s collectives able
// to move its buffers.
weft_backend *weft_train_backend(const weft_job_config *cfg, weft_comm *world);
// The job's model: from model.path's config.json, or from the model.* settings with the
// tokenizer's `vocab` entries.
void weft_train_model_config(const weft_job_config *cfg, int vocab, weft_model_config *mc);
// Builds it on `be` with the layout's padding: the checkpoint's weights or a random start.
weft_model *weft_train_build_model(weft_backend *be, const weft_comm *world,
                                   const weft_job_config *cfg, int vocab);

// Runs the job to cfg->train.steps: data, model, optimizer, progress, metrics, checkpoints.
// Returns 0 on success.
// Under data parallelism every rank runs it; rank 0 prints and writes.
int weft_train_run(const weft_job_config *cfg, weft_comm *world);
