#include "parallel/cp.h"

#include <stdio.h>

enum { MAX_LOG2 = 20 };

struct weft_cp {
    weft_comm *world;
    weft_comm *groups[MAX_LOG2 + 1]; // dynamic: groups[i] is this rank's aligned group of 2^i
    weft_comm *static_group;         // static: this rank's group of context_parallel_size
    weft_comm *group;  // the selected degree's (NULL at degree 1)
    int size, rank;    // selected degree, and this rank's place in its group
    int static_size;   // parallel.context_parallel_size (dynamic: 0)
    weft_model *model;
    weft_backend *be;
    const weft_batch *batch;  // the micro-batch the exchange serves
    weft_kv_exchange exchange;
    double comm_seconds;
};

int weft_cp_size(const weft_cp *cp) { return cp->size; }
int weft_cp_rank(const weft_cp *cp) { return cp->rank; }
bool weft_cp_is_dynamic(const weft_cp *cp) { return cp->static_size == 0; }
int weft_cp_dp_rank(const weft_cp *cp) { return weft_comm_rank(cp->world) / cp->size; }
int weft_cp_dp_size(const weft_cp *cp) { return weft_comm_size(cp->world) / cp->size; }

static int log2_of(int c) {
    int i = 0;
    while ((1 << i) < c) i++;
    return i;
}

void weft_cp_select(weft_cp *cp, int degree) {
    int i = log2_of(degree);
    bool dynamic_ok = !cp->static_size && (1 << i) == degree && (degree == 1 || cp->groups[i]);
    WEFT_CHECK(dynamic_ok || degree == cp->static_size,
               "internal: no context-parallel group of %d ranks was built", degree);
    cp->size = degree;
    cp->group = cp->static_size ? cp->static_group : cp->groups[i];
    cp->rank = cp->group ? weft_comm_rank(cp->group) : 0;
    if (cp->model) cp->model->kv_exchange = degree > 1 ? &cp->exchange : NULL;
}

int weft_cp_chunks(const weft_cp *cp, int len, int start[2], int *chunk_len, int *padded_len) {
    if (cp->size == 1) {
        start[0] = 0;
        *chunk_len = *padded_len = len;
        return 1;
    }
    int parts = 2 * cp->size, s = (len + parts - 1) / parts;
    if (s == 0) s = 1; // an empty document still gives every rank a row, so layouts agree
    start[0] = cp->rank * s;
    start[1] = (parts - 1 - cp->rank) * s;
    *chunk_len = s;
    *padded_len = parts * s;
    return 2;
}

// The exchange's scratch holds every rank's block, rank-major: block q = (2, T, w), keys then
// values of rank q's rows, each document's rows at the same offsets in every block (chunk q, then
// chunk 2c-1-q). The whole-document tensors are (2, T_kv, w) in document order. `to_full` copies
// from the blocks to the document order, else the other way.
static void permute(weft_cp *cp, void *blocks, void *full, int width, bool to_full) {
    const weft_batch *b = cp->batch;
    size_t row = weft_dtype_size(cp->be->act_dtype) * (size_t)width;
    size_t block_half = (size_t)b->T * row, full_half = (size_t)b->T_kv * row;
    int parts = 2 * cp->size;
    for (int q = 0; q < cp->size; q++)
        for (int d = 0; d < b->n_docs; d++) {
            int s = (b->cu_seqlens[d + 1] - b->cu_seqlens[d]) / 2;
            for (int j = 0; j < 2; j++) {
                int chunk = j == 0 ? q : parts - 1 - q;
                size_t local = (size_t)b->cu_seqlens[d] + (size_t)j * s;
                size_t whole = (size_t)b->cu_seqlens_kv[d] + (size_t)chunk * s;
                for (int kv = 0; kv < 2; kv++) { // keys, then values
                    char *x = (char *)blocks + q * 2 * block_half + kv * block_half + local * row;
                    char *y = (char *)full + kv * full_half + whole * row;
                    cp->be->copy(cp->be, to_full ? y : x, to_full ? x : y, s * row);
                }
            }
        }
}

