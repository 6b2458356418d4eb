#include "train/step.h"

#include <math.h>
#include <stdio.h>

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
    weft_batch_free(&t->batch);
    weft_free(t->segs);
    weft_free(t);
}

// Targets of head k (0: next token, k: MTP depth k) in a document: tokens j >= k+1 marked by
// the loss mask, since head k at position t predicts token t+k+1.
static long count_targets(const weft_document *d, int k) {
    long n = 0;
    for (int j = k + 1; j < d->len; j++) n += d->loss_mask ? d->loss_mask[j] != 0 : 1;
    return n;
}

// Attention's quadratic term is small next to the matmuls at these lengths; weigh it lightly.
static const double COST_ALPHA = 1.0 / 4096, COST_BETA = 1.0;

// This rank's documents of the global batch, packed into micro-batches. `local` receives them.
static weft_microbatch_plan plan_local(const weft_trainer *t, const weft_document *docs,
                                       int n_docs, weft_document *local, int *n_local) {
    int *lengths = weft_alloc(sizeof(int) * (n_docs > 0 ? n_docs : 1));
    for (int i = 0; i < n_docs; i++) lengths[i] = docs[i].len;
    weft_microbatch_plan ranks = weft_plan_balanced(lengths, n_docs, weft_comm_size(t->world),
                                                    COST_ALPHA, COST_BETA);
    int r = weft_comm_rank(t->world);
    *n_local = 0;
    for (int k = ranks.offsets[r]; k < ranks.offsets[r + 1]; k++, (*n_local)++) {
        local[*n_local] = docs[ranks.docs[k]];
        lengths[*n_local] = local[*n_local].len;
    }
    weft_microbatch_plan_free(&ranks);
    int budget = t->cfg.train.max_tokens_per_microbatch, parts = t->cfg.train.micro_batches;
    weft_microbatch_plan p = budget > 0 ? weft_plan_packed(lengths, *n_local, budget, COST_ALPHA, COST_BETA)
                             : *n_local > 0
                                 ? weft_plan_contiguous(lengths, *n_local, parts < *n_local ? parts : *n_local)
                                 : weft_plan_packed(lengths, 0, 1, COST_ALPHA, COST_BETA);
    weft_free(lengths);
    return p;
}

weft_step_result weft_trainer_gradients(weft_trainer *t, const weft_document *docs, int n_docs,
                                        float *logits_host) {
    double t0 = weft_now_seconds();
    weft_model *m = t->model;
    weft_backend *be = m->be;
    int D = m->cfg.num_mtp, heads = D + 1;
    WEFT_CHECK(!logits_host || weft_comm_size(t->world) == 1,
               "--logits needs a single process; run weft grad without mpirun");
    weft_step_result r = {.mtp_depth = D};
    weft_document *local = weft_alloc(sizeof(weft_document) * (n_docs > 0 ? n_docs : 1));
    int n_local;
    weft_microbatch_plan plan = plan_local(t, docs, n_docs, local, &n_local);

    // Every head's global target count, from one all-reduce of this rank's counts, before any
    // backward; each micro-batch scales by it, so summing over micro-batches and ranks gives the
    // global objective.
    double counts[WEFT_MAX_MTP + 2] = {0}; // per head, then the token count
    for (int i = 0; i < n_local; i++) {
        r.local_tokens += local[i].len;
        for (int k = 0; k < heads; k++) counts[k] += (double)count_targets(&local[i], k);
    }
    counts[heads] = (double)r.local_tokens;
    weft_comm_allreduce_sum(t->world, counts, heads + 1, WEFT_COMM_F64);
    r.n_targets = (long)counts[0];
    r.n_tokens = (long)counts[heads];
    r.local_docs = n_local;
    WEFT_CHECK(r.n_targets > 0, "the batch has no prediction targets (every loss_mask is 0)");
    float scale[WEFT_MAX_MTP + 1] = {(float)(1.0 / counts[0])};
    for (int k = 1; k < heads; k++)
        scale[k] = counts[k] > 0 ? (float)(m->cfg.mtp_loss_scale / D / counts[k]) : 0.0f;

    weft_model_zero_grad(m);
    // Metrics: per head loss sum and correct count, then this rank's share of the squared norm.
    double metrics[2 * (WEFT_MAX_MTP + 1) + 1] = {0};
    size_t logits_row = 0;
    if (plan.n_micro == 0) weft_dp_arm_last_microbatch(t->dp);
    for (int p = 0; p < plan.n_micro; p++) {
        weft_batch_clear(&t->batch);
        for (int k = plan.offsets[p]; k < plan.offsets[p + 1]; k++) {
            const weft_document *d = &local[plan.docs[k]];
            weft_batch_append(&t->batch, d->tokens, d->loss_mask, d->len);
        }
        if (p == plan.n_micro - 1) weft_dp_arm_last_microbatch(t->dp);
        float *logits = logits_host ? logits_host + logits_row * m->cfg.vocab_size : NULL;
        weft_forward_stats s = weft_model_forward_backward(m, &t->batch, scale, logits);
        for (int k = 0; k < heads; k++) metrics[k] += s.loss_sum[k], metrics[heads + k] += s.correct[k];
        logits_row += t->batch.T;
    }
    weft_microbatch_plan_free(&plan);
    weft_free(local);
    double sync_start = weft_now_seconds();
    weft_dp_finish_gradients(t->dp);
    r.sync_wait_seconds = weft_now_seconds() - sync_start;

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
