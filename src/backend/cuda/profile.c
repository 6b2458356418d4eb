// Per-op GPU time (profile.h). Events are resolved in batches, when the ring fills and at the end,
// so profiling adds one event record per op and no synchronization in between.
#include "backend/cuda/profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

enum { RING = 4096, MAX_OPS = 64 };

typedef struct op_total {
    const char *name;
    double ms;
    long calls;
} op_total;

struct weft_cuda_profile {
    cudaStream_t stream;
    cudaEvent_t events[RING + 1]; // events[0] marks where the first pending op started
    const char *names[RING + 1];
    int pending;
    op_total ops[MAX_OPS];
    int n_ops;
};

weft_cuda_profile *weft_cuda_profile_create(cudaStream_t stream) {
    const char *on = getenv("WEFT_CUDA_PROFILE");
    if (!on || strcmp(on, "1") != 0) return NULL;
    weft_cuda_profile *p = weft_alloc(sizeof *p);
    p->stream = stream;
    for (int i = 0; i <= RING; i++)
        WEFT_CHECK(cudaEventCreate(&p->events[i]) == cudaSuccess, "cuda profile: no events");
    cudaEventRecord(p->events[0], stream);
    return p;
}

static op_total *total_of(weft_cuda_profile *p, const char *name) {
    for (int i = 0; i < p->n_ops; i++)
        if (p->ops[i].name == name || !strcmp(p->ops[i].name, name)) return &p->ops[i];
    WEFT_CHECK(p->n_ops < MAX_OPS, "cuda profile: more than %d op names", MAX_OPS);
    p->ops[p->n_ops] = (op_total){.name = name};
    return &p->ops[p->n_ops++];
}

// Waits for the pending ops, adds their times, and makes the last event the next mark.
static void resolve(weft_cuda_profile *p) {
    if (p->pending == 0) return;
    cudaEventSynchronize(p->events[p->pending]);
    for (int i = 1; i <= p->pending; i++) {
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, p->events[i - 1], p->events[i]);
        op_total *t = total_of(p, p->names[i]);
        t->ms += ms;
        t->calls++;
    }
    cudaEvent_t last = p->events[p->pending];
    p->events[p->pending] = p->events[0];
    p->events[0] = last;
    p->pending = 0;
}

void weft_cuda_profile_op(weft_cuda_profile *p, const char *name) {
    if (!p) return;
    if (p->pending == RING) resolve(p);
    p->pending++;
    p->names[p->pending] = name;
    cudaEventRecord(p->events[p->pending], p->stream);
}

static int by_time(const void *a, const void *b) {
    double x = ((const op_total *)a)->ms, y = ((const op_total *)b)->ms;
    return (x < y) - (x > y);
}

void weft_cuda_profile_finish(weft_cuda_profile *p, long host_waits) {
    if (!p) return;
    resolve(p);
    double total = 0.0;
    for (int i = 0; i < p->n_ops; i++) total += p->ops[i].ms;
    qsort(p->ops, (size_t)p->n_ops, sizeof p->ops[0], by_time);
    fprintf(stderr, "cuda profile: GPU time per op (idle time before an op counts against it)\n");
    fprintf(stderr, "  %-28s %8s %11s %10s %6s\n", "op", "calls", "total ms", "us/call", "share");
    for (int i = 0; i < p->n_ops; i++) {
        const op_total *t = &p->ops[i];
        fprintf(stderr, "  %-28s %8ld %11.2f %10.1f %5.1f%%\n", t->name, t->calls, t->ms,
                1e3 * t->ms / (double)t->calls, total > 0 ? 100.0 * t->ms / total : 0.0);
    }
    fprintf(stderr, "  %-28s %8s %11.2f\n", "all", "", total);
    fprintf(stderr, "cuda profile: the host waited for the GPU %ld times (downloads, "
                    "synchronizations, frees)\n", host_waits);
    for (int i = 0; i <= RING; i++) cudaEventDestroy(p->events[i]);
    weft_free(p);
}
