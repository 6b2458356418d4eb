// `weft plan`: the dynamic context-parallel planner without a model or MPI, running the same code
// every training rank runs.
//  - A batch (the job's first, or --batch FILE.jsonl): its micro-batches step by step, each
//    group's ranks, degree, rows per rank and documents, and the plan's estimated critical path.
//  - A length trace (--lengths FILE, one length per line), cut into global batches of
//    train.global_batch_size documents: per step, heterogeneous DCP, uniform DCP and static CP
//    side by side: critical path over the perfect-balance lower bound, imbalance, key/value bytes
//    exchanged, and planning time.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "parallel/dcp.h"
#include "train/loop.h"
#include "train/step.h"

typedef struct plan_args {
    const char *config, *batch, *lengths;
    int ranks, n_overrides;
    char **overrides;
} plan_args;

static plan_args parse_args(int argc, char **argv) {
    plan_args a = {.ranks = 1, .overrides = argv};
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i];
        bool valued = !strcmp(opt, "--config") || !strcmp(opt, "--batch") ||
                      !strcmp(opt, "--ranks") || !strcmp(opt, "--lengths");
        if (valued) {
            WEFT_CHECK(i + 1 < argc, "plan: %s needs a value", opt);
            const char *v = argv[++i];
            if (!strcmp(opt, "--config")) a.config = v;
            else if (!strcmp(opt, "--batch")) a.batch = v;
            else if (!strcmp(opt, "--lengths")) a.lengths = v;
            else {
                char *end;
                long n = strtol(v, &end, 10);
                WEFT_CHECK(*end == '\0' && n >= 1 && n <= INT_MAX,
                           "plan: --ranks %s is not a positive rank count", v);
                a.ranks = (int)n;
            }
        } else if (opt[0] == '-') {
            weft_fatal("plan: unknown option \"%s\"; see weft --help", opt);
        } else {
            a.overrides[a.n_overrides++] = argv[i];
        }
    }
    WEFT_CHECK(!(a.batch && a.lengths), "plan: give --batch or --lengths, not both");
    return a;
}

// Bytes that cross the network per exchanged key/value row: keys and values of every layer (MTP
// layers included), gathered forward and reduce-scattered backward, fp32.
static double bytes_per_row(const weft_job_config *cfg) {
    weft_model_config mc;
    weft_train_model_config(cfg, 0, &mc);
    return 2.0 * 2.0 * mc.num_kv_heads * mc.head_dim * sizeof(float) * (mc.num_layers + mc.num_mtp);
}

static const char *mode_name(int mode) {
    return mode == WEFT_DCP_HETEROGENEOUS ? "heterogeneous" : "uniform";
}

// ------------------------------------------------------------------------- one batch ----

static void print_plan(const weft_dcp_plan *p, const int *lengths) {
    for (int s = 0; s < p->n_steps; s++) {
        double most = 0, sum = 0;
        int groups = 0, lo_degree = INT_MAX, hi_degree = 0;
        for (int m = 0; m < p->n_micro; m++) {
            const weft_dcp_micro *mb = &p->micro[m];
            if (mb->step != s) continue;
            double t = mb->compute + mb->comm;
            most = fmax(most, t);
            sum += t * mb->degree;
            groups++;
            lo_degree = mb->degree < lo_degree ? mb->degree : lo_degree;
            hi_degree = mb->degree > hi_degree ? mb->degree : hi_degree;
        }
        char degree[32];
        if (lo_degree == hi_degree) snprintf(degree, sizeof degree, "degree %d", lo_degree);
        else snprintf(degree, sizeof degree, "degrees %d to %d", lo_degree, hi_degree);
        printf("micro-batch %d: %s, %d group%s, estimated time per rank max %.4g\n", s + 1, degree,
               groups, groups == 1 ? "" : "s", most);
        for (int m = 0; m < p->n_micro; m++) {
            const weft_dcp_micro *mb = &p->micro[m];
            if (mb->step != s) continue;
            printf("  ranks %d-%d (degree %d): rows/rank %d of %d, time/rank %.4g (exchange %.3g), "
                   "documents", mb->first_rank, mb->first_rank + mb->degree - 1, mb->degree,
                   mb->rows, p->limit, mb->compute + mb->comm, mb->comm);
            for (int k = p->offsets[m]; k < p->offsets[m + 1]; k++)
                printf(" %d(%d)", p->docs[k] + 1, lengths[p->docs[k]]);
            printf("\n");
        }
    }
}

static void print_estimate(const weft_dcp_plan *p, const int *lengths, const weft_cost_model *cm,
                           double row_bytes) {
    double *compute = weft_alloc(sizeof(double) * p->world);
    weft_dcp_estimate e = weft_dcp_simulate(p, lengths, cm, compute);
    printf("estimate: critical path %.4g = %.3fx the lower bound %.4g; busy per rank max %.4g mean "
           "%.4g (imbalance %.3f); CP exchange %.4g bytes\n", e.critical_path,
           e.lower_bound > 0 ? e.critical_path / e.lower_bound : 1.0, e.lower_bound, e.max_busy,
           e.mean_busy, e.mean_busy > 0 ? e.max_busy / e.mean_busy - 1 : 0.0,
           e.exchanged_rows * row_bytes);
    printf("estimate: compute per rank");
    for (int r = 0; r < p->world; r++) printf(" %.6g", compute[r]);
    printf("\n");
    weft_free(compute);
}

