#include "train/step.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static weft_plan_layout layout_of(const weft_job_config *cfg, int world) {
    return weft_plan_layout_of(&cfg->parallel, world, cfg->train.max_tokens_per_microbatch,
                               cfg->train.micro_batches);
}

int weft_trainer_max_document_len(const weft_job_config *cfg, int world, char *why,
                                  size_t why_size) {
    weft_plan_layout l = layout_of(cfg, world);
    snprintf(why, why_size, "%s", l.why);
    return weft_plan_max_document_len(&l);
}

weft_model *weft_trainer_build_model(weft_backend *be, const weft_comm *world,
                                     const weft_model_config *mc, const weft_job_config *cfg,
                                     bool forward_only) {
    weft_model_options opt = {.pad_multiple = weft_dp_pad_multiple(world),
                              .recompute = cfg->train.recompute,
                              .drop_tensors = cfg->model.drop_tensors,
                              .forward_only = forward_only};
    return weft_model_create(be, mc, &opt);
}

weft_trainer *weft_trainer_create(weft_model *m, weft_comm *world, const weft_job_config *cfg,
                                  bool with_optimizer) {
    weft_job_config_validate(cfg);
    weft_trainer *t = weft_alloc(sizeof *t);
    t->model = m;
    t->world = world;
    t->cfg = *cfg;
    t->layout = layout_of(cfg, weft_comm_size(world));
    t->batch.mtp_depth = m->cfg.num_mtp;
    t->n_segs = m->n_params;
    t->segs = weft_alloc(sizeof(weft_optim_segment) * m->n_params);
    for (int i = 0; i < m->n_params; i++) {
        bool frozen = cfg->train.freeze_mtp && weft_model_param_is_mtp(m, i);
        // A frozen tensor is left out: no AdamW step, so no weight decay either.
        t->segs[i] = (weft_optim_segment){m->params[i].offset, frozen ? 0 : m->params[i].numel,
                                          m->params[i].weight_decay};
    }
    t->dp = weft_dp_create(world, m, &cfg->parallel);
    t->cp = weft_cp_create(world, &cfg->parallel);
    t->head_sums = m->be->alloc(m->be, sizeof(double) * (2 * weft_model_heads(m) + 1));
    if (with_optimizer) {
        weft_optim_config oc = cfg->optim;
        oc.total_steps = cfg->train.steps;
        t->opt = weft_dp_create_optimizer(t->dp, &oc);
    }
    return t;
}

void weft_trainer_free(weft_trainer *t) {
    if (!t) return;
    weft_optimizer_free(t->opt);
    weft_dp_free(t->dp);
    weft_cp_free(t->cp);
    t->model->be->free(t->model->be, t->head_sums);
    weft_batch_free(&t->batch);
    weft_local_plan_free(&t->last);
    weft_free(t->micro_busy);
    weft_free(t->segs);
    weft_free(t);
}

// ------------------------------------------------------------------------------ counting ----

// Adds what this rank owns of a document to counts: counts[k] for head k (0: next token, k: MTP
// depth k) the targets predicted from positions in its chunks (tokens p+k+1 marked by the loss
// mask), counts[heads] its real tokens there. Each target and token has exactly one owner.
static void add_owned_counts(const weft_cp *cp, const weft_document *d, int heads, double *counts) {
    int start[2], chunk_len, padded;
    int n_chunks = weft_cp_chunks(cp, d->len, start, &chunk_len, &padded);
    for (int c = 0; c < n_chunks; c++)
        for (int p = start[c]; p < start[c] + chunk_len && p < d->len; p++) {
            counts[heads] += 1;
            for (int k = 0; k < heads && p + k + 1 < d->len; k++)
                counts[k] += d->loss_mask ? d->loss_mask[p + k + 1] != 0 : 1;
        }
}

