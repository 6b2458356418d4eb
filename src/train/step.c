#include "train/step.h"

#include <math.h>
#include <stdio.h>


weft_trainer *weft_trainer_create(weft_model *m, const weft_job_config *cfg, bool with_optimizer) {
    weft_job_config_validate(cfg);
    weft_trainer *t = weft_alloc(sizeof *t);
    t->model = m;
    t->cfg = *cfg;
    m->recompute = cfg->train.recompute;
    t->n_segs = m->n_params;
    t->segs = weft_alloc(sizeof(weft_optim_segment) * m->n_params);
    for (int i = 0; i < m->n_params; i++) {
        bool frozen = cfg->train.freeze_mtp && weft_model_param_is_mtp(m, i);
        // A frozen tensor is left out: no AdamW step, so no weight decay either.
        t->segs[i] = (weft_optim_segment){m->params[i].offset, frozen ? 0 : m->params[i].numel,
                                          m->params[i].weight_decay};
    }
    t->batch.mtp_depth = m->cfg.num_mtp;
    if (with_optimizer) {
        weft_optim_config oc = cfg->optim;
        oc.total_steps = cfg->train.steps;
        t->opt = weft_optimizer_create(m->be, &oc, 0, m->n_elements, m->param_buf);
    }
    return t;
}

void weft_trainer_free(weft_trainer *t) {
    if (!t) return;
    weft_optimizer_free(t->opt);
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

weft_step_result weft_trainer_gradients(weft_trainer *t, const weft_document *docs, int n_docs,
                                        const weft_microbatch_plan *plan, float *logits_host) {
    double t0 = weft_now_seconds();
    weft_model *m = t->model;
    int D = m->cfg.num_mtp;
    weft_step_result r = {.mtp_depth = D};
    // Every head's global target count is known from the masks before any backward pass; each
    // micro-batch scales by it, so the sum over micro-batches is the global objective.
    long n_head[WEFT_MAX_MTP + 1] = {0};
    for (int i = 0; i < n_docs; i++) {
        r.n_tokens += docs[i].len;
        for (int k = 0; k <= D; k++) n_head[k] += count_targets(&docs[i], k);
    }
    r.n_targets = n_head[0];
    WEFT_CHECK(r.n_targets > 0, "the batch has no prediction targets (every loss_mask is 0)");
    float scale[WEFT_MAX_MTP + 1] = {(float)(1.0 / (double)n_head[0])};
    for (int k = 1; k <= D; k++)
        scale[k] = n_head[k] > 0 ? (float)(m->cfg.mtp_loss_scale / D / (double)n_head[k]) : 0.0f;

    weft_model_zero_grad(m);
    double loss_sum[WEFT_MAX_MTP + 1] = {0}, correct[WEFT_MAX_MTP + 1] = {0};
    size_t logits_row = 0;
    for (int p = 0; p < plan->n_micro; p++) {
        weft_batch_clear(&t->batch);
        for (int k = plan->offsets[p]; k < plan->offsets[p + 1]; k++) {
            const weft_document *d = &docs[plan->docs[k]];
            weft_batch_append(&t->batch, d->tokens, d->loss_mask, d->len);
        }
        float *logits = logits_host ? logits_host + logits_row * m->cfg.vocab_size : NULL;
        weft_forward_stats s = weft_model_forward_backward(m, &t->batch, scale, logits);
        for (int k = 0; k <= D; k++) loss_sum[k] += s.loss_sum[k], correct[k] += s.correct[k];
        logits_row += t->batch.T;
    }
    r.loss = loss_sum[0] / (double)n_head[0];
    r.accuracy = correct[0] / (double)n_head[0];
    for (int k = 1; k <= D; k++) {
        r.mtp_loss[k - 1] = n_head[k] > 0 ? loss_sum[k] / (double)n_head[k] : 0.0;
        r.mtp_accuracy[k - 1] = n_head[k] > 0 ? correct[k] / (double)n_head[k] : 0.0;
    }
    if (t->cfg.train.freeze_mtp) // frozen modules take no update and no part in the norm
        for (int i = 0; i < m->n_params; i++)
            if (weft_model_param_is_mtp(m, i))
                m->be->zero(m->be, weft_model_grad(m, i), m->params[i].numel * sizeof(float));
    r.grad_norm = sqrt(m->be->sumsq_f32(m->be, m->grad_buf, m->n_elements));
    r.seconds = weft_now_seconds() - t0;
    return r;
}

weft_step_result weft_trainer_step(weft_trainer *t, const weft_document *docs, int n_docs,
                                   const weft_microbatch_plan *plan) {
    WEFT_CHECK(t->opt, "internal: trainer built without an optimizer");
    double t0 = weft_now_seconds();
    weft_step_result r = weft_trainer_gradients(t, docs, n_docs, plan, NULL);
    weft_model *m = t->model;
    double clip = weft_clip_factor(&t->opt->cfg, r.grad_norm);
    if (clip < 1.0) m->be->scale_f32(m->be, m->grad_buf, (float)clip, m->n_elements);
    r.lr = weft_optimizer_step(t->opt, m->param_buf, m->grad_buf, t->segs, t->n_segs);
    r.seconds = weft_now_seconds() - t0;
    return r;
}

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
