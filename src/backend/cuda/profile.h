// Optional per-op GPU time for the CUDA backend: WEFT_CUDA_PROFILE=1 prints a table on stderr
// when the backend is destroyed, WEFT_CUDA_PROFILE=<file>.json also writes it to that file. Each
// op gets an event where it starts (weft_cuda_profile_start, when it takes the stream) and one
// where it ends: its own time runs from one to the other, and the GPU's idle time before it (the
// host not keeping up, or waiting on a download) is counted apart, so a launch-bound run shows
// as idle time rather than as slow kernels.
#pragma once
#include <cuda_runtime_api.h>

#include "backend/cuda/watch.h"

typedef struct weft_cuda_profile weft_cuda_profile;

// NULL (and every call below a no-op) unless WEFT_CUDA_PROFILE is set (and not 0).
// Its waits for the ops' ends go through `watch`.
weft_cuda_profile *weft_cuda_profile_create(cudaStream_t stream, weft_cuda_watch *watch);
// Marks the start of the op being queued, before its first launch; later calls before its end
// are no-ops (an op of several launches starts at its first).
void weft_cuda_profile_start(weft_cuda_profile *p);
// Marks the end of the op just queued; `name` must outlive the profile (a string literal).
void weft_cuda_profile_op(weft_cuda_profile *p, const char *name);
// Prints the table, with how often the host waited for the GPU, and frees the profile.
void weft_cuda_profile_finish(weft_cuda_profile *p, long host_waits);
