// Host waits for the GPU with a deadline (DESIGN.md section 4: every blocking wait has a timeout).
// cudaStreamSynchronize and cudaEventSynchronize have none, so a kernel that never ends (a bug:
// an mbarrier waited on forever, a loop that does not exit) would hang the job for good, on every
// rank. Every wait of the CUDA backend goes through here instead: it polls the work's event and,
// past the backend's wait_timeout (the job's device_timeout), ends the job naming what the host
// waited for and the op queued last.
#pragma once
#include <cuda_runtime_api.h>

#include "backend/backend.h"

typedef struct weft_cuda_watch {
    weft_backend *be;       // whose wait_timeout applies and whose host_waits count
    int rank;               // the local rank: the test fault site's (core/fault.h, GPU_WORK_DONE)
    const char *last_op;    // the op queued last (weft_cuda_launched), NULL before the first
    cudaStream_t stream;    // the backend's one stream
    cudaEvent_t queued;     // recorded on it for a wait for everything queued so far
} weft_cuda_watch;

void weft_cuda_watch_init(weft_cuda_watch *w, weft_backend *be, int rank, cudaStream_t stream);
void weft_cuda_watch_free(weft_cuda_watch *w);
// A host wait (a download, a synchronize, a free), counted in be->host_waits: returns once `done`
// has happened, or everything queued on the stream so far when `done` is NULL. `what` names the
// wait in the error ("a download"). A test can make host wait number INDEX (counted from 0, as
// host_waits counts) never see its work done: WEFT_TEST_SKIP_GPU_WORK_DONE=RANK:INDEX.
void weft_cuda_watch_host_wait(weft_cuda_watch *w, cudaEvent_t done, const char *what);
// The same deadline for a wait that is no host wait of the backend's count (a pinned upload
// slot's reuse, the profile's timing, the backend's end).
void weft_cuda_watch_event(weft_cuda_watch *w, cudaEvent_t done, const char *what);
