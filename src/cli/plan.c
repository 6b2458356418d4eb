// `weft plan [--config FILE.yaml] [--ranks N] [--batch FILE.jsonl] [key=value ...]`: the dynamic
// context-parallel plan of one global batch (the job's first, or the documents of --batch) on N
// ranks: per micro-batch step its degree, each group's ranks and documents, rows per rank against
// parallel.max_seqlen_per_rank, and the estimated cost per rank. Runs the same planner every
// training rank runs, without a model or MPI.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "parallel/dcp.h"
#include "train/loop.h"
#include "train/step.h"

typedef struct plan_args {
    const char *config, *batch;
    int ranks, n_overrides;
    char **overrides;
} plan_args;

static plan_args parse_args(int argc, char **argv) {
    plan_args a = {.ranks = 1, .overrides = argv};
    for (int i = 0; i < argc; i++) {
        bool valued = !strcmp(argv[i], "--config") || !strcmp(argv[i], "--batch") ||
                      !strcmp(argv[i], "--ranks");
        if (valued) {
            WEFT_CHECK(i + 1 < argc, "plan: %s needs a value", argv[i]);
            const char *v = argv[++i];
            if (!strcmp(argv[i - 1], "--config")) a.config = v;
            else if (!strcmp(argv[i - 1], "--batch")) a.batch = v;
            else {
                char *end;
                long n = strtol(v, &end, 10);
                WEFT_CHECK(*end == '\0' && n >= 1 && n <= INT_MAX,
                           "plan: --ranks %s is not a positive rank count", v);
                a.ranks = (int)n;
            }
        } else if (argv[i][0] == '-') {
            weft_fatal("plan: unknown option \"%s\"; see weft --help", argv[i]);
        } else {
            a.overrides[a.n_overrides++] = argv[i];
        }
    }
    return a;
}

static void print_step(int s, const weft_dcp_step *st, const int *lengths, int limit) {
    double most = 0, sum = 0;
    for (int g = 0; g < st->n_groups; g++) {
        most = st->cost[g] > most ? st->cost[g] : most;
        sum += st->cost[g];
    }
    printf("micro-batch %d: degree %d, %d group%s, estimated cost per rank max %.1f mean %.1f "
           "(imbalance %.3f)\n", s + 1, st->degree, st->n_groups, st->n_groups == 1 ? "" : "s",
           most, sum / st->n_groups, sum > 0 ? most / (sum / st->n_groups) : 1.0);
    for (int g = 0; g < st->n_groups; g++) {
        printf("  ranks %d-%d: rows/rank %d of %d, cost/rank %.1f, documents", g * st->degree,
               (g + 1) * st->degree - 1, st->rows[g], limit, st->cost[g]);
        for (int k = st->offsets[g]; k < st->offsets[g + 1]; k++)
            printf(" %d(%d)", st->docs[k] + 1, lengths[st->docs[k]]);
        printf("\n");
    }
}

int weft_cmd_plan(int argc, char **argv) {
    plan_args a = parse_args(argc, argv);
    weft_job_config cfg = weft_job_config_default();
    if (a.config) weft_job_config_load_yaml(&cfg, a.config);
    weft_job_config_apply_overrides(&cfg, a.n_overrides, a.overrides);
    weft_job_config_validate(&cfg);
    WEFT_CHECK(cfg.parallel.dynamic_context_parallel,
               "plan: shows dynamic context-parallel plans; add parallel.dynamic_context_parallel=true");

    weft_tokenizer *tok = NULL;
    weft_document_set *set = a.batch ? weft_read_token_jsonl(a.batch, INT_MAX)
                                     : weft_train_load_data(&cfg, a.ranks, &tok);
    int n = a.batch ? set->n : cfg.train.global_batch_size;
    weft_document *docs = weft_alloc(sizeof(weft_document) * (n > 0 ? n : 1));
    if (a.batch) memcpy(docs, set->docs, sizeof(weft_document) * n);
    else weft_train_first_batch(&cfg, set, docs);
    int *lengths = weft_alloc(sizeof(int) * (n > 0 ? n : 1));
    long tokens = 0;
    for (int i = 0; i < n; i++) tokens += lengths[i] = docs[i].len;

    weft_cost_model cm = {cfg.parallel.cost_alpha, cfg.parallel.cost_beta, 0};
    int limit = cfg.parallel.max_seqlen_per_rank;
    double t0 = weft_now_seconds();
    weft_dcp_plan p = weft_dcp_plan_uniform(lengths, n, a.ranks, limit, &cm);
    double ms = 1e3 * (weft_now_seconds() - t0);
    printf("plan: %d documents, %ld tokens on %d ranks, max_seqlen_per_rank %d, cost %g*L^2 + "
           "%g*L: %d micro-batch step%s, planned in %.3f ms\n", n, tokens, a.ranks, limit,
           cm.alpha, cm.beta, p.n_steps, p.n_steps == 1 ? "" : "s", ms);
    for (int s = 0; s < p.n_steps; s++) print_step(s, &p.steps[s], lengths, limit);

    weft_dcp_plan_free(&p);
    weft_free(lengths);
    weft_free(docs);
    weft_document_set_free(set);
    if (tok) weft_tokenizer_free(tok);
    return 0;
}
