// Small uploads through pinned host memory. cudaMemcpyAsync from pageable memory may wait for the
// stream before it stages the bytes (the CUDA runtime's documented latitude), which would make a
// decode step's uploads wait for the step before it to finish: the host could not queue step
// N+1 while step N runs (rollout.async_scheduling). Copied into a pinned slot first, an upload is
// queued and returns at once; a slot is reused once the copy out of it has run.
#pragma once
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>

#include "backend/cuda/watch.h"

typedef struct weft_cuda_staging weft_cuda_staging;

// Pinned memory is taken at the first upload; a slot's reuse waits through `watch`.
weft_cuda_staging *weft_cuda_staging_create(weft_cuda_watch *watch);
void weft_cuda_staging_free(weft_cuda_staging *s);
// Queues the copy of bytes at src to dst on `stream` through a pinned slot; false (nothing done)
// when they exceed a slot: the caller copies from src itself.
bool weft_cuda_staging_upload(weft_cuda_staging *s, void *dst, const void *src, size_t bytes,
                              cudaStream_t stream);
