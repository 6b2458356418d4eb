#include "parallel/cp.h"

#include <stdio.h>

enum { MAX_GROUPS = 31 }; // dynamic CP: one per power of two up to the world

struct weft_cp {
    weft_comm *world;
    bool dynamic;
    int n_groups;
    int group_size[MAX_GROUPS];      // this rank's aligned groups, built once: their sizes
    weft_comm *groups[MAX_GROUPS];   // and communicators
    weft_comm *group;  // the selected degree's (NULL at degree 1)
    int size, rank;    // selected degree, and this rank's place in its group
    weft_backend *be;
    const weft_batch *batch;  // the micro-batch the provider serves
    weft_kv_provider provider;
    double comm_seconds;
};

int weft_cp_size(const weft_cp *cp) { return cp->size; }
int weft_cp_rank(const weft_cp *cp) { return cp->rank; }
int weft_cp_dp_size(const weft_cp *cp) { return weft_comm_size(cp->world) / cp->size; }

void weft_cp_select(weft_cp *cp, int degree) {
    cp->group = NULL;
    for (int i = 0; i < cp->n_groups; i++)
        if (cp->group_size[i] == degree) cp->group = cp->groups[i];
    WEFT_CHECK(degree == 1 || cp->group, "internal: no context-parallel group of %d ranks was built",
               degree);
    cp->size = degree;
    cp->rank = cp->group ? weft_comm_rank(cp->group) : 0;
}

const weft_kv_provider *weft_cp_kv_provider(weft_cp *cp, weft_backend *be,
                                            const weft_batch *batch) {
    cp->be = be;
    cp->batch = batch;
    return cp->size > 1 ? &cp->provider : NULL;
}

int weft_cp_chunks(const weft_cp *cp, int len, int start[2], int *chunk_len, int *padded_len) {
    if (cp->size == 1) {
        start[0] = 0;
        *chunk_len = *padded_len = len;
        return 1;
    }
    int parts = 2 * cp->size, s = weft_cp_rows(len, cp->size) / 2;
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

static void gather(void *ctx, int layer, const void *kv, void *kv_full, int width, void *scratch) {
    weft_cp *cp = ctx;
    size_t n = 2 * (size_t)cp->batch->T * width;
    char *own = (char *)scratch + (size_t)cp->rank * n * weft_dtype_size(cp->be->act_dtype);
    cp->be->copy(cp->be, own, kv, n * weft_dtype_size(cp->be->act_dtype));
    double t0 = weft_now_seconds();
    weft_comm_allgather(cp->group, own, scratch, n, weft_comm_type_of(cp->be->act_dtype));
    cp->comm_seconds += weft_now_seconds() - t0;
    permute(cp, scratch, kv_full, width, true);
}

static void reduce_scatter(void *ctx, int layer, const void *dkv_full, void *dkv, int width,
                           void *scratch) {
    weft_cp *cp = ctx;
    permute(cp, scratch, (void *)dkv_full, width, false);
    double t0 = weft_now_seconds();
    weft_comm_reduce_scatter_sum(cp->group, scratch, dkv, 2 * (size_t)cp->batch->T * width,
                                 weft_comm_type_of(cp->be->act_dtype));
    cp->comm_seconds += weft_now_seconds() - t0;
}

// Builds this rank's group of `size` consecutive ranks, named for errors. Collective over the
// world.
static void add_group(weft_cp *cp, int size, const weft_parallel_config *cfg) {
    int first = weft_comm_rank(cp->world) / size * size;
    char name[32];
    snprintf(name, sizeof name, "cp%d[%d-%d]", size, first, first + size - 1);
    weft_comm *g = weft_comm_split(cp->world, first, weft_comm_rank(cp->world), name);
    weft_comm_configure(g, cfg->debug_collectives, cfg->collective_timeout);
    cp->group_size[cp->n_groups] = size;
    cp->groups[cp->n_groups++] = g;
}

weft_cp *weft_cp_create(weft_comm *world, const weft_parallel_config *cfg) {
    int n = weft_comm_size(world), cp_size = cfg->context_parallel_size;
    weft_cp *cp = weft_alloc(sizeof *cp);
    cp->world = world;
    cp->dynamic = cfg->dynamic_context_parallel;
    if (cp->dynamic) {
        WEFT_CHECK((n & (n - 1)) == 0,
                   "parallel.dynamic_context_parallel needs a power-of-two number of ranks, not "
                   "%d: its groups are aligned runs of 1, 2, 4, ... ranks", n);
        WEFT_CHECK(cp_size == 1, "parallel.context_parallel_size=%d and "
                   "parallel.dynamic_context_parallel=true exclude each other; drop one", cp_size);
        // Every degree's groups, built once: each micro-batch step picks its own.
        for (int size = 2; size <= n; size *= 2) add_group(cp, size, cfg);
    } else {
        WEFT_CHECK(cp_size >= 1 && n % cp_size == 0,
                   "parallel.context_parallel_size=%d does not divide the %d rank%s of this job; "
                   "launch a multiple of it (mpirun -np) or choose a divisor",
                   cp_size, n, n == 1 ? "" : "s");
        if (cp_size > 1) add_group(cp, cp_size, cfg);
    }
    cp->provider = (weft_kv_provider){.ctx = cp, .gather = gather, .reduce_scatter = reduce_scatter};
    weft_cp_select(cp, cp->dynamic ? 1 : cp_size);
    return cp;
}

void weft_cp_free(weft_cp *cp) {
    if (!cp) return;
    for (int i = 0; i < cp->n_groups; i++) weft_comm_free(cp->groups[i]);
    weft_free(cp);
}

double weft_cp_take_comm_seconds(weft_cp *cp) {
    double s = cp->comm_seconds;
    cp->comm_seconds = 0;
    return s;
}