static void gather(void *ctx, const void *kv, void *kv_full, int width, void *scratch) {
    weft_cp *cp = ctx;
    size_t n = 2 * (size_t)cp->batch->T * width;
    char *own = (char *)scratch + (size_t)cp->rank * n * weft_dtype_size(cp->be->act_dtype);
    cp->be->copy(cp->be, own, kv, n * weft_dtype_size(cp->be->act_dtype));
    double t0 = weft_now_seconds();
    weft_comm_allgather(cp->group, own, scratch, n, WEFT_COMM_F32);
    cp->comm_seconds += weft_now_seconds() - t0;
    permute(cp, scratch, kv_full, width, true);
}

static void reduce_scatter(void *ctx, const void *dkv_full, void *dkv, int width, void *scratch) {
    weft_cp *cp = ctx;
    permute(cp, scratch, (void *)dkv_full, width, false);
    double t0 = weft_now_seconds();
    weft_comm_reduce_scatter_sum(cp->group, scratch, dkv, 2 * (size_t)cp->batch->T * width,
                                 WEFT_COMM_F32);
    cp->comm_seconds += weft_now_seconds() - t0;
}

// This rank's group of `size` consecutive ranks, named for errors. Collective over the world.
static weft_comm *split_group(weft_comm *world, int size, const weft_parallel_config *cfg) {
    int first = weft_comm_rank(world) / size * size;
    char name[32];
    snprintf(name, sizeof name, "cp%d[%d-%d]", size, first, first + size - 1);
    weft_comm *g = weft_comm_split(world, first, weft_comm_rank(world), name);
    weft_comm_configure(g, cfg->debug_collectives, cfg->collective_timeout);
    return g;
}

weft_cp *weft_cp_create(weft_comm *world, const weft_parallel_config *cfg) {
    int n = weft_comm_size(world), cp_size = cfg->context_parallel_size;
    weft_cp *cp = weft_alloc(sizeof *cp);
    cp->world = world;
    if (cfg->dynamic_context_parallel) {
        WEFT_CHECK(n <= (1 << MAX_LOG2) && (n & (n - 1)) == 0,
                   "parallel.dynamic_context_parallel needs a power-of-two number of ranks, not "
                   "%d: its groups are aligned runs of 1, 2, 4, ... ranks", n);
        WEFT_CHECK(cp_size == 1, "parallel.context_parallel_size=%d and "
                   "parallel.dynamic_context_parallel=true exclude each other; drop one", cp_size);
        // Every degree's groups, built once: each micro-batch step picks its own.
        for (int i = 1; (1 << i) <= n; i++) cp->groups[i] = split_group(world, 1 << i, cfg);
    } else {
        WEFT_CHECK(cp_size >= 1 && n % cp_size == 0,
                   "parallel.context_parallel_size=%d does not divide the %d rank%s of this job; "
                   "launch a multiple of it (mpirun -np) or choose a divisor",
                   cp_size, n, n == 1 ? "" : "s");
        cp->static_size = cp_size;
        if (cp_size > 1) cp->static_group = split_group(world, cp_size, cfg);
    }
    cp->exchange = (weft_kv_exchange){.ctx = cp, .gather = gather, .reduce_scatter = reduce_scatter};
    weft_cp_select(cp, cp->static_size ? cp->static_size : 1);
    return cp;
}

void weft_cp_free(weft_cp *cp) {
    if (!cp) return;
    if (cp->model) cp->model->kv_exchange = NULL;
    for (int i = 0; i <= MAX_LOG2; i++) weft_comm_free(cp->groups[i]);
    weft_comm_free(cp->static_group);
    weft_free(cp);
}

void weft_cp_attach(weft_cp *cp, weft_model *m, const weft_batch *batch) {
    WEFT_CHECK(m->be->act_dtype == WEFT_F32,
               "context parallelism exchanges fp32 activations only on this backend");
    cp->model = m;
    cp->be = m->be;
    cp->batch = batch;
    weft_cp_select(cp, cp->size);
}

double weft_cp_take_comm_seconds(weft_cp *cp) {
    double s = cp->comm_seconds;
    cp->comm_seconds = 0;
    return s;
}
