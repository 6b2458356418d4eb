// Per-op GPU time (profile.h). Events are resolved in batches, when the ring fills and at the end,
// so profiling adds two event records per op and no synchronization in between.
#include "backend/cuda/profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

enum { RING = 4096, MAX_OPS = 64 };

typedef struct op_total {
    const char *name;
    double own_ms, idle_ms;
    long calls;
} op_total;

// Op i (1..pending) ran from starts[i] to ends[i]; ends[0] is where the op before it ended.
struct weft_cuda_profile {
    cudaStream_t stream;
    weft_cuda_watch *watch; // the waits for pending ops' ends
    cudaEvent_t starts[RING + 1], ends[RING + 1];
    const char *names[RING + 1];
    int pending;
    bool started; // the op being queued has its start recorded
    op_total ops[MAX_OPS];
    int n_ops;
    double span_ms; // from the first mark to the last op's end: every op's own and idle time
    // WEFT_CUDA_PROFILE=<file>.json (else NULL), written to json_tmp and renamed when whole, so
    // a job that fails leaves no file.
    char *json, *json_tmp;
};

static FILE *open_json(const weft_cuda_profile *p) {
    FILE *f = fopen(p->json_tmp, "w");
    WEFT_CHECK(f, "WEFT_CUDA_PROFILE=%s: cannot write %s", p->json, p->json_tmp);
    return f;
}

weft_cuda_profile *weft_cuda_profile_create(cudaStream_t stream, weft_cuda_watch *watch) {
    const char *on = getenv("WEFT_CUDA_PROFILE");
    if (!on || !*on || !strcmp(on, "0")) return NULL;
    size_t n = strlen(on);
    bool to_json = n > 5 && !strcmp(on + n - 5, ".json");
    WEFT_CHECK(to_json || !strcmp(on, "1"),
               "WEFT_CUDA_PROFILE=%s: expected 1 (a table on stderr) or a file name ending in "
               ".json (the table, and the same as JSON in that file)", on);
    weft_cuda_profile *p = weft_alloc(sizeof *p);
    if (to_json) { // tried now, so a path that cannot be written fails the job before it runs
        p->json = weft_strdup(on);
        p->json_tmp = weft_alloc(n + 5);
        snprintf(p->json_tmp, n + 5, "%s.tmp", on);
        fclose(open_json(p));
        remove(p->json_tmp);
    }
    p->stream = stream;
    p->watch = watch;
    for (int i = 0; i <= RING; i++)
        WEFT_CHECK(cudaEventCreate(&p->starts[i]) == cudaSuccess &&
                       cudaEventCreate(&p->ends[i]) == cudaSuccess,
                   "cuda profile: no events");
    cudaEventRecord(p->ends[0], stream);
    return p;
}

static op_total *total_of(weft_cuda_profile *p, const char *name) {
    for (int i = 0; i < p->n_ops; i++)
        if (p->ops[i].name == name || !strcmp(p->ops[i].name, name)) return &p->ops[i];
    WEFT_CHECK(p->n_ops < MAX_OPS, "cuda profile: more than %d op names", MAX_OPS);
    p->ops[p->n_ops] = (op_total){.name = name};
    return &p->ops[p->n_ops++];
}

static double elapsed_ms(cudaEvent_t from, cudaEvent_t to) {
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, from, to);
    return ms > 0.0f ? ms : 0.0;
}

// Waits for the pending ops, adds their times, and makes the last end the next mark.
static void resolve(weft_cuda_profile *p) {
    if (p->pending == 0) return;
    weft_cuda_watch_event(p->watch, p->ends[p->pending], "the profile's timing of ops");
    p->span_ms += elapsed_ms(p->ends[0], p->ends[p->pending]);
    for (int i = 1; i <= p->pending; i++) {
        op_total *t = total_of(p, p->names[i]);
        t->idle_ms += elapsed_ms(p->ends[i - 1], p->starts[i]);
        t->own_ms += elapsed_ms(p->starts[i], p->ends[i]);
        t->calls++;
    }
    cudaEvent_t last = p->ends[p->pending];
    p->ends[p->pending] = p->ends[0];
    p->ends[0] = last;
    p->pending = 0;
}

