// Pinned slots in turn, each with the event of the last copy out of it (staging.h).
#include "backend/cuda/staging.h"

#include <string.h>

#include "core/core.h"

enum { SLOTS = 8, SLOT_BYTES = 256 << 10 }; // a decode step makes three uploads of a few KB

struct weft_cuda_staging {
    char *pinned; // (SLOTS, SLOT_BYTES)
    cudaEvent_t copied[SLOTS]; // a slot's last copy out (never recorded: at once)
    int next;
    weft_cuda_watch *watch;
};

static void check(cudaError_t err, const char *what) {
    WEFT_CHECK(err == cudaSuccess, "cuda: %s failed: %s", what, cudaGetErrorString(err));
}

weft_cuda_staging *weft_cuda_staging_create(weft_cuda_watch *watch) {
    weft_cuda_staging *s = weft_alloc(sizeof *s);
    *s = (weft_cuda_staging){.watch = watch};
    return s;
}

void weft_cuda_staging_free(weft_cuda_staging *s) {
    if (!s) return;
    if (s->pinned) {
        for (int i = 0; i < SLOTS; i++) cudaEventDestroy(s->copied[i]);
        cudaFreeHost(s->pinned);
    }
    weft_free(s);
}

bool weft_cuda_staging_upload(weft_cuda_staging *s, void *dst, const void *src, size_t bytes,
                              cudaStream_t stream) {
    if (bytes > SLOT_BYTES) return false;
    if (!s->pinned) {
        check(cudaMallocHost((void **)&s->pinned, (size_t)SLOTS * SLOT_BYTES), "cudaMallocHost");
        for (int i = 0; i < SLOTS; i++)
            check(cudaEventCreateWithFlags(&s->copied[i], cudaEventDisableTiming),
                  "cudaEventCreateWithFlags");
    }
    int i = s->next;
    s->next = (i + 1) % SLOTS;
    weft_cuda_watch_event(s->watch, s->copied[i], "an upload's pinned slot"); // long done
    char *slot = s->pinned + (size_t)i * SLOT_BYTES;
    memcpy(slot, src, bytes);
    check(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    check(cudaEventRecord(s->copied[i], stream), "cudaEventRecord");
    return true;
}