// The global batch's target count per head, then its token count, from one all-reduce of what
// this rank owns: known before any backward, so every micro-batch scales by the global count.
static void count_targets(weft_trainer *t, const weft_local_plan *plan, const weft_document *docs,
                          double *counts, weft_step_result *r) {
    int heads = weft_model_heads(t->model);
    memset(counts, 0, sizeof(double) * (heads + 1));
    for (int p = 0; p < plan->n_micro; p++) {
        weft_cp_select(t->cp, plan->degree[p]);
        for (int k = plan->offsets[p]; k < plan->offsets[p + 1]; k++) {
            const weft_document *d = &docs[plan->docs[k]];
            r->local_tokens += weft_cp_rows(d->len, weft_cp_size(t->cp));
            add_owned_counts(t->cp, d, heads, counts);
        }
    }
    weft_comm_allreduce_sum(t->world, counts, heads + 1, WEFT_COMM_F64);
    r->n_targets = (long)counts[0];
    r->n_tokens = (long)counts[heads];
    r->local_docs = plan->n_docs;
}

// ------------------------------------------------------------------------------ outputs ----

// Where a pass's per-row outputs go: device rows of the micro-batch, then host arrays in batch
// order. doc_offset[i] is where document i starts in the batch.
typedef struct output_rows {
    const weft_trainer_outputs *want;
    long *doc_offset;
    float *logprobs, *entropy; // (T) device, per micro-batch
    void *logits;              // (T, V) device
} output_rows;

static void outputs_begin(output_rows *o, const weft_trainer_outputs *want,
                          const weft_document *docs, int n_docs) {
    *o = (output_rows){.want = want, .doc_offset = weft_alloc(sizeof(long) * (n_docs + 1))};
    for (int i = 0; i < n_docs; i++) o->doc_offset[i + 1] = o->doc_offset[i] + docs[i].len;
    if (want && want->logprobs) memset(want->logprobs, 0, sizeof(float) * o->doc_offset[n_docs]);
    if (want && want->entropy) memset(want->entropy, 0, sizeof(float) * o->doc_offset[n_docs]);
}

// Device buffers for a micro-batch of T rows (freed by outputs_place).
// An objective reads the log-probs (and maybe the entropy) whether or not they are wanted out.
static weft_forward_outputs outputs_device(output_rows *o, weft_backend *be, int T, int V,
                                           double *head_sums, const weft_token_objective *obj) {
    const weft_trainer_outputs *w = o->want;
    bool logprobs = (w && w->logprobs) || obj, entropy = (w && w->entropy) || (obj && obj->entropy);
    o->logprobs = logprobs ? be->alloc(be, sizeof(float) * (T > 0 ? T : 1)) : NULL;
    o->entropy = entropy ? be->alloc(be, sizeof(float) * (T > 0 ? T : 1)) : NULL;
    o->logits = w && w->logits ? be->alloc(be, weft_dtype_size(be->act_dtype) * T * V + 1) : NULL;
    return (weft_forward_outputs){.logprobs = {o->logprobs}, .entropy = {o->entropy},
                                  .logits = o->logits, .stats = head_sums};
}

// Puts a micro-batch's per-row values at their target tokens' places in the global batch: row p
// predicts token p+1 of its document. Summing over ranks then gathers them, since each target has
// one owner.
static void place_rows(weft_backend *be, const weft_batch *b, const int *doc_index,
                       const long *doc_offset, const float *rows_dev, float *global) {
    if (!rows_dev || !global) return;
    float *rows = weft_alloc(sizeof(float) * (b->T > 0 ? b->T : 1));
    be->to_host(be, rows, rows_dev, sizeof(float) * b->T);
    for (int j = 0; j < b->n_docs; j++)
        for (int t = b->cu_seqlens[j]; t < b->cu_seqlens[j + 1]; t++)
            if (b->targets[t] >= 0) global[doc_offset[doc_index[j]] + b->positions[t] + 1] = rows[t];
    weft_free(rows);
}

static void outputs_place(output_rows *o, weft_backend *be, const weft_batch *b,
                          const int *doc_index, int V) {
    place_rows(be, b, doc_index, o->doc_offset, o->logprobs, o->want ? o->want->logprobs : NULL);
    place_rows(be, b, doc_index, o->doc_offset, o->entropy, o->want ? o->want->entropy : NULL);
    if (o->logits) { // one process, so documents are whole: each one's rows to its place
        float *host = weft_alloc(sizeof(float) * b->T * V + 1);
        be->to_f32(be, host, o->logits, be->act_dtype, (size_t)b->T * V);
        for (int j = 0; j < b->n_docs; j++)
            memcpy(o->want->logits + o->doc_offset[doc_index[j]] * V,
                   host + (size_t)b->cu_seqlens[j] * V,
                   sizeof(float) * V * (b->cu_seqlens[j + 1] - b->cu_seqlens[j]));
        weft_free(host);
    }
    be->free(be, o->logprobs), be->free(be, o->entropy), be->free(be, o->logits);
    o->logprobs = o->entropy = NULL, o->logits = NULL;
}