void weft_cuda_profile_start(weft_cuda_profile *p) {
    if (!p || p->started) return;
    if (p->pending == RING) resolve(p);
    cudaEventRecord(p->starts[p->pending + 1], p->stream);
    p->started = true;
}

void weft_cuda_profile_op(weft_cuda_profile *p, const char *name) {
    if (!p) return;
    weft_cuda_profile_start(p); // an op that never asked for its stream: no idle time apart
    p->pending++;
    p->names[p->pending] = name;
    cudaEventRecord(p->ends[p->pending], p->stream);
    p->started = false;
}

static int by_time(const void *a, const void *b) {
    double x = ((const op_total *)a)->own_ms, y = ((const op_total *)b)->own_ms;
    return (x < y) - (x > y);
}

static void print_table(const weft_cuda_profile *p, double own, double idle, long host_waits) {
    fprintf(stderr, "cuda profile: GPU time per op (own: from its start to its end on the GPU; "
                    "idle: the GPU waiting before it, for the host or a download)\n");
    fprintf(stderr, "  %-28s %8s %11s %10s %6s %11s\n", "op", "calls", "own ms", "us/call",
            "share", "idle ms");
    for (int i = 0; i < p->n_ops; i++) {
        const op_total *t = &p->ops[i];
        fprintf(stderr, "  %-28s %8ld %11.2f %10.1f %5.1f%% %11.2f\n", t->name, t->calls,
                t->own_ms, 1e3 * t->own_ms / (double)t->calls,
                own > 0 ? 100.0 * t->own_ms / own : 0.0, t->idle_ms);
    }
    fprintf(stderr, "  %-28s %8s %11.2f %10s %6s %11.2f\n", "all", "", own, "", "", idle);
    fprintf(stderr, "cuda profile: the host waited for the GPU %ld times (downloads, "
                    "synchronizations, frees)\n", host_waits);
}

static void write_json(const weft_cuda_profile *p, double own, double idle, long host_waits) {
    FILE *f = open_json(p);
    fprintf(f, "{\"span_ms\": %.6f, \"own_ms\": %.6f, \"idle_ms\": %.6f, \"host_waits\": %ld, "
            "\"ops\": [", p->span_ms, own, idle, host_waits);
    for (int i = 0; i < p->n_ops; i++) {
        const op_total *t = &p->ops[i];
        fprintf(f, "%s\n  {\"op\": \"%s\", \"calls\": %ld, \"own_ms\": %.6f, \"idle_ms\": %.6f}",
                i ? "," : "", t->name, t->calls, t->own_ms, t->idle_ms);
    }
    fprintf(f, "\n]}\n");
    WEFT_CHECK(fclose(f) == 0 && rename(p->json_tmp, p->json) == 0,
               "WEFT_CUDA_PROFILE=%s: writing the profile failed", p->json);
}

void weft_cuda_profile_finish(weft_cuda_profile *p, long host_waits) {
    if (!p) return;
    resolve(p);
    double own = 0.0, idle = 0.0;
    for (int i = 0; i < p->n_ops; i++) own += p->ops[i].own_ms, idle += p->ops[i].idle_ms;
    qsort(p->ops, (size_t)p->n_ops, sizeof p->ops[0], by_time);
    print_table(p, own, idle, host_waits);
    if (p->json) write_json(p, own, idle, host_waits);
    for (int i = 0; i <= RING; i++) cudaEventDestroy(p->starts[i]), cudaEventDestroy(p->ends[i]);
    weft_free(p->json), weft_free(p->json_tmp);
    weft_free(p);
}
