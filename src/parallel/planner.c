#include "parallel/planner.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------------------------ the costs ----

weft_cost_model weft_cost_model_of(const weft_parallel_config *cfg) {
    return (weft_cost_model){cfg->cost_alpha, cfg->cost_beta, cfg->cost_gamma, cfg->cost_delta,
                             cfg->cost_epsilon};
}

int weft_cp_rows(int len, int c) {
    if (c == 1) return len;
    int s = (len + 2 * c - 1) / (2 * c);
    return 2 * (s > 0 ? s : 1); // an empty document still gives every rank a row
}

int weft_cp_max_len(int rows, int c) { return c == 1 ? rows : c * (rows / 2) * 2; }

double weft_cost_compute(const weft_cost_model *cm, int len, int c) {
    return (cm->alpha * (double)len * len + cm->beta * len) / c + cm->gamma;
}

double weft_cost_comm(const weft_cost_model *cm, int len, int c) {
    return cm->delta * (double)(c - 1) * weft_cp_rows(len, c);
}

long weft_plan_exchanged_rows(int len, int c) {
    return c == 1 ? 0 : (long)c * (c - 1) * weft_cp_rows(len, c);
}

static double doc_time(const weft_cost_model *cm, int len, int c) {
    return weft_cost_compute(cm, len, c) + weft_cost_comm(cm, len, c);
}

int weft_plan_min_degree(int len, int limit) {
    int c = 1;
    while (weft_cp_rows(len, c) > limit && c < (1 << 29)) c *= 2;
    return c;
}

// ----------------------------------------------------------------------------- the layout ----

weft_plan_layout weft_plan_layout_of(const weft_parallel_config *pc, int world,
                                     int max_tokens_per_microbatch, int micro_batches) {
    weft_plan_layout l = {.world = world, .cost = weft_cost_model_of(pc), .mode = pc->dcp_mode};
    if (pc->dynamic_context_parallel) {
        l.dynamic = true;
        l.limit = pc->max_seqlen_per_rank;
        snprintf(l.why, sizeof l.why, "parallel.max_seqlen_per_rank = %d on %d ranks", l.limit,
                 world);
        return l;
    }
    l.cp_size = pc->context_parallel_size;
    l.limit = max_tokens_per_microbatch;
    l.parts = micro_batches;
    if (l.cp_size <= 1)
        snprintf(l.why, sizeof l.why, "train.max_tokens_per_microbatch = %d", l.limit);
    else
        snprintf(l.why, sizeof l.why, "train.max_tokens_per_microbatch = %d per rank and "
                 "parallel.context_parallel_size = %d", l.limit, l.cp_size);
    return l;
}

int weft_plan_max_document_len(const weft_plan_layout *l) {
    if (l->dynamic) return weft_cp_max_len(l->limit, l->world);
    return l->limit > 0 ? weft_cp_max_len(l->limit, l->cp_size) : INT_MAX;
}

static void check_plannable(const weft_plan_layout *l, const int *lengths, int n) {
    if (!l->dynamic) {
        WEFT_CHECK(l->cp_size >= 1 && l->world % l->cp_size == 0,
                   "parallel.context_parallel_size=%d does not divide the %d ranks", l->cp_size,
                   l->world);
        int max_len = weft_plan_max_document_len(l);
        for (int i = 0; i < n; i++)
            WEFT_CHECK(lengths[i] <= max_len,
                       "document %d of the batch has %d tokens, more than the limit of %d set by "
                       "%s; raise the budget or the context-parallel size, or set "
                       "data.truncate=true", i + 1, lengths[i], max_len, l->why);
        return;
    }
    int world = l->world, limit = l->limit;
    WEFT_CHECK(world >= 1 && (world & (world - 1)) == 0,
               "dynamic context parallelism needs a power-of-two number of ranks, not %d "
               "(its groups are aligned runs of 1, 2, 4, ... ranks)", world);
    WEFT_CHECK(limit >= 2, "parallel.max_seqlen_per_rank must be at least 2 (got %d)", limit);
    for (int i = 0; i < n; i++)
        WEFT_CHECK(weft_plan_min_degree(lengths[i], limit) <= world,
                   "document %d has %d tokens: it needs more than the %d ranks of this job at "
                   "parallel.max_seqlen_per_rank = %d (at most %d tokens fit); raise the limit, "
                   "launch more ranks or set data.truncate=true",
                   i + 1, lengths[i], world, limit, weft_cp_max_len(limit, world));
}

// ---------------------------------------------------------------------- building a plan ----

