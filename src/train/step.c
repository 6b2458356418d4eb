#include "train/step.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int weft_trainer_max_document_len(const weft_job_config *cfg, int world, char *why,
                                  size_t why_size) {
    int budget = cfg->train.max_tokens_per_microbatch, c = cfg->parallel.context_parallel_size;
    if (cfg->parallel.dynamic_context_parallel) {
        int limit = cfg->parallel.max_seqlen_per_rank;
        snprintf(why, why_size, "parallel.max_seqlen_per_rank = %d on %d ranks", limit, world);
        return weft_cp_max_len(limit, world);
    }
    if (c <= 1) {
        snprintf(why, why_size, "train.max_tokens_per_microbatch = %d", budget);
        return budget;
    }
    snprintf(why, why_size, "train.max_tokens_per_microbatch = %d per rank and "
             "parallel.context_parallel_size = %d", budget, c);
    return weft_cp_max_len(budget, c);
}

weft_model *weft_trainer_build_model(weft_backend *be, const weft_comm *world,
                                     const weft_model_config *mc) {
    return weft_model_create(be, mc, weft_dp_pad_multiple(world));
}

weft_trainer *weft_trainer_create(weft_model *m, weft_comm *world, const weft_job_config *cfg,
                                  bool with_optimizer) {
    weft_job_config_validate(cfg);
    weft_trainer *t = weft_alloc(sizeof *t);
    t->model = m;
    t->world = world;
    t->cfg = *cfg;
    m->recompute = cfg->train.recompute;
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
    weft_cp_attach(t->cp, m, &t->batch);
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
    weft_cp_free(t->cp); // takes the model's exchange back
    weft_batch_free(&t->batch);
    weft_free(t->micro_degree);
    weft_free(t->micro_busy);
    weft_free(t->segs);
    weft_free(t);
}

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

static void append_local(weft_trainer *t, const weft_document *d) {
    int start[2], chunk_len, padded;
    int n_chunks = weft_cp_chunks(t->cp, d->len, start, &chunk_len, &padded);
    weft_batch_append_chunks(&t->batch, d->tokens, d->loss_mask, d->len, padded, start, n_chunks,
                             chunk_len);
}

// The micro-batches this rank runs in a step: micro-batch p has CP degree degree[p] and the
// documents docs[offsets[p] .. offsets[p+1]) (indices into the global batch, this rank's chunks
// of each at that degree).
typedef struct local_plan {
    int n_micro, n_docs;
    int *degree, *offsets, *docs;
} local_plan;

static void local_plan_free(local_plan *p) {
    weft_free(p->degree), weft_free(p->offsets), weft_free(p->docs);
}

static local_plan local_plan_alloc(int n_micro, int n_docs) {
    return (local_plan){.n_micro = n_micro, .n_docs = n_docs,
                        .degree = weft_alloc(sizeof(int) * (n_micro > 0 ? n_micro : 1)),
                        .offsets = weft_alloc(sizeof(int) * (n_micro + 1)),
                        .docs = weft_alloc(sizeof(int) * (n_docs > 0 ? n_docs : 1))};
}

// Static layout: this rank's data-parallel group takes a cost-balanced share of the documents,
// packed into micro-batches by the rows this rank holds of each.
static local_plan plan_static(const weft_trainer *t, const weft_document *docs, int n_docs,
                              const int *lengths) {
    double alpha = t->cfg.parallel.cost_alpha, beta = t->cfg.parallel.cost_beta;
    weft_microbatch_plan shares = weft_plan_balanced(lengths, n_docs, weft_cp_dp_size(t->cp),
                                                     alpha, beta);
    int r = weft_cp_dp_rank(t->cp), n_local = shares.offsets[r + 1] - shares.offsets[r];
    int *index = weft_alloc(sizeof(int) * (n_local > 0 ? n_local : 1));
    int *rows = weft_alloc(sizeof(int) * (n_local > 0 ? n_local : 1));
    for (int i = 0; i < n_local; i++) {
        index[i] = shares.docs[shares.offsets[r] + i];
        rows[i] = weft_cp_rows(docs[index[i]].len, weft_cp_size(t->cp));
    }
    weft_microbatch_plan_free(&shares);
    int budget = t->cfg.train.max_tokens_per_microbatch, parts = t->cfg.train.micro_batches;
    weft_microbatch_plan mb = budget > 0   ? weft_plan_packed(rows, n_local, budget, alpha, beta)
                              : n_local > 0 ? weft_plan_contiguous(rows, n_local, parts < n_local ? parts : n_local)
                                            : weft_plan_packed(rows, 0, 1, alpha, beta);
    local_plan p = local_plan_alloc(mb.n_micro, n_local);
    for (int m = 0; m <= mb.n_micro; m++) p.offsets[m] = mb.offsets[m];
    for (int m = 0; m < mb.n_micro; m++) p.degree[m] = weft_cp_size(t->cp);
    for (int k = 0; k < n_local; k++) p.docs[k] = index[mb.docs[k]];
    weft_microbatch_plan_free(&mb);
    weft_free(index), weft_free(rows);
    return p;
}

