#include "train/loop.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/microbatch.h"
#include "train/checkpoint.h"
#include "train/step.h"

// --------------------------------------------------------------------------------- data order ----

// Documents are visited in a fresh permutation each epoch, a pure function of (seed, epoch), so a
// resumed run needs only (epoch, cursor) to continue the same order.
typedef struct data_order {
    int n;
    int *perm;
    weft_train_state *state;
} data_order;

static void shuffle_epoch(data_order *o) {
    weft_rng rng;
    weft_rng_seed(&rng, o->state->seed * 1000003ULL + (uint64_t)o->state->epoch);
    for (int i = 0; i < o->n; i++) o->perm[i] = i;
    for (int i = o->n - 1; i > 0; i--) {
        int j = (int)(weft_rng_next(&rng) % (uint64_t)(i + 1)), t = o->perm[i];
        o->perm[i] = o->perm[j], o->perm[j] = t;
    }
}

// The next global batch: batch_size documents, continuing into the next epoch when one ends.
static void next_batch(data_order *o, const weft_document_set *set, weft_document *out,
                       int batch_size) {
    for (int k = 0; k < batch_size; k++) {
        if (o->state->cursor >= o->n) {
            o->state->epoch++;
            o->state->cursor = 0;
            shuffle_epoch(o);
        }
        out[k] = set->docs[o->perm[o->state->cursor++]];
    }
}

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
            "\"tokens\": %ld, \"targets\": %ld, \"tokens_per_s\": %.1f, \"step_seconds\": %.4f",
            step, r->loss, r->accuracy, r->lr, r->grad_norm, r->n_tokens, r->n_targets, tok_s,
            r->seconds);
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

