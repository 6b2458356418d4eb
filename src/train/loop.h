// train: the step loop of `weft train`.
#pragma once
#include "train/config.h"

// Runs the job to cfg->train.steps: data, model, optimizer, progress, metrics, checkpoints.
// Returns 0 on success.
int weft_train_run(const weft_job_config *cfg);
