// The planner's packing of one group's documents: every document in exactly one micro-batch, no
// micro-batch over the budget, the same plan twice, cost balanced across micro-batches;
// contiguous cuts non-empty.
#include <stdio.h>
#include <string.h>

#include "parallel/planner.h"

static int failures = 0;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void check_cover(const weft_plan *p, int n) {
    int seen[4096] = {0};
    CHECK(p->offsets[0] == 0 && p->offsets[p->n_micro] == n, "plan covers %d of %d docs",
          p->offsets[p->n_micro], n);
    for (int b = 0; b < p->n_micro; b++) {
        CHECK(p->offsets[b + 1] > p->offsets[b], "micro-batch %d is empty", b);
        for (int k = p->offsets[b]; k < p->offsets[b + 1]; k++) {
            seen[p->docs[k]]++;
            if (k > p->offsets[b]) CHECK(p->docs[k] > p->docs[k - 1], "order inside micro-batch");
        }
    }
    for (int i = 0; i < n; i++) CHECK(seen[i] == 1, "document %d planned %d times", i, seen[i]);
}

int main(void) {
    weft_rng rng;
    weft_rng_seed(&rng, 7);
    int lengths[1000];
    long total = 0;
    for (int i = 0; i < 1000; i++) {
        lengths[i] = 1 + (int)(weft_rng_uniform(&rng) * weft_rng_uniform(&rng) * 2000);
        total += lengths[i];
    }
    const int budget = 4096;
    const weft_cost_model cost = {.alpha = 1e-3, .beta = 1.0}; // alpha*L^2 + beta*L
    weft_plan a = weft_plan_pack(lengths, 1000, budget, &cost);
    weft_plan b = weft_plan_pack(lengths, 1000, budget, &cost);
    check_cover(&a, 1000);
    CHECK(a.n_micro == b.n_micro && !memcmp(a.docs, b.docs, sizeof(int) * 1000),
          "same input gave different plans");
    double max_cost = 0, sum_cost = 0;
    for (int m = 0; m < a.n_micro; m++) {
        long tokens = 0;
        double cost = 0;
        for (int k = a.offsets[m]; k < a.offsets[m + 1]; k++) {
            int L = lengths[a.docs[k]];
            tokens += L;
            cost += 1e-3 * L * L + L;
        }
        CHECK(tokens <= budget, "micro-batch %d holds %ld tokens > %d", m, tokens, budget);
        max_cost = cost > max_cost ? cost : max_cost;
        sum_cost += cost;
    }
    double imbalance = max_cost / (sum_cost / a.n_micro);
    long lower = (total + budget - 1) / budget;
    printf("packed: %d micro-batches (lower bound %ld), cost max/mean %.3f\n", a.n_micro, lower,
           imbalance);
    // LPT under a cap stays within a few bins of the bound and keeps costs near the mean.
    CHECK(a.n_micro <= lower + 3, "too many micro-batches: %d for bound %ld", a.n_micro, lower);
    CHECK(imbalance < 1.25, "cost imbalance %.3f", imbalance);

    for (int parts = 1; parts <= 7; parts++) {
        int small[7] = {5, 1, 300, 2, 2, 80, 9};
        weft_plan c = weft_plan_contiguous(small, 7, parts);
        CHECK(c.n_micro == parts, "contiguous gave %d of %d parts", c.n_micro, parts);
        check_cover(&c, 7);
        for (int k = 1; k < 7; k++) CHECK(c.docs[k] == k, "contiguous plan reorders documents");
        weft_plan_free(&c);
    }
    weft_plan_free(&a);
    weft_plan_free(&b);
    printf(failures ? "FAILED\n" : "ok\n");
    return failures != 0;
}
