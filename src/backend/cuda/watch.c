// Polled waits with a deadline (watch.h).
#include "backend/cuda/watch.h"

#include <time.h>

#include "core/fault.h"

// A wait this short spins, as cudaStreamSynchronize does, so that a decode step's wait for its
// tokens (a few milliseconds at most) returns the moment they are there; a longer one (a training
// step's) then polls every 100 us, which costs it at most that much.
static const double SPIN_SECONDS = 0.02;

static void check(cudaError_t err, const char *what) {
    WEFT_CHECK(err == cudaSuccess, "cuda: %s failed: %s", what, cudaGetErrorString(err));
}

void weft_cuda_watch_init(weft_cuda_watch *w, weft_backend *be, int rank, cudaStream_t stream) {
    *w = (weft_cuda_watch){.be = be, .rank = rank, .stream = stream};
    check(cudaEventCreateWithFlags(&w->queued, cudaEventDisableTiming), "cudaEventCreate");
}

void weft_cuda_watch_free(weft_cuda_watch *w) {
    if (w->queued) cudaEventDestroy(w->queued);
    w->queued = NULL;
}

static noreturn void stuck(const weft_cuda_watch *w, const char *what, double waited) {
    weft_fatal_without_cleanup(
        "device=cuda: the GPU has not finished the work queued before %s in %.0f s "
        "(device_timeout = %g s); %s%s. Work that never ends is a bug in weft's kernels, the "
        "driver or the GPU (check nvidia-smi and report it); if the work is only that long, "
        "raise device_timeout (0: no limit)",
        what, waited, w->be->wait_timeout, w->last_op ? "the op queued last was " : "no op was "
        "queued but copies", w->last_op ? w->last_op : "");
}

// `never`: a test's stuck wait (the work is taken never to finish).
static void await(weft_cuda_watch *w, cudaEvent_t done, const char *what, bool never) {
    if (!done) {
        check(cudaEventRecord(w->queued, w->stream), "cudaEventRecord");
        done = w->queued;
    }
    double start = weft_now_seconds(), timeout = w->be->wait_timeout;
    for (;;) {
        cudaError_t q = never ? cudaErrorNotReady : cudaEventQuery(done);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) check(q, what);
        double waited = weft_now_seconds() - start;
        if (timeout > 0 && waited > timeout) stuck(w, what, waited);
        if (waited > SPIN_SECONDS) nanosleep(&(struct timespec){.tv_nsec = 100000}, NULL);
    }
}

void weft_cuda_watch_host_wait(weft_cuda_watch *w, cudaEvent_t done, const char *what) {
    await(w, done, what, weft_fault_skip("GPU_WORK_DONE", w->rank, w->be->host_waits));
    w->be->host_waits++;
}

void weft_cuda_watch_event(weft_cuda_watch *w, cudaEvent_t done, const char *what) {
    await(w, done, what, false);
}
