// Decode steps as recorded backend graphs (backend.h capture_begin .. graph_launch). A decode
// step of a 1B model queues some 300 kernels, each a few microseconds of the host's time to
// launch and often less of the GPU's to run: at small batches the host, not the GPU, sets the
// pace. A step's uploads go first and its forward and draws are device work alone, so the work
// of a step can be recorded once and replayed as one launch by every later step of the same shape,
// as vLLM does with its CUDA graphs. A replay runs the same kernels with the same arguments as
// the step it recorded: the output is the same, bit for bit, as running it kernel by kernel.
#include "rollout/internal.h"

static bool same_shape(const step_graph *a, const step_graph *b) {
    return a->rows == b->rows && a->docs == b->docs && a->max_blocks == b->max_blocks &&
           a->allocations == b->allocations;
}

// Shapes are rounded wherever the backend records graphs, rollout.cuda_graphs or not: with it
// off, the same kernels run one by one, and the output is the same.
int weft_rollout_table_width(const weft_engine *e, int blocks) {
    if (!e->be->capture_begin) return blocks;
    int width = 1;
    while (width < blocks) width *= 2;
    return width;
}

int weft_rollout_decode_rows(const weft_engine *e, int n) {
    if (!e->be->capture_begin) return n;
    int rows = n <= 8 ? 1 : (n + 7) / 8 * 8;
    while (rows < n) rows *= 2;
    int most = e->rc.max_batch_tokens > n ? e->rc.max_batch_tokens : n;
    return rows < most ? rows : most;
}

// Keeps g, first dropping the graphs whose pointers may have died (the backend has allocated or
// freed since they were recorded: their count never comes back), then the oldest.
static void keep(weft_engine *e, step_graph g) {
    step_graphs *gs = &e->graphs;
    int live = 0;
    for (int i = 0; i < gs->n; i++) {
        if (gs->cached[i].allocations == g.allocations) gs->cached[live++] = gs->cached[i];
        else e->be->graph_free(e->be, gs->cached[i].graph);
    }
    gs->n = live;
    if (gs->n == STEP_GRAPHS) {
        e->be->graph_free(e->be, gs->cached[0].graph);
        for (int i = 1; i < gs->n; i++) gs->cached[i - 1] = gs->cached[i];
        gs->n--;
    }
    gs->cached[gs->n++] = g;
}

void weft_rollout_run_graphed(weft_engine *e, int rows, int docs, int max_blocks,
                              weft_device_work work, void *ctx) {
    weft_backend *be = e->be;
    if (!e->rc.cuda_graphs || !be->capture_begin) {
        work(e, ctx);
        return;
    }
    step_graphs *gs = &e->graphs;
    step_graph g = {.rows = rows, .docs = docs, .max_blocks = max_blocks,
                    .allocations = be->allocations};
    for (int i = 0; i < gs->n; i++)
        if (same_shape(&gs->cached[i], &g)) {
            be->graph_launch(be, gs->cached[i].graph);
            e->stats.graph_steps++;
            return;
        }
    // Recorded only on a repeat: the step before ran every kernel of this shape, so whatever
    // scratch they grow has grown, and the recording allocates nothing.
    if (same_shape(&gs->last_eager, &g) && be->capture_begin(be)) {
        work(e, ctx);
        g.graph = be->capture_end(be);
        keep(e, g);
        be->graph_launch(be, g.graph);
        e->stats.graph_captures++, e->stats.graph_steps++;
        return;
    }
    work(e, ctx);
    gs->last_eager = g;
    gs->last_eager.allocations = be->allocations; // what the kernels grew counts
}

void weft_rollout_graphs_free(weft_engine *e) {
    for (int i = 0; i < e->graphs.n; i++) e->be->graph_free(e->be, e->graphs.cached[i].graph);
    e->graphs = (step_graphs){0};
}
