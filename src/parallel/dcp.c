#include "parallel/dcp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

weft_cost_model weft_dcp_cost_model(const weft_parallel_config *cfg) {
    return (weft_cost_model){cfg->cost_alpha, cfg->cost_beta, cfg->cost_gamma, cfg->cost_delta,
                             cfg->cost_epsilon};
}

double weft_cost_compute(const weft_cost_model *cm, int len, int c) {
    return (cm->alpha * (double)len * len + cm->beta * len) / c + cm->gamma;
}

double weft_cost_comm(const weft_cost_model *cm, int len, int c) {
    return cm->delta * (double)(c - 1) * weft_cp_rows(len, c);
}

long weft_dcp_exchanged_rows(int len, int c) {
    return c == 1 ? 0 : (long)c * (c - 1) * weft_cp_rows(len, c);
}

static double doc_time(const weft_cost_model *cm, int len, int c) {
    return weft_cost_compute(cm, len, c) + weft_cost_comm(cm, len, c);
}

int weft_dcp_min_degree(int len, int limit) {
    int c = 1;
    while (weft_cp_rows(len, c) > limit && c < (1 << 29)) c *= 2;
    return c;
}

static void check_plannable(const int *lengths, int n, int world, int limit) {
    WEFT_CHECK(world >= 1 && (world & (world - 1)) == 0,
               "dynamic context parallelism needs a power-of-two number of ranks, not %d "
               "(its groups are aligned runs of 1, 2, 4, ... ranks)", world);
    WEFT_CHECK(limit >= 2, "parallel.max_seqlen_per_rank must be at least 2 (got %d)", limit);
    for (int i = 0; i < n; i++)
        WEFT_CHECK(weft_dcp_min_degree(lengths[i], limit) <= world,
                   "document %d has %d tokens: it needs more than the %d ranks of this job at "
                   "parallel.max_seqlen_per_rank = %d (at most %d tokens fit); raise the limit, "
                   "launch more ranks or set data.truncate=true",
                   i + 1, lengths[i], world, limit, weft_cp_max_len(limit, world));
}

// ------------------------------------------------------------------------ building a plan ----

typedef struct builder {
    weft_dcp_plan p;
    const int *lengths;
    const weft_cost_model *cm;
    int *ran;         // (world) micro-batches each rank has so far
    int *bin_of, *bin_rows, *scratch; // (n) packing scratch
} builder;

static builder builder_start(const int *lengths, int n, int world, int limit,
                             const weft_cost_model *cm) {
    int cap = n > 0 ? n : 1;
    return (builder){
        .p = {.world = world, .limit = limit,
              .micro = weft_alloc(sizeof(weft_dcp_micro) * cap),
              .offsets = weft_alloc(sizeof(int) * (cap + 1)), .docs = weft_alloc(sizeof(int) * cap)},
        .lengths = lengths, .cm = cm, .ran = weft_alloc(sizeof(int) * world),
        .bin_of = weft_alloc(sizeof(int) * cap), .bin_rows = weft_alloc(sizeof(int) * cap),
        .scratch = weft_alloc(sizeof(int) * cap)};
}

static weft_dcp_plan builder_finish(builder *b) {
    weft_free(b->ran), weft_free(b->bin_of), weft_free(b->bin_rows), weft_free(b->scratch);
    return b->p;
}