typedef struct builder {
    weft_plan p;
    const int *lengths;
    const weft_cost_model *cm;
    int *ran; // (world) micro-batches each rank has so far
} builder;

static builder builder_start(const int *lengths, int n, int world, int limit,
                             const weft_cost_model *cm) {
    int cap = n > 0 ? n : 1;
    return (builder){.p = {.world = world, .limit = limit,
                           .micro = weft_alloc(sizeof(weft_plan_micro) * cap),
                           .offsets = weft_alloc(sizeof(int) * (cap + 1)),
                           .docs = weft_alloc(sizeof(int) * cap)},
                     .lengths = lengths, .cm = cm, .ran = weft_alloc(sizeof(int) * world)};
}

static weft_plan builder_finish(builder *b) {
    weft_free(b->ran);
    return b->p;
}

static int ascending(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

// Appends a micro-batch of k documents for ranks [first, first + c).
static void add_micro(builder *b, int first, int c, const int *docs, int k) {
    weft_plan *p = &b->p;
    weft_plan_micro *m = &p->micro[p->n_micro];
    int at = p->offsets[p->n_micro];
    *m = (weft_plan_micro){.first_rank = first, .degree = c, .compute = b->cm->epsilon};
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

// ------------------------------------------------------------------ the balancing routine ----

typedef struct doc_item {
    int len, index, degree, rows;
    double time;
} doc_item;

static doc_item item_at(const weft_cost_model *cm, const int *lengths, int i, int c) {
    return (doc_item){.len = lengths[i], .index = i, .degree = c,
                      .rows = weft_cp_rows(lengths[i], c), .time = doc_time(cm, lengths[i], c)};
}

// Largest degree first (its groups hold whole groups of every smaller degree, so ranks of a group
// are always free together), then longest time first, then by index.
static int by_degree_then_time(const void *a, const void *b) {
    const doc_item *x = a, *y = b;
    if (x->degree != y->degree) return x->degree > y->degree ? -1 : 1;
    if (x->time != y->time) return x->time > y->time ? -1 : 1;
    return x->index - y->index;
}

// Longest-processing-time list scheduling, the one balancing routine of every layout. Items, in
// the given order, each go to the aligned group of their degree (ranks [g*c, (g+1)*c)) that is
// free soonest (its busiest rank's finish time; the lowest group on ties) among those whose ranks
// have room for its rows (at most `cap` each). finish and rows (per rank) start at zero;
// group_of[i] receives item i's group, -1 where none had room. Returns how many were placed.
static int list_schedule(const doc_item *items, int n, int ranks, int cap, int *group_of) {
    double *finish = weft_alloc(sizeof(double) * ranks);
    int *rows = weft_alloc(sizeof(int) * ranks), placed = 0;
    for (int i = 0; i < n; i++) {
        int c = items[i].degree, best = -1;
        double best_start = INFINITY;
        for (int g = 0; g < ranks / c; g++) {
            double start = 0;
            bool room = true;
            for (int r = g * c; r < (g + 1) * c; r++) {
                start = finish[r] > start ? finish[r] : start;
                room = room && rows[r] + items[i].rows <= cap;
            }
            if (room && start < best_start) best_start = start, best = g;
        }
        group_of[i] = best;
        if (best < 0) continue;
        for (int r = best * c; r < (best + 1) * c; r++)
            finish[r] = best_start + items[i].time, rows[r] += items[i].rows;
        placed++;
    }
    weft_free(finish), weft_free(rows);
    return placed;
}

// Packs a group's k documents (indices into the lengths) at degree c into the fewest micro-batches
// of at most the limit's rows per rank that balancing manages, and appends them.
static void pack_group(builder *b, int first, int c, const int *docs, int k) {
    int cap = k > 0 ? k : 1, limit = b->p.limit;
    doc_item *items = weft_alloc(sizeof(doc_item) * cap);
    int *bin_of = weft_alloc(sizeof(int) * cap), *members = weft_alloc(sizeof(int) * cap);
    long rows = 0;
    for (int i = 0; i < k; i++) {
        items[i] = item_at(b->cm, b->lengths, docs[i], c);
        items[i].degree = 1; // bins, one "rank" each
        rows += items[i].rows;
        WEFT_CHECK(items[i].rows <= limit, "document %d has %d tokens, more than %d rows per rank "
                   "at CP size %d", docs[i] + 1, items[i].len, limit, c);
    }
    qsort(items, (size_t)k, sizeof *items, by_degree_then_time);
    int n_bins = (int)((rows + limit - 1) / limit);
    if (n_bins < 1) n_bins = 1;
    while (list_schedule(items, k, n_bins, limit, bin_of) < k) n_bins++;
    for (int bin = 0; bin < n_bins && k > 0; bin++) {
        int m = 0;
        for (int i = 0; i < k; i++)
            if (bin_of[i] == bin) members[m++] = items[i].index;
        add_micro(b, first, c, members, m);
    }
    weft_free(items), weft_free(bin_of), weft_free(members);
}

// Cuts a group's k documents, in the given order, into `parts` non-empty contiguous runs of about
// equal token counts, and appends them. parts > k is a fatal error.
static void cut_group(builder *b, int first, int c, const int *docs, int k, int parts) {
    WEFT_CHECK(parts >= 1 && parts <= k,
               "cannot cut %d documents into %d micro-batches; use at most %d micro-batches", k,
               parts, k);
    long total = 0, seen = 0;
    for (int i = 0; i < k; i++) total += b->lengths[docs[i]];
    for (int i = 0, bin = 0, first_of_bin = 0; i <= k; i++) {
        // The next run starts once this one reached its share, or when only enough documents are
        // left to give each later run one.
        bool share_done = i < k && seen + b->lengths[docs[i]] / 2 >= total * (bin + 1) / parts;
        bool must_move = k - i == parts - 1 - bin;
        if (i == k || (bin < parts - 1 && i > first_of_bin && (share_done || must_move))) {
            add_micro(b, first, c, docs + first_of_bin, i - first_of_bin);
            bin++, first_of_bin = i;
        }
        if (i < k) seen += b->lengths[docs[i]];
    }
}

// ------------------------------------------------------------------------ static layouts ----

// Data parallelism and static CP: the documents balanced over the world/c groups, then each
// group's packed within the limit, or cut into `parts` without one.
static weft_plan plan_static(const weft_plan_layout *l, const int *lengths, int n) {
    int c = l->cp_size, cap = n > 0 ? n : 1;
    builder b = builder_start(lengths, n, l->world, l->limit > 0 ? l->limit : INT_MAX, &l->cost);
    doc_item *items = weft_alloc(sizeof(doc_item) * cap);
    int *group_of = weft_alloc(sizeof(int) * cap), *docs = weft_alloc(sizeof(int) * cap);
    for (int i = 0; i < n; i++) items[i] = item_at(&l->cost, lengths, i, c);
    qsort(items, (size_t)n, sizeof *items, by_degree_then_time);
    list_schedule(items, n, l->world, INT_MAX, group_of);
    for (int g = 0; g < l->world / c; g++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (group_of[i] == g) docs[k++] = items[i].index;
        qsort(docs, (size_t)k, sizeof(int), ascending); // document order within the group
        if (k == 0) continue;
        if (l->limit > 0) pack_group(&b, g * c, c, docs, k);
        else cut_group(&b, g * c, c, docs, k, l->parts < k ? l->parts : k);
    }
    weft_free(items), weft_free(group_of), weft_free(docs);
    return builder_finish(&b);
}

weft_plan weft_plan_pack(const int *lengths, int n, int limit, const weft_cost_model *cm) {
    builder b = builder_start(lengths, n, 1, limit, cm);
    int *docs = weft_alloc(sizeof(int) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) docs[i] = i;
    if (n > 0) pack_group(&b, 0, 1, docs, n);
    weft_free(docs);
    return builder_finish(&b);
}

weft_plan weft_plan_contiguous(const int *lengths, int n, int parts) {
    weft_cost_model none = {0};
    builder b = builder_start(lengths, n, 1, INT_MAX, &none);
    int *docs = weft_alloc(sizeof(int) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) docs[i] = i;
    cut_group(&b, 0, 1, docs, n, parts);
    weft_free(docs);
    return builder_finish(&b);
}

// ------------------------------------------------------------------------ uniform mode ----

static int longest_first(const void *a, const void *b) {
    const doc_item *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->index - y->index;
}

// Items placed on the step's groups (group_of[i] >= 0) first, the rest after, each part in its
// order; returns how many were placed.
static int placed_first(doc_item *items, int n, const int *group_of, doc_item *tmp) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (group_of[i] >= 0) tmp[k++] = items[i];
    int placed = k;
    for (int i = 0; i < n; i++)
        if (group_of[i] < 0) tmp[k++] = items[i];
    memcpy(items, tmp, sizeof(doc_item) * n);
    return placed;
}

// Schedules the first n items at degree c onto one step's world/c groups, within the limit.
static int schedule_step(doc_item *items, int n, int c, const builder *b, int *group_of) {
    for (int i = 0; i < n; i++) items[i] = item_at(b->cm, b->lengths, items[i].index, c);
    return list_schedule(items, n, b->p.world, b->p.limit, group_of);
}

static weft_plan plan_uniform(const int *lengths, int n, int world, int limit,
                              const weft_cost_model *cm) {
    builder b = builder_start(lengths, n, world, limit, cm);
    int cap = n > 0 ? n : 1;
    doc_item *items = weft_alloc(sizeof(doc_item) * cap), *tmp = weft_alloc(sizeof(doc_item) * cap);
    int *group_of = weft_alloc(sizeof(int) * cap), *docs = weft_alloc(sizeof(int) * cap);
    for (int i = 0; i < n; i++) items[i] = item_at(cm, lengths, i, 1);
    qsort(items, (size_t)n, sizeof *items, longest_first);
    for (int left = n; left > 0;) {
        // The longest remaining document sets the degree; the rest fill the groups around it.
        int c = weft_plan_min_degree(items[0].len, limit);
        int placed = schedule_step(items, left, c, &b, group_of);
        // Fewer documents than groups would leave ranks idle: raise c until every group has one.
        // The chosen documents still fit, as doubling c halves (about) every document's rows.
        while (placed < world / c) {
            c *= 2;
            int kept = placed_first(items, left, group_of, tmp);
            placed = schedule_step(items, kept, c, &b, group_of);
            for (int i = kept; i < left; i++) group_of[i] = -1;
        }
        for (int g = 0; g < world / c; g++) { // the step: every group side by side
            int k = 0;
            for (int i = 0; i < left; i++)
                if (group_of[i] == g) docs[k++] = items[i].index;
            add_micro(&b, g * c, c, docs, k);
        }
        placed_first(items, left, group_of, tmp);
        left -= placed;
        memmove(items, items + placed, sizeof(doc_item) * left); // the rest, longest first
    }
    weft_free(items), weft_free(tmp), weft_free(group_of), weft_free(docs);
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
        for (int c = weft_plan_min_degree(len, limit); c <= world; c *= 2) {
            least = fmin(least, c * doc_time(cm, len, c));
            best = fmin(best, doc_time(cm, len, c));
        }
        rank_seconds += least;
        longest = fmax(longest, best);
    }
    return fmax(rank_seconds / world, longest);
}

