#include "train/grad.h"

#include <stdio.h>
#include <string.h>

#include "data/dataset.h"
#include "model/safetensors.h"
#include "train/job.h"
#include "train/stats.h"
#include "train/step.h"

weft_job_config weft_grad_defaults(void) {
    weft_job_config cfg = weft_job_config_default();
    cfg.train.steps = 0;                     // a gradient check runs no optimizer step unless asked
    cfg.train.max_tokens_per_microbatch = 0; // train.micro_batches cuts the batch
    return cfg;
}

// ------------------------------------------------------------------------------ busy times ----

// This rank's last pass as numbers: micro-batch count, then per micro-batch its degree, busy
// seconds, document count and documents.
static int busy_record(const weft_trainer *t, double *out) {
    const weft_local_plan *l = &t->last;
    int n = 0;
    out[n++] = l->n_micro;
    for (int p = 0; p < l->n_micro; p++) {
        out[n++] = l->degree[p];
        out[n++] = t->micro_busy[p];
        out[n++] = l->offsets[p + 1] - l->offsets[p];
        for (int k = l->offsets[p]; k < l->offsets[p + 1]; k++) out[n++] = l->docs[k];
    }
    return n;
}

static json_t *busy_of_rank(const double *rec, int rank, bool print) {
    json_t *micro = json_array();
    int n_micro = (int)rec[0], at = 1;
    double total = 0;
    if (print) printf("busy: rank %d:", rank);
    for (int p = 0; p < n_micro; p++) {
        int degree = (int)rec[at], n_docs = (int)rec[at + 2];
        double seconds = rec[at + 1];
        json_t *docs = json_array();
        for (int k = 0; k < n_docs; k++) json_array_append_new(docs, json_integer((int)rec[at + 3 + k]));
        json_array_append_new(micro, json_pack("{s:i, s:f, s:o}", "degree", degree, "seconds",
                                               seconds, "documents", docs));
        if (print) printf(" %.4f(%d)", seconds, degree);
        total += seconds;
        at += 3 + n_docs;
    }
    if (print) printf(" s (degree); total %.4f s\n", total);
    return json_pack("{s:i, s:o, s:f}", "rank", rank, "micro_batches", micro, "total", total);
}

// Every rank's micro-batches of the last pass, gathered (all ranks enter): their degrees,
// documents and busy seconds, printed by rank 0 with the per-rank totals' max over mean, the load
// balance of the plan.
static json_t *report_busy(const weft_trainer *t, weft_comm *world, bool print) {
    int W = weft_comm_size(world);
    const weft_local_plan *l = &t->last;
    double *mine = weft_alloc(sizeof(double) * (1 + 3 * l->n_micro + l->n_docs));
    double len = busy_record(t, mine), *lens = weft_alloc(sizeof(double) * W);
    weft_comm_allgather(world, &len, lens, 1, WEFT_COMM_F64);
    int stride = 1;
    for (int r = 0; r < W; r++) stride = lens[r] > stride ? (int)lens[r] : stride;
    double *padded = weft_alloc(sizeof(double) * stride), *all = weft_alloc(sizeof(double) * W * stride);
    memcpy(padded, mine, sizeof(double) * (size_t)len);
    weft_comm_allgather(world, padded, all, stride, WEFT_COMM_F64);
    json_t *ranks = json_array();
    double most = 0, sum = 0;
    for (int r = 0; r < W; r++) {
        json_t *rank = busy_of_rank(all + (size_t)r * stride, r, print);
        double total = json_real_value(json_object_get(rank, "total"));
        most = total > most ? total : most, sum += total;
        json_array_append_new(ranks, rank);
    }
    if (print)
        printf("busy: total per rank: max %.4f mean %.4f imbalance %.3f\n", most, sum / W,
               sum > 0 ? most * W / sum : 1.0);
    weft_free(mine), weft_free(lens), weft_free(padded), weft_free(all);
    return ranks;
}

// ---------------------------------------------------------------------------------- output ----