// Dynamic layout: the planner's micro-batches whose group holds this rank, in plan order, each at
// its own degree.
static local_plan plan_dynamic(const weft_trainer *t, const int *lengths, int n_docs) {
    const weft_parallel_config *pc = &t->cfg.parallel;
    weft_cost_model cm = weft_dcp_cost_model(pc);
    weft_dcp_plan dp = weft_dcp_plan_make(pc->dcp_mode, lengths, n_docs, weft_comm_size(t->world),
                                          pc->max_seqlen_per_rank, &cm);
    int rank = weft_comm_rank(t->world), n_micro = 0, total = 0;
    for (int m = 0; m < dp.n_micro; m++)
        if (weft_dcp_micro_holds(&dp.micro[m], rank))
            n_micro++, total += dp.offsets[m + 1] - dp.offsets[m];
    local_plan p = local_plan_alloc(n_micro, total);
    for (int m = 0, q = 0, k = 0; m < dp.n_micro; m++) {
        if (!weft_dcp_micro_holds(&dp.micro[m], rank)) continue;
        p.degree[q] = dp.micro[m].degree;
        p.offsets[q] = k;
        for (int j = dp.offsets[m]; j < dp.offsets[m + 1]; j++) p.docs[k++] = dp.docs[j];
        p.offsets[++q] = k;
    }
    weft_dcp_plan_free(&dp);
    return p;
}

static local_plan plan_local(const weft_trainer *t, const weft_document *docs, int n_docs) {
    int budget = t->cfg.train.max_tokens_per_microbatch;
    char why[160];
    int max_len = weft_trainer_max_document_len(&t->cfg, weft_comm_size(t->world), why, sizeof why);
    int *lengths = weft_alloc(sizeof(int) * (n_docs > 0 ? n_docs : 1));
    for (int i = 0; i < n_docs; i++) {
        // Every rank checks every document, so all of them stop on the same one.
        WEFT_CHECK(weft_cp_is_dynamic(t->cp) || budget <= 0 || docs[i].len <= max_len,
                   "document %d of the batch has %d tokens, more than the limit of %d set by %s; "
                   "raise the budget or the context-parallel size, or set data.truncate=true",
                   i + 1, docs[i].len, max_len, why);
        lengths[i] = docs[i].len;
    }
    local_plan p = weft_cp_is_dynamic(t->cp) ? plan_dynamic(t, lengths, n_docs)
                                             : plan_static(t, docs, n_docs, lengths);
    weft_free(lengths);
    return p;
}

// Puts a micro-batch's log-probs at their target tokens' places in the global batch: row p
// predicts token p+1 of its document. Summing over ranks then gathers them, since each target
// has one owner.
static void place_logprobs(const weft_batch *b, const int *doc_index, const long *doc_offset,
                           const float *rows, float *global) {
    for (int j = 0; j < b->n_docs; j++)
        for (int t = b->cu_seqlens[j]; t < b->cu_seqlens[j + 1]; t++)
            if (b->targets[t] >= 0) global[doc_offset[doc_index[j]] + b->positions[t] + 1] = rows[t];
}