static void plan_batch(const plan_args *a, const weft_job_config *cfg) {
    WEFT_CHECK(cfg->parallel.dynamic_context_parallel,
               "plan: shows dynamic context-parallel plans; add parallel.dynamic_context_parallel=true");
    weft_tokenizer *tok = NULL;
    weft_document_set *set = a->batch ? weft_read_token_jsonl(a->batch, INT_MAX)
                                      : weft_train_load_data(cfg, a->ranks, &tok);
    int n = a->batch ? set->n : cfg->train.global_batch_size;
    weft_document *docs = weft_alloc(sizeof(weft_document) * (n > 0 ? n : 1));
    if (a->batch) memcpy(docs, set->docs, sizeof(weft_document) * n);
    else weft_train_first_batch(cfg, set, docs);
    int *lengths = weft_alloc(sizeof(int) * (n > 0 ? n : 1));
    long tokens = 0;
    for (int i = 0; i < n; i++) tokens += lengths[i] = docs[i].len;

    weft_cost_model cm = weft_dcp_cost_model(&cfg->parallel);
    int limit = cfg->parallel.max_seqlen_per_rank;
    double t0 = weft_now_seconds();
    weft_dcp_plan p = weft_dcp_plan_make(cfg->parallel.dcp_mode, lengths, n, a->ranks, limit, &cm);
    double ms = 1e3 * (weft_now_seconds() - t0);
    printf("plan: %d documents, %ld tokens on %d ranks, max_seqlen_per_rank %d, %s mode, cost "
           "(%g*L^2 + %g*L)/c + %g, exchange %g per row: %d micro-batches in %d step%s, planned in "
           "%.3f ms\n", n, tokens, a->ranks, limit, mode_name(cfg->parallel.dcp_mode), cm.alpha,
           cm.beta, cm.gamma, cm.delta, p.n_micro, p.n_steps, p.n_steps == 1 ? "" : "s", ms);
    print_plan(&p, lengths);
    print_estimate(&p, lengths, &cm, bytes_per_row(cfg));

    weft_dcp_plan_free(&p);
    weft_free(lengths);
    weft_free(docs);
    weft_document_set_free(set);
    if (tok) weft_tokenizer_free(tok);
}

// ---------------------------------------------------------------------- a length trace ----

