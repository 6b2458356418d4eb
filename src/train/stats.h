// train: a run's statistics as JSON, written with --stats FILE by every verb: the numbers tests
// and tools read instead of the printed lines (losses, counts, collectives, memory, times).
#pragma once
#include <jansson.h>

#include "comm/comm.h"
#include "train/step.h"

// {"loss", "accuracy", "mtp_loss": [...], "mtp_accuracy": [...], "grad_norm", "targets",
//  "tokens", "seconds", "sync_wait_seconds", "cp_comm_seconds", "host_waits"} of a pass.
json_t *weft_stats_of_result(const weft_step_result *r);
// {"parameters", "gradients", "optimizer_state", "peak_activations", "peak_activations_max_rank"}
// in bytes: this rank's, and the largest peak of any rank. Collective over the world (every rank
// enters; the result is the same everywhere).
json_t *weft_stats_of_memory(const weft_memory_report *mine, weft_comm *world);
// {"ranks", "allreduce", "reduce_scatter", "allgather", "broadcast", "barrier", "bytes"}: the
// collectives this rank has issued on the world group (stats taken before the caller's own
// reporting collectives).
json_t *weft_stats_of_collectives(const weft_comm_stats *s, int ranks);
// Writes root to path atomically and releases it (path NULL: only releases).
void weft_stats_save(json_t *root, const char *path);
// The memory line people read: "memory: parameters 1.2 MiB, ...".
void weft_print_memory_report(const weft_memory_report *r);
