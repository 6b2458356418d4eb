// `weft plan`: the planner without a model or MPI, running the same code every training rank runs.
//  - A batch (the job's first, or --batch FILE.jsonl): its micro-batches step by step, each
//    group's ranks, degree, rows per rank and documents, and the plan's estimated critical path,
//    in the job's layout (data parallelism, static CP or DCP).
//  - A length trace (--lengths FILE, one length per line), cut into global batches of
//    train.global_batch_size documents: per step, heterogeneous DCP, uniform DCP and static CP
//    side by side: critical path over the perfect-balance lower bound, imbalance, key/value bytes
//    exchanged, and planning time.
// --stats FILE.json writes every plan and figure as JSON.
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "data/trace.h"
#include "parallel/planner.h"
#include "train/job.h"
#include "train/stats.h"

// Bytes that cross the network per exchanged key/value row: keys and values of every layer (MTP
// layers included), gathered forward and reduce-scattered backward, fp32.
static double bytes_per_row(const weft_job_config *cfg) {
    weft_model_config mc;
    weft_job_model_config(cfg, 1, &mc);
    return 2.0 * 2.0 * mc.num_kv_heads * mc.head_dim * sizeof(float) * (mc.num_layers + mc.num_mtp);
}

static void layout_name(const weft_plan_layout *l, char *buf, size_t size) {
    if (!l->dynamic) snprintf(buf, size, "static cp=%d", l->cp_size);
    else snprintf(buf, size, "%s", l->mode == WEFT_DCP_HETEROGENEOUS ? "heterogeneous" : "uniform");
}

// The plan's micro-batches as JSON: step, ranks, degree, rows, estimated times, documents.
static json_t *plan_json(const weft_plan *p) {
    json_t *list = json_array();
    for (int m = 0; m < p->n_micro; m++) {
        const weft_plan_micro *mb = &p->micro[m];
        json_t *docs = json_array();
        for (int k = p->offsets[m]; k < p->offsets[m + 1]; k++)
            json_array_append_new(docs, json_integer(p->docs[k]));
        json_array_append_new(list, json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:o}", "step",
                                              mb->step, "first_rank", mb->first_rank, "degree",
                                              mb->degree, "rows", mb->rows, "compute", mb->compute,
                                              "comm", mb->comm, "documents", docs));
    }
    return list;
}

static json_t *cost_json(const weft_cost_model *cm) {
    return json_pack("{s:f, s:f, s:f, s:f, s:f}", "alpha", cm->alpha, "beta", cm->beta, "gamma",
                     cm->gamma, "delta", cm->delta, "epsilon", cm->epsilon);
}

static json_t *estimate_json(const weft_plan_estimate *e, double row_bytes) {
    return json_pack("{s:f, s:f, s:f, s:f, s:f}", "critical_path", e->critical_path,
                     "lower_bound", e->lower_bound, "max_busy", e->max_busy, "mean_busy",
                     e->mean_busy, "exchange_bytes", e->exchanged_rows * row_bytes);
}

// ------------------------------------------------------------------------- one batch ----

