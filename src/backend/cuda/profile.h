// Optional per-op GPU time for the CUDA backend, on with WEFT_CUDA_PROFILE=1: an event after every
// op on the stream, the time between consecutive events summed per op name, a table on stderr
// when the backend is destroyed. Idle time before an op (the host not keeping up, or waiting on a
// download) counts against that op, so a launch-bound run shows where.
#pragma once
#include <cuda_runtime_api.h>

typedef struct weft_cuda_profile weft_cuda_profile;

// NULL (and every call below a no-op) unless WEFT_CUDA_PROFILE=1.
weft_cuda_profile *weft_cuda_profile_create(cudaStream_t stream);
// Marks the end of the op just queued; `name` must outlive the profile (a string literal).
void weft_cuda_profile_op(weft_cuda_profile *p, const char *name);
// Prints the table, with how often the host waited for the GPU, and frees the profile.
void weft_cuda_profile_finish(weft_cuda_profile *p, long host_waits);
