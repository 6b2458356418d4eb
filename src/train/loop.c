#include "train/loop.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "train/job.h"
#include "train/stats.h"
#include "train/step.h"

// ---------------------------------------------------------------------------- observability ----

typedef struct progress {
    bool tty;
    int total, log_every;
    double started;
    FILE *metrics;
} progress;

static void report_step(progress *p, int step, const weft_step_result *r, double elapsed) {
    double tok_s = r->n_tokens / r->seconds;
    int remaining = p->total - step;
    double eta = step > 0 ? elapsed / step * remaining : 0;
    fprintf(p->metrics,
            "{\"step\": %d, \"loss\": %.17g, \"accuracy\": %.6g, \"lr\": %.6g, \"grad_norm\": %.6g, "
            "\"tokens\": %ld, \"targets\": %ld, \"tokens_per_s\": %.1f, \"step_seconds\": %.4f, "
            "\"host_waits\": %ld",
            step, r->loss, r->accuracy, r->lr, r->grad_norm, r->n_tokens, r->n_targets, tok_s,
            r->seconds, r->host_waits);
    if (r->mtp_depth > 0) {
        const char *sep = "";
        fprintf(p->metrics, ", \"mtp_loss\": [");
        for (int k = 0; k < r->mtp_depth; k++, sep = ", ") fprintf(p->metrics, "%s%.9g", sep, r->mtp_loss[k]);
        fprintf(p->metrics, "], \"mtp_accuracy\": [");
        sep = "";
        for (int k = 0; k < r->mtp_depth; k++, sep = ", ")
            fprintf(p->metrics, "%s%.6g", sep, r->mtp_accuracy[k]);
        fprintf(p->metrics, "]");
    }
    fprintf(p->metrics, "}\n");
    fflush(p->metrics);
    char line[256], mtp[64] = "";
    if (r->mtp_depth > 0) snprintf(mtp, sizeof mtp, "  mtp1 acc %.3f", r->mtp_accuracy[0]);
    snprintf(line, sizeof line,
             "step %d/%d  loss %.4f  acc %.3f%s  lr %.2e  gnorm %.3f  %.0f tok/s  eta %.0fs", step,
             p->total, r->loss, r->accuracy, mtp, r->lr, r->grad_norm, tok_s, eta);
    if (p->tty) {
        int width = 24, done = (int)((double)step / p->total * width);
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
        bar[width] = '\0';
        printf("\r[%s] %s\033[K", bar, line);
        if (step == p->total) printf("\n");
        fflush(stdout);
    } else if (step == 1 || step % p->log_every == 0 || step == p->total) {
        printf("%s\n", line);
        fflush(stdout);
    }
}

bool weft_run_is_finished(const weft_job_config *cfg, int step, bool print) {
    if (step < cfg->train.steps) return false;
    if (print)
        printf("the run in %s is already at step %d of %d: nothing to do; raise train.steps to "
               "continue it\n", cfg->train.output_dir, step, cfg->train.steps);
    return true;
}

FILE *weft_metrics_open(const char *path, int step) {
    if (step > 0) {
        size_t n;
        char *old = weft_read_file(path, &n);
        size_t keep = 0;
        for (char *line = old; old && line < old + n;) {
            char *end = strchr(line, '\n');
            if (!end) break;
            int s = 0;
            if (sscanf(line, "{\"step\": %d", &s) != 1 || s > step) break;
            keep = (size_t)(end + 1 - old);
            line = end + 1;
        }
        WEFT_CHECK(weft_write_file_atomic(path, old ? old : "", keep), "%s: cannot rewrite", path);
        weft_free(old);
    }
    FILE *f = fopen(path, step > 0 ? "a" : "w");
    WEFT_CHECK(f, "%s: cannot open for writing (%s)", path, strerror(errno));
    return f;
}

// The run's statistics (--stats): where it started and ended, its losses and time, memory,
// collectives and host waits. Collective: every rank enters.
static void save_stats(const char *path, weft_trainer *t, const weft_train_state *start,
                       const char *resumed_from, int last_step, double first_loss,
                       double last_loss, double seconds) {
    weft_memory_report mem = weft_trainer_memory(t);
    weft_comm_stats cs = weft_comm_get_stats(t->world); // before the memory report's collective
    json_t *root = json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:I}", "resumed_from_step",
                             start->step, "first_step", start->step + 1, "last_step", last_step,
                             "first_loss", first_loss, "last_loss", last_loss, "seconds", seconds,
                             "host_waits", (json_int_t)t->model->be->host_waits);
    json_object_set_new(root, "resumed_from", resumed_from ? json_string(resumed_from) : json_null());
    json_object_set_new(root, "collectives", weft_stats_of_collectives(&cs, weft_comm_size(t->world)));
    json_object_set_new(root, "memory", weft_stats_of_memory(&mem, t->world));
    weft_stats_save(root, weft_comm_rank(t->world) == 0 ? path : NULL);
}