static void print_plan(const weft_plan *p, const int *lengths) {
    for (int s = 0; s < p->n_steps; s++) {
        double most = 0;
        int groups = 0, lo_degree = INT_MAX, hi_degree = 0;
        for (int m = 0; m < p->n_micro; m++) {
            const weft_plan_micro *mb = &p->micro[m];
            if (mb->step != s) continue;
            most = fmax(most, mb->compute + mb->comm);
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
            const weft_plan_micro *mb = &p->micro[m];
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

static void plan_batch(const char *batch, int ranks, const weft_job_config *cfg,
                       const char *stats) {
    weft_tokenizer *tok = NULL;
    weft_document_set *set = batch ? weft_read_token_jsonl(batch, INT_MAX)
                                   : weft_job_load_data(cfg, ranks, &tok);
    int n = batch ? set->n : cfg->train.global_batch_size;
    weft_document *docs = weft_alloc(sizeof(weft_document) * (n > 0 ? n : 1));
    if (batch) memcpy(docs, set->docs, sizeof(weft_document) * n);
    else weft_job_first_batch(cfg, set, docs);
    int *lengths = weft_alloc(sizeof(int) * (n > 0 ? n : 1));
    long tokens = 0;
    for (int i = 0; i < n; i++) tokens += lengths[i] = docs[i].len;

    weft_plan_layout l = weft_plan_layout_of(&cfg->parallel, ranks,
                                             cfg->train.max_tokens_per_microbatch,
                                             cfg->train.micro_batches);
    char name[32];
    layout_name(&l, name, sizeof name);
    double t0 = weft_now_seconds();
    weft_plan p = weft_plan_make(&l, lengths, n);
    double ms = 1e3 * (weft_now_seconds() - t0);
    printf("plan: %d documents, %ld tokens on %d ranks, %s, %s, cost (%g*L^2 + %g*L)/c + %g, "
           "exchange %g per row: %d micro-batches in %d step%s, planned in %.3f ms\n", n, tokens,
           ranks, name, l.why, l.cost.alpha, l.cost.beta, l.cost.gamma, l.cost.delta, p.n_micro,
           p.n_steps, p.n_steps == 1 ? "" : "s", ms);
    print_plan(&p, lengths);
    double *compute = weft_alloc(sizeof(double) * ranks), row_bytes = bytes_per_row(cfg);
    weft_plan_estimate e = weft_plan_simulate(&p, lengths, &l.cost, compute);
    printf("estimate: critical path %.4g = %.3fx the lower bound %.4g; busy per rank max %.4g mean "
           "%.4g (imbalance %.3f); CP exchange %.4g bytes\n", e.critical_path,
           e.lower_bound > 0 ? e.critical_path / e.lower_bound : 1.0, e.lower_bound, e.max_busy,
           e.mean_busy, e.mean_busy > 0 ? e.max_busy / e.mean_busy - 1 : 0.0,
           e.exchanged_rows * row_bytes);
    json_t *rank_compute = json_array();
    for (int r = 0; r < ranks; r++) json_array_append_new(rank_compute, json_real(compute[r]));
    weft_stats_save(json_pack("{s:i, s:s, s:i, s:o, s:o, s:o, s:o}", "ranks", ranks, "layout",
                              name, "limit", p.limit, "cost", cost_json(&l.cost), "micro_batches",
                              plan_json(&p), "estimate", estimate_json(&e, row_bytes),
                              "rank_compute", rank_compute),
                    stats);
    weft_plan_free(&p);
    weft_free(compute), weft_free(lengths), weft_free(docs);
    weft_document_set_free(set);
    if (tok) weft_tokenizer_free(tok);
}

// ---------------------------------------------------------------------- a length trace ----

enum { N_LAYOUTS = 3 }; // heterogeneous DCP, uniform DCP, static CP

typedef struct layout_totals {
    double path, bound, ratio_max, imbalance_max, plan_ms_max, bytes;
} layout_totals;

// Plans one global batch in a layout, prints its line and adds to the layout's totals; returns
// the step's JSON for the layout.
static json_t *simulate_step(const weft_plan_layout *l, const int *lengths, int n, double row_bytes,
                             double static_bytes, layout_totals *tot) {
    double t0 = weft_now_seconds();
    weft_plan p = weft_plan_make(l, lengths, n);
    double ms = 1e3 * (weft_now_seconds() - t0);
    weft_plan_estimate e = weft_plan_simulate(&p, lengths, &l->cost, NULL);
    double ratio = e.critical_path / e.lower_bound, imbalance = e.max_busy / e.mean_busy - 1;
    double bytes = e.exchanged_rows * row_bytes;
    char name[32];
    layout_name(l, name, sizeof name);
    printf("  %-15s critical path %.4g = %.3fx lower bound, imbalance %.3f, CP exchange %.4g "
           "bytes (%.3fx static), %d micro-batches, planned in %.2f ms\n", name, e.critical_path,
           ratio, imbalance, bytes, static_bytes > 0 ? bytes / static_bytes : 1.0, p.n_micro, ms);
    tot->path += e.critical_path;
    tot->bound += e.lower_bound;
    tot->ratio_max = fmax(tot->ratio_max, ratio);
    tot->imbalance_max = fmax(tot->imbalance_max, imbalance);
    tot->plan_ms_max = fmax(tot->plan_ms_max, ms);
    tot->bytes += bytes;
    json_t *j = estimate_json(&e, row_bytes);
    json_object_set_new(j, "plan_ms", json_real(ms));
    json_object_set_new(j, "micro_batches", plan_json(&p));
    weft_plan_free(&p);
    return j;
}

static void simulate_trace(const char *trace, int ranks, const weft_job_config *cfg,
                           const char *stats) {
    int n, per_step = cfg->train.global_batch_size, limit = cfg->parallel.max_seqlen_per_rank;
    int *lengths = weft_read_length_trace(trace, &n);
    double row_bytes = bytes_per_row(cfg);
    int longest = 0;
    long tokens = 0;
    for (int i = 0; i < n; i++) longest = lengths[i] > longest ? lengths[i] : longest, tokens += lengths[i];
    // Static CP keeps one degree for the whole trace: the least that fits its longest document.
    int static_c = weft_plan_min_degree(longest, limit), steps = (n + per_step - 1) / per_step;
    WEFT_CHECK(static_c <= ranks,
               "%s: the longest document (%d tokens) needs more than %d ranks at "
               "parallel.max_seqlen_per_rank = %d; raise the limit or --ranks", trace, longest,
               ranks, limit);
    weft_plan_layout layouts[N_LAYOUTS]; // heterogeneous, uniform, static: the training planner's
    for (int j = 0; j < N_LAYOUTS; j++) {
        weft_parallel_config pc = cfg->parallel;
        pc.dynamic_context_parallel = j < 2;
        pc.dcp_mode = j == 0 ? WEFT_DCP_HETEROGENEOUS : WEFT_DCP_UNIFORM;
        pc.context_parallel_size = static_c;
        layouts[j] = weft_plan_layout_of(&pc, ranks, limit, 1);
    }
    weft_cost_model cm = layouts[0].cost;
    printf("simulation: %s, %d documents (%ld tokens, longest %d) in %d step%s of %d on %d ranks, "
           "max_seqlen_per_rank %d, cost (%g*L^2 + %g*L)/c + %g, exchange %g per row "
           "(%.0f bytes)\n", trace, n, tokens, longest, steps, steps == 1 ? "" : "s", per_step,
           ranks, limit, cm.alpha, cm.beta, cm.gamma, cm.delta, row_bytes);
    layout_totals tot[N_LAYOUTS] = {{0}};
    json_t *steps_json = json_array();
    for (int s = 0; s < steps; s++) {
        int lo = s * per_step, k = n - lo < per_step ? n - lo : per_step;
        long step_tokens = 0;
        for (int i = lo; i < lo + k; i++) step_tokens += lengths[i];
        printf("step %d: %d documents, %ld tokens\n", s + 1, k, step_tokens);
        json_t *js = json_pack("{s:i, s:I}", "documents", k, "tokens", (json_int_t)step_tokens);
        double static_bytes = 0;
        for (int j = 0; j < N_LAYOUTS; j++) { // static first: the others' exchange is relative
            int layout = (j + 2) % N_LAYOUTS;
            char name[32];
            layout_name(&layouts[layout], name, sizeof name);
            json_t *lj = simulate_step(&layouts[layout], lengths + lo, k, row_bytes, static_bytes,
                                       &tot[layout]);
            if (layout == 2) static_bytes = json_real_value(json_object_get(lj, "exchange_bytes"));
            json_object_set_new(js, layout == 2 ? "static" : name, lj);
        }
        json_array_append_new(steps_json, js);
    }
    printf("summary over %d step%s (critical path / lower bound: of the sums, worst step; step "
           "time against heterogeneous):\n", steps, steps == 1 ? "" : "s");
    json_t *summary = json_object();
    for (int j = 0; j < N_LAYOUTS; j++) {
        char name[32];
        layout_name(&layouts[j], name, sizeof name);
        double ratio = tot[j].path / tot[j].bound, time = tot[j].path / tot[0].path;
        double bytes = tot[2].bytes > 0 ? tot[j].bytes / tot[2].bytes : 1.0;
        printf("  %-15s %.3fx (worst %.3fx), imbalance worst %.3f, step time %.3fx, CP exchange "
               "%.3fx static, planning worst %.2f ms\n", name, ratio, tot[j].ratio_max,
               tot[j].imbalance_max, time, bytes, tot[j].plan_ms_max);
        json_object_set_new(summary, j == 2 ? "static" : name, json_pack(
            "{s:f, s:f, s:f, s:f, s:f, s:f}", "ratio", ratio, "ratio_worst", tot[j].ratio_max,
            "imbalance_worst", tot[j].imbalance_max, "step_time", time, "exchange", bytes,
            "plan_ms_worst", tot[j].plan_ms_max));
    }
    weft_stats_save(json_pack("{s:i, s:i, s:o, s:o, s:o}", "ranks", ranks, "static_cp_size",
                              static_c, "cost", cost_json(&cm), "steps", steps_json, "summary",
                              summary), stats);
    weft_free(lengths);
}

int weft_cmd_plan(int argc, char **argv) {
    const char *batch = NULL, *trace = NULL, *ranks_text = NULL;
    const weft_cli_option opts[] = {{"--batch", &batch, NULL}, {"--lengths", &trace, NULL},
                                    {"--ranks", &ranks_text, NULL}, {NULL, NULL, NULL}};
    weft_cli_args a = weft_cli_parse("plan", argc, argv, opts, NULL);
    WEFT_CHECK(!(batch && trace), "plan: give --batch or --lengths, not both");
    int ranks = 1;
    if (ranks_text) {
        char *end;
        long v = strtol(ranks_text, &end, 10);
        WEFT_CHECK(*end == '\0' && v >= 1 && v <= INT_MAX,
                   "plan: --ranks %s is not a positive rank count", ranks_text);
        ranks = (int)v;
    }
    weft_job_config cfg = weft_job_config_default();
    weft_job_config_resolve(&cfg, a.config, a.n_settings, a.settings);
    if (trace) simulate_trace(trace, ranks, &cfg, a.stats);
    else plan_batch(batch, ranks, &cfg, a.stats);
    return 0;
}
