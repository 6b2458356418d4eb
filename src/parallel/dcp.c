#include "parallel/dcp.h"

#include <stdlib.h>
#include <string.h>

double weft_cost_of(const weft_cost_model *cm, int len) {
    return cm->alpha * (double)len * len + cm->beta * len + cm->gamma;
}

// The smallest power of two c whose per-rank rows of the document fit the limit.
static int degree_for(int len, int limit) {
    int c = 1;
    while (weft_cp_rows(len, c) > limit && c < (1 << 29)) c *= 2;
    return c;
}

typedef struct doc_item {
    int len, index;
} doc_item;

static int longest_first(const void *a, const void *b) {
    const doc_item *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->index - y->index;
}

static int ascending(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

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
        cost[best] += weft_cost_of(cm, items[i].len) / c; // the group's ranks share the work
        placed++;
    }
    return placed;
}

static void add_step(weft_dcp_plan *p, const doc_item *items, int n, const int *group_of, int c,
                     const int *rows, const double *cost) {
    weft_dcp_step *s = &p->steps[p->n_steps++];
    s->degree = c;
    s->n_groups = p->world / c;
    s->offsets = weft_alloc(sizeof(int) * (s->n_groups + 1));
    s->cost = weft_alloc(sizeof(double) * s->n_groups);
    s->rows = weft_alloc(sizeof(int) * s->n_groups);
    int total = 0;
    for (int i = 0; i < n; i++) total += group_of[i] >= 0;
    s->docs = weft_alloc(sizeof(int) * (total > 0 ? total : 1));
    int k = 0;
    for (int g = 0; g < s->n_groups; g++) {
        s->offsets[g] = k;
        for (int i = 0; i < n; i++)
            if (group_of[i] == g) s->docs[k++] = items[i].index;
        qsort(s->docs + s->offsets[g], (size_t)(k - s->offsets[g]), sizeof(int), ascending);
        s->cost[g] = cost[g];
        s->rows[g] = rows[g];
    }
    s->offsets[s->n_groups] = k;
}

weft_dcp_plan weft_dcp_plan_uniform(const int *lengths, int n, int world, int limit,
                                    const weft_cost_model *cm) {
    WEFT_CHECK(world >= 1 && (world & (world - 1)) == 0,
               "dynamic context parallelism needs a power-of-two number of ranks, not %d "
               "(its groups are aligned runs of 1, 2, 4, ... ranks)", world);
    WEFT_CHECK(limit >= 2, "parallel.max_seqlen_per_rank must be at least 2 (got %d)", limit);
    for (int i = 0; i < n; i++)
        WEFT_CHECK(degree_for(lengths[i], limit) <= world,
                   "document %d has %d tokens: it needs more than the %d ranks of this job at "
                   "parallel.max_seqlen_per_rank = %d (at most %d tokens fit); raise the limit, "
                   "launch more ranks or set data.truncate=true",
                   i + 1, lengths[i], world, limit, weft_cp_max_len(limit, world));
    weft_dcp_plan p = {.world = world, .steps = weft_alloc(sizeof(weft_dcp_step) * (n > 0 ? n : 1))};
    doc_item *items = weft_alloc(sizeof(doc_item) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) items[i] = (doc_item){lengths[i], i};
    qsort(items, n, sizeof *items, longest_first);
    int *group_of = weft_alloc(sizeof(int) * (n > 0 ? n : 1)), *rows = weft_alloc(sizeof(int) * world);
    double *cost = weft_alloc(sizeof(double) * world);
    doc_item *rest = weft_alloc(sizeof(doc_item) * (n > 0 ? n : 1));
    int left = n;
    while (left > 0) {
        // The longest remaining document sets the degree; the rest fill the groups around it.
        int c = degree_for(items[0].len, limit);
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
            int again = assign(items, kept, c, world / c, limit, cm, group_of, rows, cost);
            for (int i = kept; i < left; i++) group_of[i] = -1;
            placed = again;
        }
        add_step(&p, items, left, group_of, c, rows, cost);
        int k = 0;
        for (int i = 0; i < left; i++)
            if (group_of[i] < 0) rest[k++] = items[i];
        memcpy(items, rest, sizeof(doc_item) * k);
        left = k;
    }
    weft_free(items), weft_free(group_of), weft_free(rows), weft_free(cost), weft_free(rest);
    return p;
}

void weft_dcp_plan_free(weft_dcp_plan *p) {
    for (int s = 0; s < p->n_steps; s++) {
        weft_free(p->steps[s].offsets);
        weft_free(p->steps[s].docs);
        weft_free(p->steps[s].cost);
        weft_free(p->steps[s].rows);
    }
    weft_free(p->steps);
    memset(p, 0, sizeof *p);
}
