// Every planner plan (uniform and heterogeneous DCP, static CP) on random long-tail batches and world sizes 1 to
// 256: each document in exactly one micro-batch; every group an aligned power-of-two run of ranks
// within the world; rows per rank within the limit and as the CP split gives them; each rank's
// micro-batches in list order with increasing steps, the members of a group at the same step
// (so ranks run the list without crosswise waits); the same plan twice; the simulated critical
// path at least the lower bound, and every rank's compute adding up to the documents' cost.
// Heterogeneous plans are never slower than uniform ones and on large worlds come within 10% of
// the lower bound; uniform ones never leave a group idle.
#include <math.h>

#include "../testing.h"
#include "parallel/planner.h"

static void check_plan(const weft_plan *p, const int *lengths, int n, int world, int limit,
                       const weft_cost_model *cm, bool every_group_busy) {
    CHECK(p->world == world && p->limit == limit);
    CHECK(p->offsets[0] == 0 && p->offsets[p->n_micro] == n);
    int *seen = weft_alloc(sizeof(int) * (n > 0 ? n : 1)), *ran = weft_alloc(sizeof(int) * world);
    for (int m = 0; m < p->n_micro; m++) {
        const weft_plan_micro *mb = &p->micro[m];
        int c = mb->degree, rows = 0;
        CHECK(c >= 1 && (c & (c - 1)) == 0 && c <= world);
        CHECK(mb->first_rank >= 0 && mb->first_rank % c == 0 && mb->first_rank + c <= world);
        CHECK(p->offsets[m + 1] > p->offsets[m]); // no empty micro-batch
        double compute = cm->epsilon;
        for (int k = p->offsets[m]; k < p->offsets[m + 1]; k++) {
            int d = p->docs[k];
            CHECK(d >= 0 && d < n);
            seen[d]++;
            if (k > p->offsets[m]) CHECK(d > p->docs[k - 1]);
            rows += weft_cp_rows(lengths[d], c);
            compute += weft_cost_compute(cm, lengths[d], c);
        }
        CHECK(rows == mb->rows && rows <= limit);
        CHECK(fabs(compute - mb->compute) <= 1e-9 * compute);
        for (int r = mb->first_rank; r < mb->first_rank + c; r++) CHECK(ran[r] == mb->step);
        for (int r = mb->first_rank; r < mb->first_rank + c; r++) ran[r]++;
        CHECK(mb->step < p->n_steps);
    }
    for (int i = 0; i < n; i++) CHECK(seen[i] == 1);
    if (every_group_busy) // uniform: each step's groups tile the world
        for (int r = 0; r < world; r++) CHECK(ran[r] == p->n_steps);

    double *compute = weft_alloc(sizeof(double) * world), total = 0, expected = 0;
    weft_plan_estimate e = weft_plan_simulate(p, lengths, cm, compute);
    for (int r = 0; r < world; r++) total += compute[r];
    for (int m = 0; m < p->n_micro; m++) expected += p->micro[m].compute * p->micro[m].degree;
    CHECK(fabs(total - expected) <= 1e-9 * expected);
    CHECK(e.critical_path >= e.lower_bound * (1 - 1e-12));
    CHECK(e.max_busy <= e.critical_path * (1 + 1e-12) && e.mean_busy <= e.max_busy * (1 + 1e-12));
    weft_free(seen), weft_free(ran), weft_free(compute);
}

static bool same_plan(const weft_plan *a, const weft_plan *b) {
    if (a->n_micro != b->n_micro || a->n_steps != b->n_steps) return false;
    for (int m = 0; m < a->n_micro; m++)
        if (a->micro[m].first_rank != b->micro[m].first_rank || a->micro[m].degree != b->micro[m].degree)
            return false;
    return !memcmp(a->offsets, b->offsets, sizeof(int) * (a->n_micro + 1)) &&
           !memcmp(a->docs, b->docs, sizeof(int) * a->offsets[a->n_micro]);
}

// Long-tail lengths: mostly short, some up to the limit times the world.
static void random_lengths(weft_rng *rng, int *lengths, int n, int max_len) {
    for (int i = 0; i < n; i++) {
        double u = weft_rng_uniform(rng);
        int len = 1 + (int)(exp(log(max_len) * u * u * u));
        lengths[i] = len < max_len ? len : max_len;
    }
}

int main(void) {
    weft_rng rng;
    weft_rng_seed(&rng, 11);
    const weft_cost_model models[2] = {{2.2e-7, 1.5e-4, 3.7e-4, 1.7e-5, 2e-3}, {1.0 / 4096, 1, 20, 0.5, 0}};
    const int worlds[] = {1, 2, 4, 8, 64, 256}, limit = 512;
    int lengths[4096];
    for (int w = 0; w < 6; w++)
        for (int c = 0; c < 2; c++) {
            int world = worlds[w], n = world >= 64 ? 4096 : 3 + (int)(weft_rng_uniform(&rng) * 60);
            random_lengths(&rng, lengths, n, weft_cp_max_len(limit, world < 16 ? world : 16));
            int longest = 0;
            for (int i = 0; i < n; i++) longest = lengths[i] > longest ? lengths[i] : longest;
            double uniform_path = 0;
            for (int mode = 0; mode < 2; mode++) {
                weft_plan_layout l = {.world = world, .dynamic = true, .mode = mode,
                                      .limit = limit, .cost = models[c]};
                weft_plan a = weft_plan_make(&l, lengths, n);
                weft_plan b = weft_plan_make(&l, lengths, n);
                check_plan(&a, lengths, n, world, limit, &models[c], mode == WEFT_DCP_UNIFORM);
                CHECK(same_plan(&a, &b));
                weft_plan_estimate e = weft_plan_simulate(&a, lengths, &models[c], NULL);
                printf("W=%3d cost model %d %-13s: %4d documents, %5d micro-batches, critical path "
                       "%.4f x lower bound\n", world, c, mode ? "heterogeneous" : "uniform", n,
                       a.n_micro, e.critical_path / e.lower_bound);
                if (mode == WEFT_DCP_UNIFORM) uniform_path = e.critical_path;
                else CHECK(e.critical_path <= uniform_path);
                if (mode == WEFT_DCP_HETEROGENEOUS && world >= 64)
                    CHECK(e.critical_path <= 1.10 * e.lower_bound);
                weft_plan_free(&a), weft_plan_free(&b);
            }
            int sc = weft_plan_min_degree(longest, limit);
            weft_plan_layout sl = {.world = world, .cp_size = sc, .limit = limit, .cost = models[c]};
            weft_plan s = weft_plan_make(&sl, lengths, n);
            check_plan(&s, lengths, n, world, limit, &models[c], false);
            for (int m = 0; m < s.n_micro; m++) CHECK(s.micro[m].degree == sc);
            weft_plan_free(&s);
        }
    // An empty batch plans to nothing.
    weft_plan_layout hl = {.world = 8, .dynamic = true, .mode = WEFT_DCP_HETEROGENEOUS,
                           .limit = limit, .cost = models[0]};
    weft_plan e = weft_plan_make(&hl, lengths, 0);
    CHECK(e.n_micro == 0 && e.n_steps == 0);
    weft_plan_free(&e);
    printf("ok\n");
    return 0;
}
