// train: `weft train`, the step loop: data, model, optimizer, progress, metrics, checkpoints.
#pragma once
#include <stdio.h>

#include "train/config.h"
#include "train/session.h"

// Runs the job to cfg->train.steps; with stats_path (or NULL) it writes the run's statistics as
// JSON there (weft_stats_*). Under data parallelism every rank runs it; rank 0 prints and writes.
// Returns 0 on success.
int weft_train_run(const weft_job_config *cfg, weft_session *session, const char *stats_path);
// Opens a run's metrics.jsonl for appending, keeping the lines of steps up to `step` (a resumed
// run rewrites what came after its checkpoint); step 0 starts it afresh.
FILE *weft_metrics_open(const char *path, int step);
// Whether a run resumed at `step` has nothing left to do (step >= train.steps); then, when
// print, it says so and how to continue.
bool weft_run_is_finished(const weft_job_config *cfg, int step, bool print);
