// train: the step loop of `weft train`.
#pragma once
#include "comm/comm.h"
#include "train/config.h"

// Runs the job to cfg->train.steps: data, model, optimizer, progress, metrics, checkpoints.
// Returns 0 on success.
// Under data parallelism every rank runs it; rank 0 prints and writes.
int weft_train_run(const weft_job_config *cfg, weft_comm *world);