static int ascending(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

// Appends a micro-batch of k documents for ranks [first, first + c).
static void add_micro(builder *b, int first, int c, const int *docs, int k) {
    weft_dcp_plan *p = &b->p;
    weft_dcp_micro *m = &p->micro[p->n_micro];
    int at = p->offsets[p->n_micro];
    *m = (weft_dcp_micro){.first_rank = first, .degree = c, .compute = b->cm->epsilon};
    memcpy(p->docs + at, docs, sizeof(int) * k);
    qsort(p->docs + at, (size_t)k, sizeof(int), ascending);
    for (int j = 0; j < k; j++) {
        int len = b->lengths[docs[j]];
        m->rows += weft_cp_rows(len, c);
        m->compute += weft_cost_compute(b->cm, len, c);
        m->comm += weft_cost_comm(b->cm, len, c);
    }
    for (int r = first; r < first + c; r++) m->step = b->ran[r] > m->step ? b->ran[r] : m->step;
    for (int r = first; r < first + c; r++) b->ran[r] = m->step + 1;
    p->n_steps = m->step + 1 > p->n_steps ? m->step + 1 : p->n_steps;
    p->offsets[++p->n_micro] = at + k;
}

// Packs one group's documents, taken in the given order, first-fit into micro-batches of at most
// the limit's rows per rank, and appends them.
static void pack_group(builder *b, int first, int c, const int *docs, int k) {
    int n_bins = 0;
    for (int i = 0; i < k; i++) {
        int need = weft_cp_rows(b->lengths[docs[i]], c), bin = 0;
        while (bin < n_bins && b->bin_rows[bin] + need > b->p.limit) bin++;
        if (bin == n_bins) b->bin_rows[n_bins++] = 0;
        b->bin_rows[bin] += need;
        b->bin_of[i] = bin;
    }
    for (int bin = 0; bin < n_bins; bin++) {
        int m = 0;
        for (int i = 0; i < k; i++)
            if (b->bin_of[i] == bin) b->scratch[m++] = docs[i];
        add_micro(b, first, c, b->scratch, m);
    }
}

typedef struct doc_item {
    int len, index, degree;
    double time;
} doc_item;

// Largest degree first (its groups hold whole groups of every smaller degree, so ranks of a group
// are always free together), then longest time first, then by index.
static int by_degree_then_time(const void *a, const void *b) {
    const doc_item *x = a, *y = b;
    if (x->degree != y->degree) return x->degree > y->degree ? -1 : 1;
    if (x->time != y->time) return x->time > y->time ? -1 : 1;
    return x->index - y->index;
}

// The aligned group of c ranks that can start soonest (when its busiest rank is free); the lowest
// on ties. Returns its index; *start receives that time.
static int soonest_group(const double *finish, int world, int c, double *start) {
    int best = 0;
    *start = INFINITY;
    for (int g = 0; g < world / c; g++) {
        double t = 0;
        for (int r = g * c; r < (g + 1) * c; r++) t = finish[r] > t ? finish[r] : t;
        if (t < *start) *start = t, best = g;
    }
    return best;
}

// Longest-processing-time list scheduling of items (sorted by by_degree_then_time) onto aligned
// groups of their degree; group_of[i] receives item i's group.
static void schedule(const doc_item *items, int n, int world, double *finish, int *group_of) {
    for (int r = 0; r < world; r++) finish[r] = 0;
    for (int i = 0; i < n; i++) {
        double start;
        int c = items[i].degree, g = soonest_group(finish, world, c, &start);
        for (int r = g * c; r < (g + 1) * c; r++) finish[r] = start + items[i].time;
        group_of[i] = g;
    }
}

// Appends the scheduled items level by level (a degree's items are contiguous), group by group,
// each group's documents packed into micro-batches.
static void add_scheduled(builder *b, const doc_item *items, int n, const int *group_of, int *docs) {
    for (int lo = 0, hi; lo < n; lo = hi) {
        int c = items[lo].degree;
        for (hi = lo; hi < n && items[hi].degree == c; hi++) {}
        for (int g = 0; g < b->p.world / c; g++) {
            int k = 0;
            for (int i = lo; i < hi; i++)
                if (group_of[i] == g) docs[k++] = items[i].index;
            if (k > 0) pack_group(b, g * c, c, docs, k);
        }
    }
}

// ------------------------------------------------------------------------ uniform mode ----

// Assigns items (longest first) to the n_groups groups at degree c: each to the group of least
// estimated cost that still has room for its rows. Returns how many were placed; group_of[i] is
// -1 for an item left out.
static int assign(const doc_item *items, int n, int c, int n_groups, int limit,
                  const weft_cost_model *cm, int *group_of, int *rows, double *cost) {
    memset(rows, 0, sizeof(int) * n_groups);
    memset(cost, 0, sizeof(double) * n_groups);
    int placed = 0;
    for (int i = 0; i < n; i++) {
        int need = weft_cp_rows(items[i].len, c), best = -1;
        for (int g = 0; g < n_groups; g++)
            if (rows[g] + need <= limit && (best < 0 || cost[g] < cost[best])) best = g;
        group_of[i] = best;
        if (best < 0) continue;
        rows[best] += need;
        cost[best] += doc_time(cm, items[i].len, c);
        placed++;
    }
    return placed;
}

static int longest_first(const void *a, const void *b) {
    const doc_item *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->index - y->index;
}

static weft_dcp_plan plan_uniform(const int *lengths, int n, int world, int limit,
                                  const weft_cost_model *cm) {
    builder b = builder_start(lengths, n, world, limit, cm);
    int cap = n > 0 ? n : 1;
    doc_item *items = weft_alloc(sizeof(doc_item) * cap), *rest = weft_alloc(sizeof(doc_item) * cap);
    for (int i = 0; i < n; i++) items[i] = (doc_item){.len = lengths[i], .index = i};
    qsort(items, n, sizeof *items, longest_first);
    int *group_of = weft_alloc(sizeof(int) * cap), *rows = weft_alloc(sizeof(int) * world);
    int *docs = weft_alloc(sizeof(int) * cap);
    double *cost = weft_alloc(sizeof(double) * world);
    int left = n;
    while (left > 0) {
        // The longest remaining document sets the degree; the rest fill the groups around it.
        int c = weft_dcp_min_degree(items[0].len, limit);
        int placed = assign(items, left, c, world / c, limit, cm, group_of, rows, cost);
        // Fewer documents than groups would leave ranks idle: raise c until every group has one.
        // The chosen documents still fit, as doubling c halves (about) every document's rows.
        while (placed < world / c) {
            c *= 2;
            int kept = 0;
            for (int i = 0; i < left; i++)
                if (group_of[i] >= 0) rest[kept++] = items[i];
            for (int i = 0, j = kept; i < left; i++)
                if (group_of[i] < 0) rest[j++] = items[i];
            memcpy(items, rest, sizeof(doc_item) * left);
            placed = assign(items, kept, c, world / c, limit, cm, group_of, rows, cost);
            for (int i = kept; i < left; i++) group_of[i] = -1;
        }
        for (int g = 0; g < world / c; g++) { // the step: every group side by side
            int k = 0;
            for (int i = 0; i < left; i++)
                if (group_of[i] == g) docs[k++] = items[i].index;
            add_micro(&b, g * c, c, docs, k);
        }
        int k = 0;
        for (int i = 0; i < left; i++)
            if (group_of[i] < 0) rest[k++] = items[i];
        memcpy(items, rest, sizeof(doc_item) * k);
        left = k;
    }
    weft_free(items), weft_free(rest), weft_free(group_of), weft_free(rows), weft_free(docs);
    weft_free(cost);
    return builder_finish(&b);
}

// ------------------------------------------------------------------ heterogeneous mode ----

// The largest of: perfect balance of every document at its least degree (where it costs the
// fewest rank-seconds), and the one document that takes longest even at its best degree.
static double lower_bound(const int *lengths, const int *docs, int n, int world, int limit,
                          const weft_cost_model *cm) {
    double rank_seconds = 0, longest = 0;
    for (int i = 0; i < n; i++) {
        int len = lengths[docs ? docs[i] : i];
        double least = INFINITY, best = INFINITY;
        for (int c = weft_dcp_min_degree(len, limit); c <= world; c *= 2) {
            least = fmin(least, c * doc_time(cm, len, c));
            best = fmin(best, doc_time(cm, len, c));
        }
        rank_seconds += least;
        longest = fmax(longest, best);
    }
    return fmax(rank_seconds / world, longest);
}

// Documents at the degrees in items (freed here) list-scheduled largest degree first onto the
// aligned groups free soonest, each group's packed into micro-batches.
static weft_dcp_plan plan_items(doc_item *items, const int *lengths, int n, int world, int limit,
                                const weft_cost_model *cm) {
    builder b = builder_start(lengths, n, world, limit, cm);
    int cap = n > 0 ? n : 1;
    qsort(items, n, sizeof *items, by_degree_then_time);
    int *group_of = weft_alloc(sizeof(int) * cap), *docs = weft_alloc(sizeof(int) * cap);
    double *finish = weft_alloc(sizeof(double) * world);
    schedule(items, n, world, finish, group_of);
    add_scheduled(&b, items, n, group_of, docs);
    weft_free(items), weft_free(group_of), weft_free(docs), weft_free(finish);
    return builder_finish(&b);
}

static doc_item item_at(const weft_cost_model *cm, const int *lengths, int i, int c) {
    return (doc_item){.len = lengths[i], .index = i, .degree = c, .time = doc_time(cm, lengths[i], c)};
}

// Each document at the least degree that fits the limit, raised while its time exceeds
// `threshold` and raising shortens it.
static weft_dcp_plan plan_heterogeneous_at(const int *lengths, int n, int world, int limit,
                                           const weft_cost_model *cm, double threshold) {
    doc_item *items = weft_alloc(sizeof(doc_item) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) {
        int len = lengths[i], c = weft_dcp_min_degree(len, limit);
        while (c < world && doc_time(cm, len, c) > threshold &&
               doc_time(cm, len, 2 * c) < doc_time(cm, len, c))
            c *= 2;
        items[i] = item_at(cm, lengths, i, c);
    }
    return plan_items(items, lengths, n, world, limit, cm);
}

// When the plan's last rank is done, a group starting once all its ranks are free.
static double critical_path(const weft_dcp_plan *p) {
    double *finish = weft_alloc(sizeof(double) * p->world), path = 0;
    for (int m = 0; m < p->n_micro; m++) {
        const weft_dcp_micro *mb = &p->micro[m];
        int lo = mb->first_rank, hi = lo + mb->degree;
        double start = 0;
        for (int r = lo; r < hi; r++) start = fmax(start, finish[r]);
        for (int r = lo; r < hi; r++) finish[r] = start + mb->compute + mb->comm;
        path = fmax(path, start + mb->compute + mb->comm);
    }
    weft_free(finish);
    return path;
}

// Keeps the plan with the shorter critical path in *best (the earlier on ties).
static void keep_shorter(weft_dcp_plan *best, double *best_path, weft_dcp_plan p) {
    double path = critical_path(&p);
    if (path < *best_path) {
        weft_dcp_plan_free(best);
        *best = p, *best_path = path;
    } else {
        weft_dcp_plan_free(&p);
    }
}

// Raising a document's degree shortens it but costs exchange and fixed time on more ranks; the
// right threshold depends on the batch, so a few are tried, and the uniform plan too (one of the
// plans this mode allows, better on some small batches), and the shortest critical path kept
// (ties: the fewest raises).
static weft_dcp_plan plan_heterogeneous(const int *lengths, int n, int world, int limit,
                                        const weft_cost_model *cm) {
    double bound = lower_bound(lengths, NULL, n, world, limit, cm), best_path = INFINITY;
    weft_dcp_plan best = {0};
    for (double f = 1.0; f >= 1.0 / 16; f /= 2)
        keep_shorter(&best, &best_path, plan_heterogeneous_at(lengths, n, world, limit, cm, f * bound));
    keep_shorter(&best, &best_path, plan_uniform(lengths, n, world, limit, cm));
    return best;
}

weft_dcp_plan weft_dcp_plan_make(weft_dcp_mode mode, const int *lengths, int n, int world,
                                 int limit, const weft_cost_model *cm) {
    check_plannable(lengths, n, world, limit);
    return mode == WEFT_DCP_HETEROGENEOUS ? plan_heterogeneous(lengths, n, world, limit, cm)
                                          : plan_uniform(lengths, n, world, limit, cm);
}

weft_dcp_plan weft_dcp_plan_static(const int *lengths, int n, int world, int c, int limit,
                                   const weft_cost_model *cm) {
    WEFT_CHECK(c >= 1 && world % c == 0, "static CP of %d ranks does not divide %d ranks", c, world);
    for (int i = 0; i < n; i++)
        WEFT_CHECK(weft_cp_rows(lengths[i], c) <= limit,
                   "document %d has %d tokens: more than %d rows per rank at CP size %d",
                   i + 1, lengths[i], limit, c);
    doc_item *items = weft_alloc(sizeof(doc_item) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) items[i] = item_at(cm, lengths, i, c);
    return plan_items(items, lengths, n, world, limit, cm);
}

void weft_dcp_plan_free(weft_dcp_plan *p) {
    weft_free(p->micro), weft_free(p->offsets), weft_free(p->docs);
    memset(p, 0, sizeof *p);
}

// --------------------------------------------------------------------------- simulation ----

weft_dcp_estimate weft_dcp_simulate(const weft_dcp_plan *p, const int *lengths,
                                    const weft_cost_model *cm, double *rank_compute) {
    int W = p->world;
    double *busy = weft_alloc(sizeof(double) * W);
    if (rank_compute) memset(rank_compute, 0, sizeof(double) * W);
    weft_dcp_estimate e = {.critical_path = critical_path(p)};
    for (int m = 0; m < p->n_micro; m++) {
        const weft_dcp_micro *mb = &p->micro[m];
        for (int r = mb->first_rank; r < mb->first_rank + mb->degree; r++) {
            busy[r] += mb->compute + mb->comm;
            if (rank_compute) rank_compute[r] += mb->compute;
        }
        for (int k = p->offsets[m]; k < p->offsets[m + 1]; k++)
            e.exchanged_rows += weft_dcp_exchanged_rows(lengths[p->docs[k]], mb->degree);
    }
    for (int r = 0; r < W; r++) {
        e.max_busy = fmax(e.max_busy, busy[r]);
        e.mean_busy += busy[r] / W;
    }
    e.lower_bound = lower_bound(lengths, p->docs, p->offsets[p->n_micro], W, p->limit, cm);
    weft_free(busy);
    return e;
}