// The optimizer steps from state->step to train.steps, with progress, metrics and checkpoints.
static void train_steps(const weft_job_config *cfg, weft_trainer *t, const weft_document_set *data,
                        weft_train_state *state, const char *resumed_from,
                        const char *stats_path) {
    bool writer = weft_comm_rank(t->world) == 0; // compute on every rank, print and write on one
    char path[WEFT_PATH_MAX + 64];
    const char *run_dir = cfg->train.output_dir;
    weft_train_state start = *state;
    weft_data_order order;
    weft_data_order_start(&order, data->n, state->seed, state->epoch, state->cursor);
    weft_document *batch = weft_alloc(sizeof(weft_document) * cfg->train.global_batch_size);
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    progress prog = {.tty = isatty(STDOUT_FILENO), .total = cfg->train.steps,
                     .log_every = cfg->train.log_every > 0 ? cfg->train.log_every : 10,
                     .started = weft_now_seconds(),
                     .metrics = writer && state->step < cfg->train.steps
                                    ? weft_metrics_open(path, state->step) : NULL};
    double first_loss = -1, last_loss = -1;
    while (state->step < cfg->train.steps) {
        weft_data_order_next(&order, data, batch, cfg->train.global_batch_size);
        state->epoch = order.epoch, state->cursor = order.cursor;
        weft_step_result r = weft_trainer_step(t, batch, cfg->train.global_batch_size);
        state->step++;
        if (first_loss < 0) first_loss = r.loss;
        last_loss = r.loss;
        if (writer) report_step(&prog, state->step, &r, weft_now_seconds() - prog.started);
        bool save = (cfg->train.save_every > 0 && state->step % cfg->train.save_every == 0) ||
                    state->step == cfg->train.steps;
        if (save) weft_free(weft_checkpoint_save(run_dir, t, state));
    }
    if (prog.metrics) fclose(prog.metrics);
    double seconds = weft_now_seconds() - prog.started;
    weft_memory_report mem = weft_trainer_memory(t);
    if (writer && first_loss >= 0) weft_print_memory_report(&mem);
    if (first_loss >= 0 && writer)
        printf("done: steps %d-%d in %.1f s, loss %.4f -> %.4f; checkpoints and metrics.jsonl in %s\n",
               start.step + 1, cfg->train.steps, seconds, first_loss, last_loss, run_dir);
    save_stats(stats_path, t, &start, resumed_from, state->step, first_loss, last_loss, seconds);
    weft_free(batch);
    weft_data_order_free(&order);
}

int weft_train_run(const weft_job_config *cfg, weft_session *session, const char *stats_path) {
    weft_job_config_validate(cfg);
    weft_comm *world = weft_session_world(session);
    const char *run_dir = cfg->train.output_dir;
    char path[WEFT_PATH_MAX + 64];

    weft_tokenizer *tok;
    weft_document_set *data = weft_job_load_data(cfg, weft_comm_size(world), &tok);
    weft_backend *be = weft_job_backend(cfg, world);
    weft_model *m = weft_job_build_model(be, world, cfg, weft_job_vocab_size(cfg, tok), false);
    WEFT_CHECK(cfg->train.global_batch_size <= data->n, "train.global_batch_size=%d is more than "
               "the %d documents of data.source=%s: a batch would hold documents twice; lower it "
               "or give more documents", cfg->train.global_batch_size, data->n, cfg->data.source);
    weft_trainer *t = weft_trainer_create(m, world, cfg, true);
    // Created only once every input has been read and checked: a bad one leaves nothing behind.
    WEFT_CHECK(weft_mkdirs(run_dir) && access(run_dir, W_OK) == 0,
               "train.output_dir=%s: cannot create or write there (%s)", run_dir, strerror(errno));
    bool writer = weft_session_writer(session);

    weft_train_state state = {.seed = (uint64_t)cfg->train.seed};
    char *ckpt = NULL;
    if (cfg->resume[0]) {
        ckpt = weft_checkpoint_find(cfg->resume);
        state = weft_checkpoint_load(ckpt, t);
        if (writer) printf("resumed from %s at step %d\n", ckpt, state.step);
    }
    bool finished = weft_run_is_finished(cfg, state.step, writer);
    snprintf(path, sizeof path, "%s/config.yaml", run_dir);
    if (writer && !finished) weft_job_config_save_yaml(cfg, path);

    long total_tokens = 0;
    for (int i = 0; i < data->n; i++) total_tokens += data->docs[i].len;
    char tokenizer[WEFT_PATH_MAX + 128];
    weft_tokenizer_describe(tok, tokenizer, sizeof tokenizer);
    if (writer && !finished)
        printf("tokenizer: %s\nweft train: %d documents (%ld tokens), model %zu parameters (%d "
               "layers, hidden %d, vocab %d), %d steps of %d documents, %d data-parallel x %d "
               "context-parallel ranks x %d threads; an epoch is %d batches (%d documents wait "
               "for the next epoch's shuffle)\n",
               tokenizer, data->n, total_tokens, m->n_elements, m->cfg.num_layers,
               m->cfg.hidden_size, m->cfg.vocab_size, cfg->train.steps,
               cfg->train.global_batch_size, weft_cp_dp_size(t->cp), weft_cp_size(t->cp),
               weft_num_threads(), data->n / cfg->train.global_batch_size,
               data->n % cfg->train.global_batch_size);
    train_steps(cfg, t, data, &state, ckpt, stats_path);
    weft_free(ckpt);

    weft_trainer_free(t);
    weft_model_free(m);
    weft_backend_destroy(be);
    weft_document_set_free(data);
    weft_tokenizer_free(tok);
    return 0;
}