static void add_vector(weft_safetensors_writer *w, const char *name, const float *v, int64_t n) {
    int64_t shape[1] = {n};
    weft_safetensors_writer_add_f32(w, name, v, 1, shape);
}

// K AdamW steps on the same batch after the gradient (train.steps = K): their losses, printed,
// and each step's statistics appended to `stats`.
static float *take_steps(weft_trainer *t, const weft_document_set *docs, int steps, bool writer,
                         json_t *stats) {
    float *losses = weft_alloc(sizeof(float) * (steps > 0 ? steps : 1));
    for (int s = 0; s < steps; s++) {
        weft_step_result sr = weft_trainer_step(t, docs->docs, docs->n);
        losses[s] = (float)sr.loss;
        json_array_append_new(stats, weft_stats_of_result(&sr));
        if (writer)
            printf("step %d/%d: loss %.6f, grad norm %.6f, lr %.3e, %.4f s, %.0f tokens/s, "
                   "sync wait %.4f s, cp comm %.4f s\n", s + 1, steps, sr.loss, sr.grad_norm,
                   sr.lr, sr.seconds, (double)sr.n_tokens / sr.seconds, sr.sync_wait_seconds,
                   sr.cp_comm_seconds);
    }
    return losses;
}

// The safetensors file: loss, MTP losses, gradients (not when scoring) and the outputs asked
// for, taken before any optimizer step.
static weft_safetensors_writer *output_file(const weft_grad_request *rq, weft_trainer *t,
                                            const weft_step_result *r,
                                            const weft_trainer_outputs *out, long T) {
    weft_model *m = t->model;
    weft_safetensors_writer *w = weft_safetensors_writer_create();
    float loss = (float)r->loss, mtp[WEFT_MAX_MTP];
    weft_safetensors_writer_add_f32(w, "loss", &loss, 0, NULL);
    for (int k = 0; k < r->mtp_depth; k++) mtp[k] = (float)r->mtp_loss[k];
    if (r->mtp_depth > 0) add_vector(w, "mtp_losses", mtp, r->mtp_depth);
    if (!rq->score) weft_model_add_tensors(m, w, "grad.", m->grad_buf, 0);
    if (out->logits) {
        int64_t shape[2] = {T, m->cfg.vocab_size};
        weft_safetensors_writer_add_f32(w, "logits", out->logits, 2, shape);
    }
    if (out->logprobs) add_vector(w, "logprobs", out->logprobs, T);
    if (out->entropy) add_vector(w, "entropy", out->entropy, T);
    return w;
}

// Statistics (all ranks enter: memory peaks and busy times are gathered). `rl`: the RL
// objective's statistics of the first pass, or NULL.
static void write_stats(const weft_grad_request *rq, weft_trainer *t, const weft_step_result *r,
                        const weft_document_set *docs, json_t *steps, json_t *rl, bool writer) {
    weft_comm *world = t->world;
    weft_memory_report mem = weft_trainer_memory(t);
    weft_comm_stats cs = weft_comm_get_stats(world); // the job's collectives, before the reports'
    json_t *root = weft_stats_of_result(r);
    json_object_set_new(root, "documents", json_integer(docs->n));
    json_t *lines = json_array();
    for (int i = 0; i < docs->n; i++) json_array_append_new(lines, json_integer(docs->docs[i].line));
    json_object_set_new(root, "lines", lines);
    if (rl) json_object_set_new(root, "rl", rl);
    json_object_set_new(root, "steps", steps);
    if (rq->busy) json_object_set_new(root, "busy", report_busy(t, world, writer));
    json_t *memory = weft_stats_of_memory(&mem, world);
    if (rq->cfg.parallel.dynamic_context_parallel) {
        // A rank holds at most max_seqlen_per_rank rows of at most as many documents, and its
        // attention sees at most W times that many keys.
        int N = rq->cfg.parallel.max_seqlen_per_rank, W = weft_comm_size(world);
        size_t bound = weft_model_activation_bytes(t->model, N, W * N, N, W > 1);
        json_object_set_new(memory, "bound_for_max_seqlen_per_rank", json_integer((json_int_t)bound));
    }
    json_object_set_new(root, "memory", memory);
    json_object_set_new(root, "collectives", weft_stats_of_collectives(&cs, weft_comm_size(world)));
    if (writer) weft_print_memory_report(&mem);
    weft_stats_save(root, writer ? rq->stats : NULL);
}