// Documents at the degrees in items (freed here) list-scheduled largest degree first onto the
// aligned groups free soonest, then each group's packed into micro-batches, level by level (a
// degree's items are contiguous).
static weft_plan plan_items(doc_item *items, const int *lengths, int n, int world, int limit,
                            const weft_cost_model *cm) {
    builder b = builder_start(lengths, n, world, limit, cm);
    int cap = n > 0 ? n : 1;
    qsort(items, (size_t)n, sizeof *items, by_degree_then_time);
    int *group_of = weft_alloc(sizeof(int) * cap), *docs = weft_alloc(sizeof(int) * cap);
    list_schedule(items, n, world, INT_MAX, group_of);
    for (int lo = 0, hi; lo < n; lo = hi) {
        int c = items[lo].degree;
        for (hi = lo; hi < n && items[hi].degree == c; hi++) {}
        for (int g = 0; g < world / c; g++) {
            int k = 0;
            for (int i = lo; i < hi; i++)
                if (group_of[i] == g) docs[k++] = items[i].index;
            if (k > 0) pack_group(&b, g * c, c, docs, k);
        }
    }
    weft_free(items), weft_free(group_of), weft_free(docs);
    return builder_finish(&b);
}

// Each document at the least degree that fits the limit, raised while its time exceeds
// `threshold` and raising shortens it.
static weft_plan plan_heterogeneous_at(const int *lengths, int n, int world, int limit,
                                       const weft_cost_model *cm, double threshold) {
    doc_item *items = weft_alloc(sizeof(doc_item) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) {
        int len = lengths[i], c = weft_plan_min_degree(len, limit);
        while (c < world && doc_time(cm, len, c) > threshold &&
               doc_time(cm, len, 2 * c) < doc_time(cm, len, c))
            c *= 2;
        items[i] = item_at(cm, lengths, i, c);
    }
    return plan_items(items, lengths, n, world, limit, cm);
}