static int *read_lengths(const char *path, int *n) {
    FILE *f = fopen(path, "r");
    WEFT_CHECK(f, "%s: cannot open the length trace (%s)", path, strerror(errno));
    int cap = 1024, *v = weft_alloc(sizeof(int) * cap);
    char *line = NULL;
    size_t line_cap = 0;
    long lineno = 0;
    *n = 0;
    while (getline(&line, &line_cap, f) != -1) {
        lineno++;
        char *p = line, *end;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\n' || *p == '\0' || *p == '#') continue; // blank lines and comments
        errno = 0;
        long len = strtol(p, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
        WEFT_CHECK(end != p && !*end && !errno && len >= 1 && len <= INT_MAX,
                   "%s:%ld: \"%.*s\" is not a document length; the trace holds one positive "
                   "integer per line", path, lineno, (int)strcspn(p, "\r\n"), p);
        if (*n == cap) {
            int *w = weft_alloc(sizeof(int) * cap * 2);
            memcpy(w, v, sizeof(int) * cap);
            weft_free(v);
            v = w, cap *= 2;
        }
        v[(*n)++] = (int)len;
    }
    free(line);
    fclose(f);
    WEFT_CHECK(*n > 0, "%s: the length trace holds no lengths", path);
    return v;
}

enum { N_LAYOUTS = 3 }; // heterogeneous DCP, uniform DCP, static CP

static void layout_name(int layout, int static_c, char *buf, size_t size) {
    if (layout == 2) snprintf(buf, size, "static cp=%d", static_c);
    else snprintf(buf, size, "%s", mode_name(layout == 0 ? WEFT_DCP_HETEROGENEOUS : WEFT_DCP_UNIFORM));
}

typedef struct layout_totals {
    double path, bound, ratio_max, imbalance_max, plan_ms_max;
    double bytes;
} layout_totals;

// Plans one global batch in a layout and prints its line; adds to the layout's totals. Returns
// the bytes it exchanges.
static double simulate_step(int layout, int static_c, const int *lengths, int n, int world,
                          int limit, const weft_cost_model *cm, double row_bytes,
                          double static_bytes, layout_totals *tot) {
    double t0 = weft_now_seconds();
    weft_dcp_plan p = layout == 2 ? weft_dcp_plan_static(lengths, n, world, static_c, limit, cm)
                                  : weft_dcp_plan_make(layout == 0 ? WEFT_DCP_HETEROGENEOUS
                                                                   : WEFT_DCP_UNIFORM,
                                                       lengths, n, world, limit, cm);
    double ms = 1e3 * (weft_now_seconds() - t0);
    weft_dcp_estimate e = weft_dcp_simulate(&p, lengths, cm, NULL);
    double ratio = e.critical_path / e.lower_bound, imbalance = e.max_busy / e.mean_busy - 1;
    double bytes = e.exchanged_rows * row_bytes;
    char name[32];
    layout_name(layout, static_c, name, sizeof name);
    printf("  %-15s critical path %.4g = %.3fx lower bound, imbalance %.3f, CP exchange %.4g "
           "bytes (%.3fx static), %d micro-batches, planned in %.2f ms\n", name, e.critical_path,
           ratio, imbalance, bytes, static_bytes > 0 ? bytes / static_bytes : 1.0, p.n_micro, ms);
    tot->path += e.critical_path;
    tot->bound += e.lower_bound;
    tot->ratio_max = fmax(tot->ratio_max, ratio);
    tot->imbalance_max = fmax(tot->imbalance_max, imbalance);
    tot->plan_ms_max = fmax(tot->plan_ms_max, ms);
    tot->bytes += bytes;
    weft_dcp_plan_free(&p);
    return bytes;
}

static void simulate_trace(const plan_args *a, const weft_job_config *cfg) {
    int n, per_step = cfg->train.global_batch_size, limit = cfg->parallel.max_seqlen_per_rank;
    int *lengths = read_lengths(a->lengths, &n);
    weft_cost_model cm = weft_dcp_cost_model(&cfg->parallel);
    double row_bytes = bytes_per_row(cfg);
    int longest = 0;
    long tokens = 0;
    for (int i = 0; i < n; i++) longest = lengths[i] > longest ? lengths[i] : longest, tokens += lengths[i];
    // Static CP keeps one degree for the whole trace: the least that fits its longest document.
    int static_c = weft_dcp_min_degree(longest, limit), steps = (n + per_step - 1) / per_step;
    WEFT_CHECK(static_c <= a->ranks,
               "%s: the longest document (%d tokens) needs more than %d ranks at "
               "parallel.max_seqlen_per_rank = %d; raise the limit or --ranks", a->lengths,
               longest, a->ranks, limit);
    printf("simulation: %s, %d documents (%ld tokens, longest %d) in %d step%s of %d on %d ranks, "
           "max_seqlen_per_rank %d, cost (%g*L^2 + %g*L)/c + %g, exchange %g per row "
           "(%.0f bytes)\n", a->lengths, n, tokens, longest, steps, steps == 1 ? "" : "s",
           per_step, a->ranks, limit, cm.alpha, cm.beta, cm.gamma, cm.delta, row_bytes);
    layout_totals tot[N_LAYOUTS] = {{0}};
    for (int s = 0; s < steps; s++) {
        int lo = s * per_step, k = n - lo < per_step ? n - lo : per_step;
        long step_tokens = 0;
        for (int i = lo; i < lo + k; i++) step_tokens += lengths[i];
        printf("step %d: %d documents, %ld tokens\n", s + 1, k, step_tokens);
        // Static first: the others' exchange is printed relative to it.
        double static_bytes = 0;
        for (int j = 0; j < N_LAYOUTS; j++) {
            int layout = (j + 2) % N_LAYOUTS;
            double bytes = simulate_step(layout, static_c, lengths + lo, k, a->ranks, limit, &cm,
                                         row_bytes, static_bytes, &tot[layout]);
            if (layout == 2) static_bytes = bytes;
        }
    }
    printf("summary over %d step%s (critical path / lower bound: of the sums, worst step; step "
           "time against heterogeneous):\n", steps, steps == 1 ? "" : "s");
    for (int layout = 0; layout < N_LAYOUTS; layout++) {
        char name[32];
        layout_name(layout, static_c, name, sizeof name);
        printf("  %-15s %.3fx (worst %.3fx), imbalance worst %.3f, step time %.3fx, CP exchange "
               "%.3fx static, planning worst %.2f ms\n", name, tot[layout].path / tot[layout].bound,
               tot[layout].ratio_max, tot[layout].imbalance_max, tot[layout].path / tot[0].path,
               tot[2].bytes > 0 ? tot[layout].bytes / tot[2].bytes : 1.0, tot[layout].plan_ms_max);
    }
    weft_free(lengths);
}

int weft_cmd_plan(int argc, char **argv) {
    plan_args a = parse_args(argc, argv);
    weft_job_config cfg = weft_job_config_default();
    if (a.config) weft_job_config_load_yaml(&cfg, a.config);
    weft_job_config_apply_overrides(&cfg, a.n_overrides, a.overrides);
    weft_job_config_validate(&cfg);
    if (a.lengths) simulate_trace(&a, &cfg);
    else plan_batch(&a, &cfg);
    return 0;
}
