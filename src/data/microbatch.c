#include "data/microbatch.h"

#include <stdlib.h>

void weft_microbatch_plan_free(weft_microbatch_plan *p) {
    weft_free(p->offsets);
    weft_free(p->docs);
    p->offsets = p->docs = NULL;
}

// Builds the plan from a micro-batch id per document, keeping document order inside each.
static weft_microbatch_plan plan_from_bins(const int *bin_of, int n, int n_bins) {
    weft_microbatch_plan p = {.n_micro = n_bins, .n_docs = n};
    p.offsets = weft_alloc(sizeof(int) * (n_bins + 1));
    p.docs = weft_alloc(sizeof(int) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) p.offsets[bin_of[i] + 1]++;
    for (int b = 0; b < n_bins; b++) p.offsets[b + 1] += p.offsets[b];
    int *fill = weft_alloc(sizeof(int) * (n_bins > 0 ? n_bins : 1));
    for (int i = 0; i < n; i++) p.docs[p.offsets[bin_of[i]] + fill[bin_of[i]]++] = i;
    weft_free(fill);
    return p;
}

weft_microbatch_plan weft_plan_contiguous(const int *lengths, int n, int parts) {
    WEFT_CHECK(parts >= 1 && parts <= n,
               "cannot cut %d documents into %d micro-batches; use at most %d micro-batches", n,
               parts, n);
    long total = 0, seen = 0;
    for (int i = 0; i < n; i++) total += lengths[i];
    int *bin_of = weft_alloc(sizeof(int) * n), bin = 0, first_of_bin = 0;
    for (int i = 0; i < n; i++) {
        if (bin < parts - 1 && i > first_of_bin) {
            // Next run once this one reached its share, or when only enough documents are left
            // to give each later run one.
            bool share_done = seen + lengths[i] / 2 >= total * (bin + 1) / parts;
            bool must_move = n - i == parts - 1 - bin;
            if (share_done || must_move) bin++, first_of_bin = i;
        }
        bin_of[i] = bin;
        seen += lengths[i];
    }
    WEFT_CHECK(bin == parts - 1, "internal: contiguous split made %d of %d runs", bin + 1, parts);
    weft_microbatch_plan p = plan_from_bins(bin_of, n, parts);
    weft_free(bin_of);
    return p;
}

typedef struct cost_item {
    double cost;
    int index;
} cost_item;

static int by_cost_desc(const void *a, const void *b) {
    const cost_item *x = a, *y = b;
    if (x->cost != y->cost) return x->cost < y->cost ? 1 : -1;
    return x->index - y->index;
}

// LPT into n_bins under the token cap; false if some document fits no bin.
static bool lpt_assign(const cost_item *items, const int *lengths, int n, int n_bins,
                       int max_tokens, int *bin_of) {
    double *cost = weft_alloc(sizeof(double) * n_bins);
    long *tokens = weft_alloc(sizeof(long) * n_bins);
    bool ok = true;
    for (int k = 0; k < n && ok; k++) {
        int i = items[k].index, best = -1;
        for (int b = 0; b < n_bins; b++)
            if (tokens[b] + lengths[i] <= max_tokens && (best < 0 || cost[b] < cost[best])) best = b;
        ok = best >= 0;
        if (ok) bin_of[i] = best, cost[best] += items[k].cost, tokens[best] += lengths[i];
    }
    weft_free(cost);
    weft_free(tokens);
    return ok;
}

static cost_item *by_cost(const int *lengths, int n, double alpha, double beta) {
    cost_item *items = weft_alloc(sizeof(cost_item) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++)
        items[i] = (cost_item){alpha * (double)lengths[i] * lengths[i] + beta * lengths[i], i};
    qsort(items, n, sizeof *items, by_cost_desc);
    return items;
}

weft_microbatch_plan weft_plan_balanced(const int *lengths, int n, int parts, double alpha,
                                        double beta) {
    WEFT_CHECK(parts >= 1, "internal: balancing over %d parts", parts);
    cost_item *items = by_cost(lengths, n, alpha, beta);
    int *bin_of = weft_alloc(sizeof(int) * (n > 0 ? n : 1));
    lpt_assign(items, lengths, n, parts, 1 << 30, bin_of);
    weft_microbatch_plan p = plan_from_bins(bin_of, n, parts);
    weft_free(items);
    weft_free(bin_of);
    return p;
}

weft_microbatch_plan weft_plan_packed(const int *lengths, int n, int max_tokens, double alpha,
                                      double beta) {
    long total = 0;
    for (int i = 0; i < n; i++) {
        WEFT_CHECK(lengths[i] <= max_tokens,
                   "document %d has %d tokens, more than train.max_tokens_per_microbatch = %d; "
                   "raise the budget or set data.truncate=true",
                   i, lengths[i], max_tokens);
        total += lengths[i];
    }
    cost_item *items = by_cost(lengths, n, alpha, beta);
    int *bin_of = weft_alloc(sizeof(int) * (n > 0 ? n : 1));
    int n_bins = (int)((total + max_tokens - 1) / max_tokens);
    if (n_bins < 1) n_bins = 1;
    while (!lpt_assign(items, lengths, n, n_bins, max_tokens, bin_of)) n_bins++;
    weft_microbatch_plan p = plan_from_bins(bin_of, n, n_bins);
    weft_free(items);
    weft_free(bin_of);
    return p;
}
