// `weft calibrate`, run the way training will run (mpirun -np W, the same threads per rank): times
// forward-backward micro-batches of the job's model on every rank at once, at CP degree 1 over a
// range of lengths and packings and at each degree up to W, fits the planner's cost model
// (parallel.cost_alpha, _beta, _gamma, _delta, _epsilon) and prints it with its fit error; --out
// writes it as YAML settings, --stats the timings and the fit as JSON.
#include "train/calibrate.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/cost_fit.h"
#include "train/job.h"
#include "train/stats.h"
#include "train/step.h"

enum { MAX_PROBES = 64, MIN_LEN = 16, MAX_PACKED = 32 };

// What gets timed: at degree 1, one document and a micro-batch packed full of each length from
// the limit down (halving); at every degree c > 1, a document whose c-way split fills the limit,
// as a training micro-batch at that degree does. Returns how many.
static int choose_probes(int limit, int world, weft_cost_sample *p) {
    int n = 0;
    for (int len = limit; len >= MIN_LEN && n < MAX_PROBES / 2; len /= 2) {
        p[n++] = (weft_cost_sample){.len = len, .n_docs = 1, .degree = 1};
        int packed = limit / len < MAX_PACKED ? limit / len : MAX_PACKED;
        if (packed > 1) p[n++] = (weft_cost_sample){.len = len, .n_docs = packed, .degree = 1};
    }
    for (int c = 2; c <= world && n < MAX_PROBES; c *= 2)
        p[n++] = (weft_cost_sample){.len = weft_cp_max_len(limit, c), .n_docs = 1, .degree = c};
    return n;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Times the probe on every rank at once: each of the W/c groups of c ranks runs n_docs random
// documents of len tokens in one micro-batch. Fills the probe's compute and comm with the
// per-rank medians over the repeats, averaged over ranks.
static void measure(weft_trainer *t, weft_cost_sample *p, int repeats, int vocab, uint64_t seed) {
    int W = weft_comm_size(t->world), n = W / p->degree * p->n_docs;
    weft_document *docs = weft_alloc(sizeof(weft_document) * n);
    weft_rng rng;
    weft_rng_seed(&rng, seed); // the same batch on every rank
    for (int i = 0; i < n; i++) {
        docs[i] = (weft_document){.tokens = weft_alloc(sizeof(int32_t) * p->len), .len = p->len};
        for (int j = 0; j < p->len; j++) docs[i].tokens[j] = (int32_t)(weft_rng_next(&rng) % vocab);
    }
    // The limit that makes the planner give each group exactly this micro-batch at this degree.
    weft_trainer_set_row_limit(t, weft_cp_rows(p->len, p->degree) * p->n_docs);
    double *busy = weft_alloc(sizeof(double) * repeats), *comm = weft_alloc(sizeof(double) * repeats);
    for (int r = -1; r < repeats; r++) { // one untimed warm-up
        weft_step_result res = weft_trainer_gradients(t, docs, n, NULL);
        WEFT_CHECK(t->last.n_micro == 1 && t->last.degree[0] == p->degree,
                   "internal: calibrate planned %d micro-batches at degree %d for degree %d",
                   t->last.n_micro, t->last.n_micro > 0 ? t->last.degree[0] : 0, p->degree);
        if (r < 0) continue;
        busy[r] = t->micro_busy[0];
        comm[r] = res.cp_comm_seconds;
    }
    double mine[2] = {median(busy, repeats), median(comm, repeats)};
    weft_comm_allreduce_sum(t->world, mine, 2, WEFT_COMM_F64);
    p->compute = mine[0] / W;
    p->comm = mine[1] / W;
    for (int i = 0; i < n; i++) weft_free(docs[i].tokens);
    weft_free(docs), weft_free(busy), weft_free(comm);
}

static void print_fit(const weft_cost_sample *s, int n, const weft_cost_model *cm,
                      const weft_cost_fit_error *e) {
    printf("calibrate: %-34s %12s %12s %8s %12s %12s %8s\n", "micro-batch", "compute s",
           "predicted", "error", "exchange s", "predicted", "error");
    for (int i = 0; i < n; i++) {
        double c = weft_cost_sample_compute(cm, &s[i]);
        double x = weft_cost_comm(cm, s[i].len, s[i].degree) * s[i].n_docs;
        char what[64];
        snprintf(what, sizeof what, "%d x %d tokens at degree %d", s[i].n_docs, s[i].len,
                 s[i].degree);
        printf("calibrate: %-34s %12.6f %12.6f %7.1f%%", what, s[i].compute, c,
               100 * (c - s[i].compute) / s[i].compute);
        if (s[i].degree > 1 && s[i].comm > 0)
            printf(" %12.6f %12.6f %7.1f%%", s[i].comm, x, 100 * (x - s[i].comm) / s[i].comm);
        printf("\n");
    }
    printf("fit: parallel.cost_alpha=%.6g parallel.cost_beta=%.6g parallel.cost_gamma=%.6g "
           "parallel.cost_delta=%.6g parallel.cost_epsilon=%.6g\n", cm->alpha, cm->beta,
           cm->gamma, cm->delta, cm->epsilon);
    printf("fit error: compute RMS %.1f%%, max %.1f%%; exchange RMS %.1f%%, max %.1f%%\n",
           100 * e->compute_rms, 100 * e->compute_max, 100 * e->comm_rms, 100 * e->comm_max);
}

static void save_fit(const char *path, const weft_cost_model *cm, const weft_cost_fit_error *e,
                     int world) {
    char text[1024];
    int len = snprintf(text, sizeof text,
                       "# weft calibrate on %d rank%s x %d thread%s: compute fit error RMS %.1f%%, "
                       "exchange %.1f%%\nparallel.cost_alpha: %.9g\nparallel.cost_beta: %.9g\n"
                       "parallel.cost_gamma: %.9g\nparallel.cost_delta: %.9g\n"
                       "parallel.cost_epsilon: %.9g\n", world,
                       world == 1 ? "" : "s", weft_num_threads(), weft_num_threads() == 1 ? "" : "s",
                       100 * e->compute_rms, 100 * e->comm_rms, cm->alpha, cm->beta, cm->gamma,
                       cm->delta, cm->epsilon);
    WEFT_CHECK(weft_write_file_atomic(path, text, (size_t)len), "%s: cannot write the fitted cost "
               "model (%s)", path, strerror(errno));
}

static json_t *fit_stats(const weft_cost_sample *s, int n, const weft_cost_model *cm,
                         const weft_cost_fit_error *e, int world) {
    json_t *probes = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(probes, json_pack(
            "{s:i, s:i, s:i, s:f, s:f, s:f, s:f}", "len", s[i].len, "n_docs", s[i].n_docs,
            "degree", s[i].degree, "compute", s[i].compute, "comm", s[i].comm,
            "predicted_compute", weft_cost_sample_compute(cm, &s[i]), "predicted_comm",
            weft_cost_comm(cm, s[i].len, s[i].degree) * s[i].n_docs));
    return json_pack("{s:i, s:i, s:o, s:{s:f, s:f, s:f, s:f, s:f}, s:{s:f, s:f, s:f, s:f}}",
                     "ranks", world, "threads", weft_num_threads(), "probes", probes, "fit",
                     "alpha", cm->alpha, "beta", cm->beta, "gamma", cm->gamma, "delta", cm->delta,
                     "epsilon", cm->epsilon, "error", "compute_rms", e->compute_rms,
                     "compute_max", e->compute_max, "comm_rms", e->comm_rms, "comm_max",
                     e->comm_max);
}

weft_job_config weft_calibrate_settings(weft_job_config cfg) {
    cfg.parallel.dynamic_context_parallel = true; // groups of every degree
    cfg.parallel.context_parallel_size = 1;
    cfg.parallel.dcp_mode = WEFT_DCP_UNIFORM;
    return cfg;
}

int weft_calibrate_run(const weft_calibrate_request *rq, weft_session *session) {
    const weft_job_config *cfg = &rq->cfg;
    weft_job_config_validate(cfg);
    weft_comm *world = weft_session_world(session);
    int W = weft_comm_size(world), limit = cfg->parallel.max_seqlen_per_rank;
    bool writer = weft_session_writer(session);
    weft_tokenizer *tok = weft_job_tokenizer(cfg);
    int vocab = weft_job_vocab_size(cfg, tok);
    weft_backend *be = weft_job_backend(cfg, world);
    weft_model *m = weft_job_build_model(be, world, cfg, vocab, false);
    weft_trainer *t = weft_trainer_create(m, world, cfg, false);

    weft_cost_sample s[MAX_PROBES];
    int n = choose_probes(limit, W, s);
    if (writer)
        printf("calibrate: %d micro-batches on %d rank%s x %d thread%s, max_seqlen_per_rank %d, "
               "median of %d\n", n, W, W == 1 ? "" : "s", weft_num_threads(),
               weft_num_threads() == 1 ? "" : "s", limit, rq->repeats);
    for (int i = 0; i < n; i++) {
        measure(t, &s[i], rq->repeats, vocab, (uint64_t)cfg->train.seed + (uint64_t)i);
        if (writer) {
            printf("calibrate: [%d/%d] %d x %d tokens at degree %d: compute %.6f s, exchange %.6f s\n",
                   i + 1, n, s[i].n_docs, s[i].len, s[i].degree, s[i].compute, s[i].comm);
            fflush(stdout);
        }
    }
    weft_cost_fit_error e;
    weft_cost_model cm = weft_cost_fit(s, n, &e);
    if (writer) {
        print_fit(s, n, &cm, &e);
        if (rq->out) save_fit(rq->out, &cm, &e, W);
        if (rq->out) printf("wrote %s\n", rq->out);
        weft_stats_save(fit_stats(s, n, &cm, &e, W), rq->stats);
    }
    weft_trainer_free(t);
    weft_model_free(m);
    weft_backend_destroy(be);
    weft_tokenizer_free(tok);
    return 0;
}