// weft grad sets no token budget (a batch is one or train.micro_batches micro-batches), so a
// long document would allocate its activations (and --logits its T x vocab floats) until the
// machine runs out, or compute for hours. What it needs at least, the longest document's rows
// spread over every rank, is checked against the memory there before any of it is allocated.
static void check_fits(const weft_grad_request *rq, const weft_model *m,
                       const weft_document_set *docs, long T, int world) {
    int longest = 0, at = 0;
    for (int i = 0; i < docs->n; i++)
        if (docs->docs[i].len > longest) longest = docs->docs[i].len, at = i;
    int rows = (longest + world - 1) / world;
    size_t acts = weft_model_activation_bytes(m, rows, rows, 1, world > 1);
    size_t outputs = (size_t)T * sizeof(float) *
                     ((rq->logits ? (size_t)m->cfg.vocab_size : 0) + rq->logprobs + rq->entropy);
    size_t device = m->be->device_memory ? m->be->memory_available(m->be) : 0;
    size_t host = weft_host_memory_available();
    size_t need_host = outputs + (m->be->device_memory ? 0 : acts);
    if ((!m->be->device_memory || acts <= device) && need_host <= host) return;
    char need[32], have[32];
    weft_format_bytes(need, sizeof need, m->be->device_memory && acts > device ? acts : need_host);
    weft_format_bytes(have, sizeof have, m->be->device_memory && acts > device ? device : host);
    weft_fatal("%s: document %d has %d tokens; on %d rank(s) it needs at least %s (activations%s) "
               "but %s is available; shorten or split it, or spread it over more ranks with "
               "parallel.context_parallel_size", rq->batch, at + 1, longest, world, need,
               rq->logits ? " and --logits" : "", have);
}

// The batch, read as `weft train` reads data (text through the job's tokenizer, the model
// directory's by default): every row of --batch, or without it the first global batch that
// training draws from data.source. *data receives the set that owns the documents.
static weft_document_set *grad_batch(const weft_grad_request *rq, const weft_job_config *job,
                                     const weft_tokenizer *tok, int vocab,
                                     weft_document_set **data) {
    weft_dataset_options o = {.source = rq->batch ? rq->batch : job->data.source,
                              .synthetic_documents = job->data.synthetic_documents,
                              .seed = (uint64_t)job->train.seed, .vocab_size = vocab};
    *data = weft_dataset_load(&o, tok);
    if (rq->batch) return *data;
    weft_document_set *batch = weft_alloc(sizeof *batch);
    batch->n = job->train.global_batch_size;
    batch->docs = weft_alloc(sizeof(weft_document) * (size_t)batch->n);
    weft_job_first_batch(job, *data, batch->docs);
    return batch;
}

// Which lines of the file (or documents of the synthetic set) formed the batch, in batch order:
// what a user needs to run the same batch through their own reference.
static void print_batch_lines(const weft_grad_request *rq, const weft_job_config *job,
                              const weft_document_set *docs) {
    const char *source = rq->batch ? rq->batch : job->data.source;
    printf("grad: the batch is %d document%s: %s", docs->n, docs->n == 1 ? "" : "s",
           strcmp(source, "synthetic") == 0 ? "synthetic documents" : "lines");
    for (int i = 0; i < docs->n; i++) printf("%s%d", i ? ", " : " ", docs->docs[i].line);
    printf(" of %s\n", source);
}

// Whether the batch is RL rows: then every document must be one, and the RL objective is used.
static bool rl_rows(const weft_grad_request *rq, const weft_document_set *docs) {
    int with = 0;
    for (int i = 0; i < docs->n; i++) with += docs->docs[i].advantages != NULL;
    WEFT_CHECK(with == 0 || with == docs->n, "%s: %d of the batch's %d documents carry "
               "\"advantages\" (RL rows); give them for every document or for none", rq->batch,
               with, docs->n);
    WEFT_CHECK(with == 0 || rq->rl_objective, "internal: RL rows but no RL objective");
    return with > 0;
}