// When the plan's last rank is done, a group starting once all its ranks are free.
static double critical_path(const weft_plan *p) {
    double *finish = weft_alloc(sizeof(double) * p->world), path = 0;
    for (int m = 0; m < p->n_micro; m++) {
        const weft_plan_micro *mb = &p->micro[m];
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
static void keep_shorter(weft_plan *best, double *best_path, weft_plan p) {
    double path = critical_path(&p);
    if (path < *best_path) {
        weft_plan_free(best);
        *best = p, *best_path = path;
    } else {
        weft_plan_free(&p);
    }
}

// Raising a document's degree shortens it but costs exchange and fixed time on more ranks; the
// right threshold depends on the batch, so a few are tried, and the uniform plan too (one of the
// plans this mode allows, better on some small batches), and the shortest critical path kept
// (ties: the fewest raises).
static weft_plan plan_heterogeneous(const int *lengths, int n, int world, int limit,
                                    const weft_cost_model *cm) {
    double bound = lower_bound(lengths, NULL, n, world, limit, cm), best_path = INFINITY;
    weft_plan best = {0};
    for (double f = 1.0; f >= 1.0 / 16; f /= 2)
        keep_shorter(&best, &best_path, plan_heterogeneous_at(lengths, n, world, limit, cm, f * bound));
    keep_shorter(&best, &best_path, plan_uniform(lengths, n, world, limit, cm));
    return best;
}

// ---------------------------------------------------------------------------- public ----

weft_plan weft_plan_make(const weft_plan_layout *l, const int *lengths, int n) {
    check_plannable(l, lengths, n);
    if (!l->dynamic) return plan_static(l, lengths, n);
    return l->mode == WEFT_DCP_HETEROGENEOUS
               ? plan_heterogeneous(lengths, n, l->world, l->limit, &l->cost)
               : plan_uniform(lengths, n, l->world, l->limit, &l->cost);
}

void weft_plan_free(weft_plan *p) {
    weft_free(p->micro), weft_free(p->offsets), weft_free(p->docs);
    memset(p, 0, sizeof *p);
}

weft_local_plan weft_plan_local(const weft_plan *p, int rank) {
    int n_micro = 0, n_docs = 0;
    for (int m = 0; m < p->n_micro; m++)
        if (weft_plan_micro_holds(&p->micro[m], rank))
            n_micro++, n_docs += p->offsets[m + 1] - p->offsets[m];
    weft_local_plan l = {.n_micro = n_micro, .n_docs = n_docs,
                         .degree = weft_alloc(sizeof(int) * (n_micro > 0 ? n_micro : 1)),
                         .offsets = weft_alloc(sizeof(int) * (n_micro + 1)),
                         .docs = weft_alloc(sizeof(int) * (n_docs > 0 ? n_docs : 1))};
    for (int m = 0, q = 0, k = 0; m < p->n_micro; m++) {
        if (!weft_plan_micro_holds(&p->micro[m], rank)) continue;
        l.degree[q] = p->micro[m].degree;
        for (int j = p->offsets[m]; j < p->offsets[m + 1]; j++) l.docs[k++] = p->docs[j];
        l.offsets[++q] = k;
    }
    return l;
}

void weft_local_plan_free(weft_local_plan *p) {
    weft_free(p->degree), weft_free(p->offsets), weft_free(p->docs);
    memset(p, 0, sizeof *p);
}

// --------------------------------------------------------------------------- simulation ----

weft_plan_estimate weft_plan_simulate(const weft_plan *p, const int *lengths,
                                      const weft_cost_model *cm, double *rank_compute) {
    int W = p->world;
    double *busy = weft_alloc(sizeof(double) * W);
    if (rank_compute) memset(rank_compute, 0, sizeof(double) * W);
    weft_plan_estimate e = {.critical_path = critical_path(p)};
    for (int m = 0; m < p->n_micro; m++) {
        const weft_plan_micro *mb = &p->micro[m];
        for (int r = mb->first_rank; r < mb->first_rank + mb->degree; r++) {
            busy[r] += mb->compute + mb->comm;
            if (rank_compute) rank_compute[r] += mb->compute;
        }
        for (int k = p->offsets[m]; k < p->offsets[m + 1]; k++)
            e.exchanged_rows += weft_plan_exchanged_rows(lengths[p->docs[k]], mb->degree);
    }
    for (int r = 0; r < W; r++) {
        e.max_busy = fmax(e.max_busy, busy[r]);
        e.mean_busy += busy[r] / W;
    }
    e.lower_bound = lower_bound(lengths, p->docs, p->offsets[p->n_micro], W, p->limit, cm);
    weft_free(busy);
    return e;
}