static void outputs_end(output_rows *o, weft_comm *world, int n_docs) {
    long T = o->doc_offset[n_docs];
    if (o->want && o->want->logprobs) weft_comm_allreduce_sum(world, o->want->logprobs, T, WEFT_COMM_F32);
    if (o->want && o->want->entropy) weft_comm_allreduce_sum(world, o->want->entropy, T, WEFT_COMM_F32);
    weft_free(o->doc_offset);
}

// ---------------------------------------------------------------------------- the passes ----

typedef enum { PASS_CROSS_ENTROPY, PASS_WEIGHTED, PASS_SCORE } pass_kind;

// Head 0's weights from the objective, given the micro-batch's log-probs (and entropy) on the
// device: host d_logprob (T) and d_entropy (T).
static void objective_weights(const weft_trainer *t, const int *doc_index, const float *logprob_dev,
                              const float *entropy_dev, float *d_logprob, float *d_entropy) {
    const weft_batch *b = &t->batch;
    weft_backend *be = t->model->be;
    int T = b->T, n = T > 0 ? T : 1;
    int *doc = weft_alloc(sizeof(int) * n), *token = weft_alloc(sizeof(int) * n);
    float *logprob = weft_alloc(sizeof(float) * n), *entropy = NULL;
    be->to_host(be, logprob, logprob_dev, sizeof(float) * T);
    if (t->objective->entropy) {
        entropy = weft_alloc(sizeof(float) * n);
        be->to_host(be, entropy, entropy_dev, sizeof(float) * T);
    }
    for (int j = 0; j < b->n_docs; j++)
        for (int r = b->cu_seqlens[j]; r < b->cu_seqlens[j + 1]; r++) {
            bool target = b->targets[r] >= 0;
            doc[r] = target ? doc_index[j] : -1;
            token[r] = target ? b->positions[r] + 1 : 0;
        }
    weft_token_rows rows = {T, doc, token, logprob, entropy};
    t->objective->weights(t->objective->ctx, &rows, d_logprob, d_entropy);
    weft_free(doc), weft_free(token), weft_free(logprob), weft_free(entropy);
}

// The backward's weights, uploaded: per head the weight of a row's log-prob (head 0 from the
// objective or the documents' logprob_weights at the row's target, head k -scale[k] on its
// targets: the MTP losses), then head 0's entropy weights. Device (heads + 1, T).
static float *row_weights(const weft_trainer *t, const weft_document *docs, const int *doc_index,
                          const float *scale, const weft_forward_outputs *fo) {
    const weft_batch *b = &t->batch;
    weft_backend *be = t->model->be;
    int heads = weft_model_heads(t->model), T = b->T;
    size_t size = sizeof(float) * (heads + 1) * (T > 0 ? T : 1);
    float *host = weft_alloc(size);
    if (t->objective) {
        objective_weights(t, doc_index, fo->logprobs[0], fo->entropy[0], host,
                          host + (size_t)heads * T);
    } else {
        for (int j = 0; j < b->n_docs; j++) {
            const weft_document *d = &docs[doc_index[j]];
            for (int r = b->cu_seqlens[j]; r < b->cu_seqlens[j + 1]; r++)
                if (b->targets[r] >= 0) host[r] = d->logprob_weights[b->positions[r] + 1];
        }
    }
    for (int k = 1; k < heads; k++)
        for (int r = 0; r < T; r++)
            host[(size_t)k * T + r] = weft_batch_mtp_targets(b, k)[r] >= 0 ? -scale[k] : 0.0f;
    float *dev = be->alloc(be, size);
    be->to_device(be, dev, host, sizeof(float) * (heads + 1) * T);
    weft_free(host);
    return dev;
}