int weft_grad_run(const weft_grad_request *rq, weft_session *session) {
    weft_comm *world = weft_session_world(session);
    const weft_job_config *cfg = &rq->cfg;
    bool writer = weft_session_writer(session);
    char path[4096];
    weft_job_config job = *cfg;
    snprintf(job.model.path, sizeof job.model.path, "%s", rq->model_dir);
    weft_model_config mc;
    weft_job_model_config(&job, 0, &mc);
    weft_tokenizer *tok = weft_job_tokenizer(&job);
    weft_document_set *data, *docs = grad_batch(rq, &job, tok, mc.vocab_size, &data);
    weft_backend *be = weft_job_backend(cfg, world);
    weft_model *m = weft_job_build_model(be, world, &job, mc.vocab_size, rq->score);
    WEFT_CHECK(!rq->score || cfg->train.steps == 0, "--score runs no optimizer step; drop "
               "train.steps=%d or --score", cfg->train.steps);
    weft_trainer *t = weft_trainer_create(m, world, cfg, cfg->train.steps > 0);
    bool rl = rl_rows(rq, docs);
    if (rl) weft_trainer_set_objective(t, rq->rl_objective);

    long T = 0;
    for (int i = 0; i < docs->n; i++) T += docs->docs[i].len;
    check_fits(rq, m, docs, T, weft_comm_size(world));
    weft_trainer_outputs out = {
        .logits = rq->logits ? weft_alloc(sizeof(float) * T * mc.vocab_size) : NULL,
        .logprobs = rq->logprobs ? weft_alloc(sizeof(float) * (T > 0 ? T : 1)) : NULL,
        .entropy = rq->entropy ? weft_alloc(sizeof(float) * (T > 0 ? T : 1)) : NULL};
    weft_step_result r = rq->score ? weft_trainer_score(t, docs->docs, docs->n, &out)
                                   : weft_trainer_gradients(t, docs->docs, docs->n, &out);
    if (!rq->score) weft_trainer_gather_gradients(t);
    if (writer) print_batch_lines(rq, &job, docs);
    if (writer) printf("grad: %d documents, %ld tokens, %ld targets, loss %.6f, grad norm %.6f\n",
                       docs->n, r.n_tokens, r.n_targets, r.loss, r.grad_norm);
    for (int k = 0; k < r.mtp_depth && writer; k++)
        printf("grad: MTP depth %d loss %.6f, accuracy %.4f\n", k + 1, r.mtp_loss[k],
               r.mtp_accuracy[k]);
    json_t *rl_stats = rl && !rq->score ? rq->rl_report(rq->rl_objective) : NULL;
    weft_safetensors_writer *w = output_file(rq, t, &r, &out, T);
    float *losses = NULL;
    json_t *steps = json_array();
    if (cfg->train.steps > 0) { // then the steps' losses and the parameters they lead to
        losses = take_steps(t, docs, cfg->train.steps, writer, steps);
        add_vector(w, "step_losses", losses, cfg->train.steps);
        weft_model_add_tensors(m, w, "param.", NULL, 0);
    }
    write_stats(rq, t, &r, docs, steps, rl_stats, writer);
    if (writer) {
        snprintf(path, sizeof path, "%s", rq->out);
        WEFT_CHECK(weft_safetensors_writer_save(w, path), "%s: cannot write the output file", path);
    }
    weft_safetensors_writer_free(w);
    weft_free(losses), weft_free(out.logits), weft_free(out.logprobs), weft_free(out.entropy);
    weft_trainer_free(t);
    if (docs != data) weft_free(docs->docs), weft_free(docs);
    weft_document_set_free(data);
    weft_tokenizer_free(tok);
    weft_model_free(m);
    weft_backend_destroy(be);
    return 0;
}