weft_step_result weft_trainer_gradients(weft_trainer *t, const weft_document *docs, int n_docs,
                                        const weft_model_outputs *out) {
    double t0 = weft_now_seconds();
    weft_model *m = t->model;
    weft_backend *be = m->be;
    int D = m->cfg.num_mtp, heads = D + 1;
    bool want_logits = out && out->logits, want_logprobs = out && out->logprobs;
    WEFT_CHECK(!want_logits || weft_comm_size(t->world) == 1,
               "--logits needs a single process; run weft grad without mpirun");
    weft_step_result r = {.mtp_depth = D};
    local_plan plan = plan_local(t, docs, n_docs);
    if (plan.n_micro > t->micro_capacity) {
        weft_free(t->micro_degree), weft_free(t->micro_busy);
        t->micro_capacity = plan.n_micro;
        t->micro_degree = weft_alloc(sizeof(int) * plan.n_micro);
        t->micro_busy = weft_alloc(sizeof(double) * plan.n_micro);
    }
    t->n_micro = plan.n_micro;

    // Every head's global target count, from one all-reduce of the counts this rank owns, before
    // any backward; each micro-batch scales by it, so summing over micro-batches and ranks gives
    // the global objective.
    double counts[WEFT_MAX_MTP + 2] = {0}; // per head, then the token count
    long *doc_offset = weft_alloc(sizeof(long) * (n_docs + 1));
    for (int i = 0; i < n_docs; i++) doc_offset[i + 1] = doc_offset[i] + docs[i].len;
    for (int p = 0; p < plan.n_micro; p++) {
        weft_cp_select(t->cp, plan.degree[p]);
        for (int k = plan.offsets[p]; k < plan.offsets[p + 1]; k++) {
            const weft_document *d = &docs[plan.docs[k]];
            r.local_tokens += weft_cp_rows(d->len, weft_cp_size(t->cp));
            add_owned_counts(t->cp, d, heads, counts);
        }
    }
    weft_comm_allreduce_sum(t->world, counts, heads + 1, WEFT_COMM_F64);
    r.n_targets = (long)counts[0];
    r.n_tokens = (long)counts[heads];
    r.local_docs = plan.n_docs;
    WEFT_CHECK(r.n_targets > 0, "the batch has no prediction targets (every loss_mask is 0)");
    float scale[WEFT_MAX_MTP + 1] = {(float)(1.0 / counts[0])};
    for (int k = 1; k < heads; k++)
        scale[k] = counts[k] > 0 ? (float)(m->cfg.mtp_loss_scale / D / counts[k]) : 0.0f;

    weft_model_zero_grad(m);
    weft_cp_take_comm_seconds(t->cp);
    if (want_logprobs) memset(out->logprobs, 0, sizeof(float) * doc_offset[n_docs]);
    // Metrics: per head loss sum and correct count, then this rank's share of the squared norm.
    double metrics[2 * (WEFT_MAX_MTP + 1) + 1] = {0};
    if (plan.n_micro == 0) weft_dp_arm_last_microbatch(t->dp);
    double cp_comm = 0;
    for (int p = 0; p < plan.n_micro; p++) {
        double started = weft_now_seconds();
        weft_cp_select(t->cp, plan.degree[p]);
        weft_batch_clear(&t->batch);
        const int *mb_docs = plan.docs + plan.offsets[p];
        for (int k = plan.offsets[p]; k < plan.offsets[p + 1]; k++) append_local(t, &docs[plan.docs[k]]);
        if (p == plan.n_micro - 1) weft_dp_arm_last_microbatch(t->dp);
        int V = m->cfg.vocab_size;
        weft_model_outputs mo = {
            .logits = want_logits ? weft_alloc(sizeof(float) * t->batch.T * V) : NULL,
            .logprobs = want_logprobs ? weft_alloc(sizeof(float) * t->batch.T) : NULL};
        weft_forward_stats s = weft_model_forward_backward(m, &t->batch, scale, &mo);
        for (int k = 0; k < heads; k++) metrics[k] += s.loss_sum[k], metrics[heads + k] += s.correct[k];
        if (want_logprobs) place_logprobs(&t->batch, mb_docs, doc_offset, mo.logprobs, out->logprobs);
        // One process, so documents are whole: each one's rows go to its place in batch order.
        for (int j = 0; want_logits && j < t->batch.n_docs; j++)
            memcpy(out->logits + doc_offset[mb_docs[j]] * V, mo.logits + (size_t)t->batch.cu_seqlens[j] * V,
                   sizeof(float) * V * (t->batch.cu_seqlens[j + 1] - t->batch.cu_seqlens[j]));
        weft_free(mo.logits), weft_free(mo.logprobs);
        double comm = weft_cp_take_comm_seconds(t->cp);
        cp_comm += comm;
        t->micro_degree[p] = plan.degree[p];
        t->micro_busy[p] = weft_now_seconds() - started - comm;
    }
    local_plan_free(&plan);
    r.cp_comm_seconds = cp_comm;
    double sync_start = weft_now_seconds();
    weft_dp_finish_gradients(t->dp);
    r.sync_wait_seconds = weft_now_seconds() - sync_start;
    if (want_logprobs) weft_comm_allreduce_sum(t->world, out->logprobs, doc_offset[n_docs], WEFT_COMM_F32);
    weft_free(doc_offset);

    size_t lo, hi;
    weft_dp_owned_range(t->dp, &lo, &hi);
    if (t->cfg.train.freeze_mtp) // frozen modules take no update and no part in the norm
        for (int i = 0; i < m->n_params; i++)
            if (weft_model_param_is_mtp(m, i))
                be->zero(be, weft_model_grad(m, i), m->params[i].numel * sizeof(float));
    metrics[2 * heads] = be->sumsq_f32(be, m->grad_buf + lo, hi - lo);
    weft_comm_allreduce_sum(t->world, metrics, 2 * heads + 1, WEFT_COMM_F64);

    r.loss = metrics[0] / counts[0];
    r.accuracy = metrics[heads] / counts[0];
    for (int k = 1; k < heads; k++) {
        r.mtp_loss[k - 1] = counts[k] > 0 ? metrics[k] / counts[k] : 0.0;
        r.mtp_accuracy[k - 1] = counts[k] > 0 ? metrics[heads + k] / counts[k] : 0.0;
    }
    r.grad_norm = sqrt(metrics[2 * heads]);
    r.seconds = weft_now_seconds() - t0;
    return r;
}