// Keeps metrics of steps up to `step` (a resumed run rewrites what came after its checkpoint).
static FILE *open_metrics(const char *path, int step) {
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

// ------------------------------------------------------------------------------------ setup ----

weft_tokenizer *weft_train_tokenizer(const weft_job_config *cfg) {
    return cfg->data.tokenizer[0] ? weft_tokenizer_load(cfg->data.tokenizer)
                                  : weft_tokenizer_byte_level();
}

weft_document_set *weft_train_load_data(const weft_job_config *cfg, int world,
                                        weft_tokenizer **tok) {
    *tok = weft_train_tokenizer(cfg);
    char why[160];
    weft_dataset_options dopt = {
        .source = cfg->data.source,
        .synthetic_documents = cfg->data.synthetic_documents,
        .seed = (uint64_t)cfg->train.seed,
        .max_len = weft_trainer_max_document_len(cfg, world, why, sizeof why),
        .max_len_why = why,
        .truncate = cfg->data.truncate,
    };
    return weft_dataset_load(&dopt, *tok);
}

void weft_train_first_batch(const weft_job_config *cfg, const weft_document_set *data,
                            weft_document *out) {
    weft_train_state state = {.seed = (uint64_t)cfg->train.seed};
    data_order order = {.n = data->n, .perm = weft_alloc(sizeof(int) * data->n), .state = &state};
    shuffle_epoch(&order);
    next_batch(&order, data, out, cfg->train.global_batch_size);
    weft_free(order.perm);
}

void weft_train_model_config(const weft_job_config *cfg, int vocab, weft_model_config *mc) {
    char path[WEFT_PATH_MAX + 32];
    if (cfg->model.path[0]) {
        snprintf(path, sizeof path, "%s/config.json", cfg->model.path);
        weft_model_config_load(path, mc);
        WEFT_CHECK(mc->vocab_size >= vocab,
                   "%s: vocab_size %d is smaller than the tokenizer's %d; use the model's tokenizer",
                   path, mc->vocab_size, vocab);
        return;
    }
    *mc = (weft_model_config){
        .vocab_size = vocab,
        .hidden_size = cfg->model.hidden_size,
        .intermediate_size = cfg->model.intermediate_size,
        .num_layers = cfg->model.num_layers,
        .num_heads = cfg->model.num_heads,
        .num_kv_heads = cfg->model.num_kv_heads,
        .head_dim = cfg->model.hidden_size / cfg->model.num_heads,
        .rope_theta = cfg->model.rope_theta,
        .rms_norm_eps = 1e-6,
        .tie_word_embeddings = cfg->model.tie_word_embeddings,
        .attention_bias = true,
        .num_mtp = cfg->model.mtp_layers,
        .mtp_loss_scale = cfg->model.mtp_loss_scale,
    };
    weft_model_config_validate(mc, "model settings");
}

weft_backend *weft_train_backend(const weft_job_config *cfg, weft_comm *world) {
    weft_backend *be = weft_backend_create(cfg->device, weft_comm_local_rank(world));
    weft_comm_use_backend(world, be);
    return be;
}

weft_model *weft_train_build_model(weft_backend *be, const weft_comm *world,
                                   const weft_job_config *cfg, int vocab) {
    weft_model_config mc;
    char path[WEFT_PATH_MAX + 32];
    weft_train_model_config(cfg, vocab, &mc);
    weft_model *m = weft_trainer_build_model(be, world, &mc);
    if (cfg->model.path[0]) {
        snprintf(path, sizeof path, "%s/model.safetensors", cfg->model.path);
        weft_model_load_safetensors(m, path);
    } else {
        weft_model_init_random(m, (uint64_t)cfg->train.seed);
    }
    return m;
}

int weft_train_run(const weft_job_config *cfg, weft_comm *world) {
    weft_job_config_validate(cfg);
    const char *run_dir = cfg->train.output_dir;
    char path[WEFT_PATH_MAX + 64];

    weft_tokenizer *tok;
    weft_document_set *data = weft_train_load_data(cfg, weft_comm_size(world), &tok);
    weft_backend *be = weft_train_backend(cfg, world);
    weft_model *m = weft_train_build_model(be, world, cfg, weft_tokenizer_vocab_size(tok));
    weft_trainer *t = weft_trainer_create(m, world, cfg, true);
    // Created only once every input has been read and checked: a bad one leaves nothing behind.
    WEFT_CHECK(weft_mkdirs(run_dir) && access(run_dir, W_OK) == 0,
               "train.output_dir=%s: cannot create or write there (%s)", run_dir, strerror(errno));
    bool writer = weft_comm_rank(world) == 0; // compute on every rank, print and write on one

    weft_train_state state = {.seed = (uint64_t)cfg->train.seed};
    if (cfg->resume[0]) {
        char *ckpt = weft_checkpoint_find(cfg->resume);
        state = weft_checkpoint_load(ckpt, t);
        if (writer) printf("resumed from %s at step %d\n", ckpt, state.step);
        weft_free(ckpt);
    }
    snprintf(path, sizeof path, "%s/config.yaml", run_dir);
    if (writer) weft_job_config_save_yaml(cfg, path);

    long total_tokens = 0;
    for (int i = 0; i < data->n; i++) total_tokens += data->docs[i].len;
    if (writer)
        printf("weft train: %d documents (%ld tokens), model %zu parameters (%d layers, hidden %d, "
               "vocab %d), %d steps of %d documents, %d data-parallel x %d context-parallel "
               "ranks x %d threads\n",
               data->n, total_tokens, m->n_elements, m->cfg.num_layers, m->cfg.hidden_size,
               m->cfg.vocab_size, cfg->train.steps, cfg->train.global_batch_size,
               weft_cp_dp_size(t->cp), weft_cp_size(t->cp), weft_num_threads());

    data_order order = {.n = data->n, .perm = weft_alloc(sizeof(int) * data->n), .state = &state};
    shuffle_epoch(&order);
    weft_document *batch = weft_alloc(sizeof(weft_document) * cfg->train.global_batch_size);
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    progress prog = {.tty = isatty(STDOUT_FILENO), .total = cfg->train.steps,
                     .log_every = cfg->train.log_every > 0 ? cfg->train.log_every : 10,
                     .started = weft_now_seconds(),
                     .metrics = writer ? open_metrics(path, state.step) : NULL};

    double first_loss = -1, last_loss = -1;
    int first_step = state.step + 1;
    while (state.step < cfg->train.steps) {
        next_batch(&order, data, batch, cfg->train.global_batch_size);
        weft_step_result r = weft_trainer_step(t, batch, cfg->train.global_batch_size);
        state.step++;
        if (first_loss < 0) first_loss = r.loss;
        last_loss = r.loss;
        if (writer) report_step(&prog, state.step, &r, weft_now_seconds() - prog.started);
        bool save = (cfg->train.save_every > 0 && state.step % cfg->train.save_every == 0) ||
                    state.step == cfg->train.steps;
        if (save) weft_free(weft_checkpoint_save(run_dir, t, &state));
    }
    if (prog.metrics) fclose(prog.metrics);
    weft_memory_report mem = weft_trainer_memory(t);
    if (writer) weft_print_memory_report(&mem);
    if (first_loss >= 0 && writer)
        printf("done: steps %d-%d in %.1f s, loss %.4f -> %.4f; checkpoints and metrics.jsonl in %s\n",
               first_step, cfg->train.steps, weft_now_seconds() - prog.started, first_loss,
               last_loss, run_dir);

    weft_free(batch);
    weft_free(order.perm);
    weft_trainer_free(t);
    weft_model_free(m);
    weft_backend_destroy(be);
    weft_document_set_free(data);
    weft_tokenizer_free(tok);
    return 0;
}