// One micro-batch of this rank's plan: its batch, then the pass.
static void run_micro(weft_trainer *t, pass_kind kind, const weft_document *docs,
                      const int *doc_index, int n, const float *scale, output_rows *o) {
    weft_model *m = t->model;
    weft_backend *be = m->be;
    weft_batch_clear(&t->batch);
    for (int k = 0; k < n; k++) {
        const weft_document *d = &docs[doc_index[k]];
        int start[2], chunk_len, padded;
        int n_chunks = weft_cp_chunks(t->cp, d->len, start, &chunk_len, &padded);
        weft_batch_append_chunks(&t->batch, d->tokens, d->loss_mask, d->len, padded, start,
                                 n_chunks, chunk_len);
    }
    weft_pass_options pass = {.kv = weft_cp_kv_provider(t->cp, be, &t->batch),
                              .grads_ready = weft_dp_grad_hook(t->dp)};
    const weft_token_objective *obj = kind == PASS_WEIGHTED ? t->objective : NULL;
    weft_forward_outputs fo =
        outputs_device(o, be, t->batch.T, m->cfg.vocab_size, t->head_sums, obj);
    if (kind == PASS_CROSS_ENTROPY) {
        weft_model_forward_backward(m, &t->batch, scale, &pass, &fo);
    } else {
        weft_model_forward(m, &t->batch, kind == PASS_WEIGHTED, &pass, &fo);
        if (kind == PASS_WEIGHTED) {
            int heads = weft_model_heads(m), T = t->batch.T;
            float *w = row_weights(t, docs, doc_index, scale, &fo);
            weft_head_weights hw;
            memset(&hw, 0, sizeof hw);
            for (int k = 0; k < heads; k++) hw.d_logprob[k] = w + (size_t)k * T;
            if (obj && obj->entropy) hw.d_entropy[0] = w + (size_t)heads * T;
            weft_model_backward(m, &hw, &pass);
            be->free(be, w);
        }
    }
    outputs_place(o, be, &t->batch, doc_index, m->cfg.vocab_size);
}

// Grows the model's activation memory before the first micro-batch to what the largest of this
// rank's micro-batches needs, so no micro-batch allocates (or, on a GPU, waits to free) memory.
static void reserve_activations(weft_trainer *t, const weft_local_plan *plan,
                                const weft_document *docs) {
    int T = 0, T_kv = 0, n_docs = 0;
    bool provider = false;
    for (int p = 0; p < plan->n_micro; p++) {
        weft_cp_select(t->cp, plan->degree[p]);
        int rows = 0, kv_rows = 0, c = weft_cp_size(t->cp);
        for (int k = plan->offsets[p]; k < plan->offsets[p + 1]; k++) {
            int start[2], chunk_len, padded;
            int n = weft_cp_chunks(t->cp, docs[plan->docs[k]].len, start, &chunk_len, &padded);
            rows += n * chunk_len, kv_rows += padded;
        }
        int docs_here = plan->offsets[p + 1] - plan->offsets[p];
        T = rows > T ? rows : T;
        T_kv = kv_rows > T_kv ? kv_rows : T_kv;
        n_docs = docs_here > n_docs ? docs_here : n_docs;
        provider = provider || c > 1;
    }
    if (plan->n_micro > 0) weft_model_reserve(t->model, T, T_kv, n_docs, provider);
}

// The step's sums read back at once (the head sums, then this rank's share of the gradient's
// squared norm, 0 when scoring), all-reduced into the step's metrics.
static void reduce_metrics(weft_trainer *t, const double *counts, weft_step_result *r) {
    weft_backend *be = t->model->be;
    int heads = weft_model_heads(t->model);
    double metrics[2 * WEFT_MAX_HEADS + 1] = {0};
    be->to_host(be, metrics, t->head_sums, sizeof(double) * (2 * heads + 1));
    weft_comm_allreduce_sum(t->world, metrics, 2 * heads + 1, WEFT_COMM_F64);
    r->loss = metrics[0] / counts[0];
    r->accuracy = metrics[heads] / counts[0];
    for (int k = 1; k < heads; k++) {
        r->mtp_loss[k - 1] = counts[k] > 0 ? metrics[k] / counts[k] : 0.0;
        r->mtp_accuracy[k - 1] = counts[k] > 0 ? metrics[heads + k] / counts[k] : 0.0;
    }
    r->grad_norm = sqrt(metrics[2 * heads]);
}