weft_step_result weft_trainer_step(weft_trainer *t, const weft_document *docs, int n_docs) {
    WEFT_CHECK(t->opt, "internal: trainer built without an optimizer");
    double t0 = weft_now_seconds();
    weft_step_result r = weft_trainer_gradients(t, docs, n_docs, NULL);
    weft_model *m = t->model;
    size_t lo = t->opt->lo, hi = t->opt->hi;
    double clip = weft_clip_factor(&t->opt->cfg, r.grad_norm);
    if (clip < 1.0) m->be->scale_f32(m->be, m->grad_buf + lo, (float)clip, hi - lo);
    r.lr = weft_optimizer_step(t->opt, m->param_buf, m->grad_buf, t->segs, t->n_segs);
    weft_dp_gather_parameters(t->dp);
    r.seconds = weft_now_seconds() - t0;
    return r;
}

void weft_trainer_gather_gradients(weft_trainer *t) { weft_dp_gather_gradients(t->dp); }

weft_memory_report weft_trainer_memory(const weft_trainer *t) {
    return (weft_memory_report){
        .parameters = weft_model_param_bytes(t->model),
        .gradients = weft_model_grad_bytes(t->model),
        .optimizer_state = t->opt ? weft_optimizer_state_bytes(t->opt) : 0,
        .peak_activations = t->model->peak_activation_bytes,
    };
}

void weft_print_memory_report(const weft_memory_report *r) {
    char a[32], b[32], c[32], d[32];
    weft_format_bytes(a, sizeof a, r->parameters);
    weft_format_bytes(b, sizeof b, r->gradients);
    weft_format_bytes(c, sizeof c, r->optimizer_state);
    weft_format_bytes(d, sizeof d, r->peak_activations);
    printf("memory: parameters=%zu gradients=%zu optimizer_state=%zu peak_activations=%zu\n",
           r->parameters, r->gradients, r->optimizer_state, r->peak_activations);
    printf("memory: parameters %s, gradients %s, optimizer state %s, peak activations %s\n", a, b,
           c, d);
    fflush(stdout);
}