// This rank's share of the squared gradient norm into the step's sums; frozen MTP modules take
// no update and no part in the norm.
static void add_owned_sumsq(weft_trainer *t) {
    weft_model *m = t->model;
    weft_backend *be = m->be;
    if (t->cfg.train.freeze_mtp)
        for (int i = 0; i < m->n_params; i++)
            if (weft_model_param_is_mtp(m, i))
                be->zero(be, weft_model_grad(m, i), m->params[i].numel * sizeof(float));
    weft_dp_owned_sumsq(t->dp, &t->head_sums[2 * weft_model_heads(m)]);
}

static bool has_weights(const weft_document *docs, int n) {
    int with = 0;
    for (int i = 0; i < n; i++) with += docs[i].logprob_weights != NULL;
    WEFT_CHECK(with == 0 || with == n, "%d of the batch's %d documents carry logprob_weights; give "
               "them for every document or for none", with, n);
    return n > 0 && with == n;
}

static weft_step_result run_pass(weft_trainer *t, pass_kind kind, const weft_document *docs,
                                 int n_docs, const weft_trainer_outputs *out) {
    double t0 = weft_now_seconds();
    weft_model *m = t->model;
    weft_backend *be = m->be;
    long waits = be->host_waits;
    int heads = weft_model_heads(m), D = m->cfg.num_mtp;
    WEFT_CHECK(!(out && out->logits) || weft_comm_size(t->world) == 1,
               "--logits needs a single process; run weft grad without mpirun");
    weft_step_result r = {.mtp_depth = D};
    int *lengths = weft_alloc(sizeof(int) * (n_docs > 0 ? n_docs : 1));
    for (int i = 0; i < n_docs; i++) lengths[i] = docs[i].len;
    weft_plan plan = weft_plan_make(&t->layout, lengths, n_docs);
    weft_local_plan_free(&t->last);
    weft_free(t->micro_busy);
    t->last = weft_plan_local(&plan, weft_comm_rank(t->world));
    const weft_local_plan local = t->last;
    t->micro_busy = weft_alloc(sizeof(double) * (local.n_micro > 0 ? local.n_micro : 1));
    weft_plan_free(&plan);
    weft_free(lengths);

    double counts[WEFT_MAX_HEADS + 1];
    count_targets(t, &local, docs, counts, &r);
    WEFT_CHECK(r.n_targets > 0, "the batch has no prediction targets (every loss_mask is 0)");
    float scale[WEFT_MAX_HEADS] = {(float)(1.0 / counts[0])};
    for (int k = 1; k < heads; k++)
        scale[k] = counts[k] > 0 ? (float)(m->cfg.mtp_loss_scale / D / counts[k]) : 0.0f;

    bool backward = kind != PASS_SCORE;
    WEFT_CHECK(!backward || !t->asleep, "internal: a gradient pass while the trainer sleeps");
    if (backward) reserve_activations(t, &local, docs);
    if (backward) weft_model_zero_grad(m);
    be->zero(be, t->head_sums, sizeof(double) * (2 * heads + 1));
    weft_cp_take_comm_seconds(t->cp);
    output_rows o;
    outputs_begin(&o, out, docs, n_docs);
    if (backward && local.n_micro == 0) weft_dp_arm_last_microbatch(t->dp);
    for (int p = 0; p < local.n_micro; p++) {
        double started = weft_now_seconds();
        weft_cp_select(t->cp, local.degree[p]);
        if (backward && p == local.n_micro - 1) weft_dp_arm_last_microbatch(t->dp);
        run_micro(t, kind, docs, local.docs + local.offsets[p], local.offsets[p + 1] - local.offsets[p],
                  scale, &o);
        double comm = weft_cp_take_comm_seconds(t->cp);
        r.cp_comm_seconds += comm;
        t->micro_busy[p] = weft_now_seconds() - started - comm;
    }
    if (backward) {
        double sync_start = weft_now_seconds();
        weft_dp_finish_gradients(t->dp);
        r.sync_wait_seconds = weft_now_seconds() - sync_start;
    }
    outputs_end(&o, t->world, n_docs);
    if (backward) add_owned_sumsq(t);
    reduce_metrics(t, counts, &r);
    r.seconds = weft_now_seconds() - t0;
    r.host_waits = be->host_waits - waits;
    return r;
}

// The objective's pass: its begin (after a scoring pass when it reads whole sequences), the
// weighted pass, its value as the loss.
static weft_step_result objective_pass(weft_trainer *t, const weft_document *docs, int n_docs,
                                       const weft_trainer_outputs *out) {
    const weft_token_objective *obj = t->objective;
    WEFT_CHECK(!has_weights(docs, n_docs), "the batch's documents carry logprob_weights, which "
               "the RL objective does not read; drop the field");
    float *logprobs = NULL;
    if (obj->whole_logprobs) {
        long T = 0;
        for (int i = 0; i < n_docs; i++) T += docs[i].len;
        logprobs = weft_alloc(sizeof(float) * (T > 0 ? T : 1));
        run_pass(t, PASS_SCORE, docs, n_docs, &(weft_trainer_outputs){.logprobs = logprobs});
    }
    obj->begin(obj->ctx, docs, n_docs, logprobs);
    weft_free(logprobs);
    weft_step_result r = run_pass(t, PASS_WEIGHTED, docs, n_docs, out);
    r.loss = obj->end(obj->ctx, t->world);
    return r;
}

weft_step_result weft_trainer_gradients(weft_trainer *t, const weft_document *docs, int n_docs,
                                        const weft_trainer_outputs *out) {
    if (t->objective) return objective_pass(t, docs, n_docs, out);
    pass_kind kind = has_weights(docs, n_docs) ? PASS_WEIGHTED : PASS_CROSS_ENTROPY;
    return run_pass(t, kind, docs, n_docs, out);
}

void weft_trainer_set_objective(weft_trainer *t, const weft_token_objective *objective) {
    t->objective = objective;
}

weft_step_result weft_trainer_score(weft_trainer *t, const weft_document *docs, int n_docs,
                                    const weft_trainer_outputs *out) {
    return run_pass(t, PASS_SCORE, docs, n_docs, out);
}

void weft_trainer_set_row_limit(weft_trainer *t, int rows) { t->layout.limit = rows; }

weft_step_result weft_trainer_step(weft_trainer *t, const weft_document *docs, int n_docs) {
    WEFT_CHECK(t->opt, "internal: trainer built without an optimizer");
    double t0 = weft_now_seconds();
    weft_model *m = t->model;
    long waits = m->be->host_waits;
    weft_step_result r = weft_trainer_gradients(t, docs, n_docs, NULL);
    double clip = weft_clip_factor(&t->opt->cfg, r.grad_norm);
    if (clip < 1.0) weft_dp_scale_owned(t->dp, (float)clip);
    r.lr = weft_optimizer_step(t->opt, m->param_buf, m->grad_buf, t->segs, t->n_segs);
    weft_dp_gather_parameters(t->dp);
    r.seconds = weft_now_seconds() - t0;
    r.host_waits = m->be->host_waits - waits;
    return r;
}

void weft_trainer_gather_gradients(weft_trainer *t) { weft_dp_gather_gradients(t->dp); }

void weft_trainer_sleep(weft_trainer *t) {
    WEFT_CHECK(!t->asleep && t->opt, "internal: weft_trainer_sleep on a trainer %s",
               t->asleep ? "asleep" : "without an optimizer");
    weft_optimizer_offload(t->opt);
    weft_model_release_grad(t->model);
    weft_dp_release_buffers(t->dp);
    weft_model_release_activations(t->model); // the next gradient pass reserves again
    t->asleep = true;
}

void weft_trainer_wake(weft_trainer *t) {
    WEFT_CHECK(t->asleep, "internal: weft_trainer_wake on a trainer awake");
    weft_model_restore_grad(t->model); // before the shard, which exists where gradients do
    weft_dp_restore_buffers(t->dp);
    weft_optimizer_reload(t->opt);
    t->asleep = false;
}

weft_memory_report weft_trainer_memory(const weft_trainer *t) {
    return (weft_memory_report){
        .parameters = weft_model_param_bytes(t->model),
        .gradients = weft_model_grad_bytes(t->model),
        .optimizer_state = t->opt ? weft_optimizer_state_bytes(t->opt) : 0,
        .peak_activations = weft_model_peak_bytes(t->model),
    };
}
