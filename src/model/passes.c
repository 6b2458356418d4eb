// The passes over a micro-batch (model.h): the forward that scores or keeps what backward needs,
// the output heads, and the backward driven by the heads' fused cross-entropy or by per-row
// weights.
#include <string.h>

#include "model/internal.h"

static const weft_kv_provider *provider_of(const weft_pass_options *pass) {
    return pass ? pass->kv : NULL;
}

static dims dims_of(const weft_model *m, const weft_batch *b) {
    const weft_model_config *c = &m->cfg;
    return (dims){.T = b->T, .C = c->hidden_size, .I = c->intermediate_size, .H = c->num_heads,
                  .KV = c->num_kv_heads, .D = c->head_dim, .qd = c->num_heads * c->head_dim,
                  .kvd = c->num_kv_heads * c->head_dim, .n_docs = b->n_docs, .T_kv = b->T_kv,
                  .logits_rows = b->T};
}

// The batch's five index arrays and the head's chosen rows (out->rows, generation), which
// activations.c carves one after another: their span goes up as one copy, assembled on the host at
// the same offsets (each small upload costs the host a driver call, which a decode step of the
// rollout feels).
static void upload_batch(weft_backend *be, weft_activations *a, const weft_batch *b,
                         const weft_forward_outputs *out) {
    dims d = a->d;
    size_t rows = sizeof(int32_t) * d.T, docs = sizeof(int32_t) * (d.n_docs + 1);
    int n_head = out && out->rows ? out->n_rows : 0;
    WEFT_CHECK(n_head == 0 || (a->head_rows && n_head <= d.T),
               "internal: %d head rows for a forward of %d rows that keeps nothing", n_head, d.T);
    char *base = (char *)a->tokens;
    char *end = n_head > 0 ? (char *)(a->head_rows + n_head) : (char *)a->cu_seqlens_kv + docs;
    char *host = weft_alloc((size_t)(end - base));
    memcpy(host, b->tokens, rows);
    memcpy(host + ((char *)a->positions - base), b->positions, rows);
    memcpy(host + ((char *)a->targets - base), b->targets, rows);
    memcpy(host + ((char *)a->cu_seqlens - base), b->cu_seqlens, docs);
    memcpy(host + ((char *)a->cu_seqlens_kv - base), b->cu_seqlens_kv, docs);
    if (n_head > 0)
        memcpy(host + ((char *)a->head_rows - base), out->rows, sizeof(int32_t) * n_head);
    be->to_device(be, base, host, (size_t)(end - base));
    weft_free(host);
}

// The activations of a forward over `batch`, its inputs on the device: uploaded now, or already
// by weft_model_upload_inputs (pass->uploaded), whose carving of the same dims put them at the
// same addresses.
static weft_activations *prepare_inputs(weft_model *m, keep_mode keep, const weft_batch *batch,
                                        const weft_pass_options *pass,
                                        const weft_forward_outputs *out) {
    const weft_kv_provider *kv = provider_of(pass);
    bool gathered = kv && kv->gather; // whole key rows in the model's buffers only then
    dims d = dims_of(m, batch);
    if (out && out->rows) d.logits_rows = out->logits ? 0 : out->n_rows; // head_on_rows
    weft_activations *a = weft_activations_prepare(m, keep, d, gathered);
    if (!(pass && pass->uploaded)) {
        upload_batch(m->be, a, batch, out);
        if (pass && pass->token_from)
            m->be->take_tokens(m->be, a->tokens, pass->token_source, pass->token_from, d.T);
    }
    a->layout = (weft_attention_layout){.n_docs = d.n_docs, .Tq = d.T, .Tkv = d.T_kv,
                                        .cu_q = a->cu_seqlens, .cu_kv = a->cu_seqlens_kv,
                                        .q_pos = a->positions};
    return a;
}

void weft_model_upload_inputs(weft_model *m, const weft_batch *batch,
                              const weft_pass_options *pass, const weft_forward_outputs *out) {
    weft_pass_options now = pass ? *pass : (weft_pass_options){0};
    now.uploaded = false;
    prepare_inputs(m, KEEP_NONE, batch, &now, out);
}

// Where layer l reads its input (and layer l-1 writes its output).
static void *layer_input(weft_activations *a, int l) {
    return a->keep == KEEP_NONE ? a->ping[l & 1] : a->layers[l].x_in;
}

static const void *head_input(const weft_activations *a, int k) {
    return k == 0 ? a->lnf : a->mtp[k - 1].h;
}

static const int32_t *head_targets(const weft_activations *a, int k) {
    return k == 0 ? a->targets : a->mtp[k - 1].targets;
}

static void *head_gradient(const weft_activations *a, int k) {
    return k == 0 ? a->d_head0 : a->mtp[k - 1].d_head;
}

// ---------------------------------------------------------------------------------- heads ----

// How a forward treats the output heads.
typedef struct head_mode {
    bool fused;             // fused cross-entropy, then straight away the head's backward
    const float *loss_scale; // fused: per head
} head_mode;

// logits (T, V) = h W_head^T into the one logits buffer every head shares.
static void head_logits(weft_model *m, weft_activations *a, int k) {
    int V = m->cfg.vocab_size;
    weft_linear_forward(m, head_input(a, k), whole_weight(m->lm_head, m->cfg.hidden_size),
                        a->logits, a->d.T, a->d.C, V, 0.0f);
}

// From the logits' gradient (in place in a->logits): dh_k (T, C) and dW_head += dlogits^T h_k.
static void head_backward(weft_model *m, weft_activations *a, int k) {
    weft_linear_backward(m, head_input(a, k), whole_weight(m->lm_head, m->cfg.hidden_size),
                         a->logits, head_gradient(a, k), a->d.T, a->d.C, m->cfg.vocab_size, 0.0f);
}

// Head k: its logits, the outputs asked for, its stats, and with the fused cross-entropy its
// gradient (so every head shares one logits buffer).
static void head_forward(weft_model *m, weft_activations *a, int k, head_mode mode,
                         const weft_forward_outputs *out) {
    weft_backend *be = m->be;
    int T = a->d.T, V = m->cfg.vocab_size, heads = weft_model_heads(m);
    const int32_t *targets = head_targets(a, k);
    head_logits(m, a, k);
    if (k == 0 && out && out->logits)
        be->copy(be, out->logits, a->logits, weft_dtype_size(be->act_dtype) * T * V);
    float *logprob = out ? out->logprobs[k] : NULL, *entropy = out ? out->entropy[k] : NULL;
    double *stats = out ? out->stats : NULL;
    if (mode.fused) {
        if (logprob || entropy)
            be->logprobs(be, a->logits, targets, logprob ? logprob : a->row_loss, entropy, NULL,
                         T, V);
        be->cross_entropy(be, a->logits, targets, mode.loss_scale[k], a->row_loss, a->correct, T,
                          V);
        if (stats) be->accumulate_f32(be, a->row_loss, T, false, 1.0, &stats[k]);
        head_backward(m, a, k);
    } else {
        float *lp = logprob ? logprob : a->row_loss;
        be->logprobs(be, a->logits, targets, lp, entropy, a->correct, T, V);
        if (stats) be->accumulate_f32(be, lp, T, false, -1.0, &stats[k]);
    }
    if (stats) be->accumulate_f32(be, a->correct, T, false, 1.0, &stats[heads + k]);
}

// Whether generation's chosen rows are every row of the batch in order, as in a decode step (one
// row a sequence) or a verification of every row: then its head needs no row gather.
static bool every_row_chosen(const weft_forward_outputs *out, int T) {
    if (!out || !out->rows || out->n_rows != T) return false;
    for (int i = 0; i < T; i++)
        if (out->rows[i] != i) return false;
    return true;
}

// What a forward on chosen rows (out->rows) may ask for: logits only, keeping nothing.
static void check_head_on_rows(const weft_activations *a, const weft_forward_outputs *out) {
    WEFT_CHECK(a->keep == KEEP_NONE && out->n_rows >= 0 && out->n_rows <= a->d.T && !out->stats &&
                   !out->logprobs[0] && !out->entropy[0],
               "internal: a forward on chosen rows makes logits only, keeping nothing");
}

// Generation's head: logits of the chosen rows of h (T, C) only (uploaded with the batch),
// gathered first (the embedding op is a row gather: out[i] = table[ids[i]]) unless they are
// every row in order (every_row: every_row_chosen's answer).
static void head_on_rows(weft_model *m, weft_activations *a, const void *h,
                         const weft_forward_outputs *out, bool every_row) {
    weft_backend *be = m->be;
    int n = out->n_rows, V = m->cfg.vocab_size;
    if (n == 0) return;
    const void *x = h;
    if (!every_row) {
        be->embedding_forward(be, a->head_rows, h, a->head_input, n, a->d.C);
        x = a->head_input;
    }
    weft_linear_forward(m, x, whole_weight(m->lm_head, m->cfg.hidden_size),
                        out->logits ? out->logits : a->logits, n, a->d.C, V, 0.0f);
}

// The final norm and generation's head as one op where every row is chosen, the normed rows are
// not asked for (no drafting) and the backend folds the norm into the product (the same bits, a
// decode step's launch fewer); false, nothing done, otherwise.
static bool folded_head_on_every_row(weft_model *m, weft_activations *a,
                                     const weft_forward_outputs *out, bool every_row) {
    bool mtp_runs = m->cfg.num_mtp > 0 && !out->skip_mtp; // module 0 reads the normed rows
    if (!every_row || out->hidden || mtp_runs || out->n_rows == 0) return false;
    return weft_folded_norm_product(m, a, a->x_out, m->final_norm, m->lm_head, WEFT_ABSENT,
                                    out->logits ? out->logits : a->logits, m->cfg.vocab_size,
                                    false);
}

// ------------------------------------------------------------------------------- forward ----

static keep_mode keep_of(const weft_model *m, bool keep) {
    return !keep ? KEEP_NONE : m->opt.recompute ? KEEP_INPUTS : KEEP_ALL;
}

static void run_forward(weft_model *m, const weft_batch *batch, keep_mode keep, head_mode mode,
                        const weft_pass_options *pass, const weft_forward_outputs *out) {
    weft_backend *be = m->be;
    const weft_kv_provider *kv = provider_of(pass);
    int L = m->cfg.num_layers, D = m->cfg.num_mtp;
    WEFT_CHECK(batch->mtp_depth == D || (out && out->skip_mtp),
               "internal: batch built for %d MTP depths, model has %d", batch->mtp_depth, D);
    WEFT_CHECK(kv || batch->T_kv == batch->T,
               "internal: a batch whose attention sees rows it does not hold needs a key/value "
               "provider");
    WEFT_CHECK(!m->acts || !m->acts->backward_due,
               "internal: a forward that kept its activations still waits for its backward");
    WEFT_CHECK(keep == KEEP_NONE || !out || (!out->rows && !out->skip_mtp),
               "internal: only a forward that keeps nothing may run the head on chosen rows or skip "
               "the MTP modules");
    WEFT_CHECK(!(pass && pass->uploaded) || (keep == KEEP_NONE && out && out->skip_mtp),
               "internal: only a forward that keeps nothing and skips the MTP modules reads inputs "
               "uploaded before it");
    weft_activations *a = prepare_inputs(m, keep, batch, pass, out);
    dims d = a->d;

    // Main decoder and its head, then the MTP modules in order (module k reads h_{k-1}).
    be->embedding_forward(be, a->tokens, weft_model_param(m, m->embed), layer_input(a, 0), d.T,
                          d.C);
    for (int l = 0; l < L; l++) {
        void *next = l + 1 < L ? layer_input(a, l + 1) : a->x_out;
        weft_layer_forward(m, l, weft_layer_acts(m, a, l), a, next, kv);
    }
    bool chosen = out && out->rows, every_row = every_row_chosen(out, d.T);
    if (chosen) check_head_on_rows(a, out);
    if (!(chosen && folded_head_on_every_row(m, a, out, every_row))) {
        be->rmsnorm_forward(be, a->x_out, weft_model_param(m, m->final_norm),
                            (float)m->cfg.rms_norm_eps, a->lnf, a->rstdf, d.T, d.C);
        if (out && out->hidden)
            be->copy(be, out->hidden, a->lnf, weft_dtype_size(be->act_dtype) * d.T * d.C);
        if (chosen) head_on_rows(m, a, a->lnf, out, every_row);
        else head_forward(m, a, 0, mode, out);
    }
    for (int k = 0; k < D && !(out && out->skip_mtp); k++) {
        mtp_acts *mk = &a->mtp[k];
        be->to_device(be, mk->inputs, weft_batch_mtp_inputs(batch, k + 1), sizeof(int32_t) * d.T);
        be->to_device(be, mk->targets, weft_batch_mtp_targets(batch, k + 1),
                      sizeof(int32_t) * d.T);
        weft_mtp_forward(m, a, k, head_input(a, k), kv);
        head_forward(m, a, k + 1, mode, out);
    }
    a->fused = mode.fused;
    a->backward_due = keep != KEEP_NONE;
}

void weft_model_draft_forward(weft_model *m, int depth, const weft_batch *batch,
                              const void *h_prev, const weft_pass_options *pass,
                              const weft_forward_outputs *out) {
    weft_backend *be = m->be;
    const weft_kv_provider *kv = provider_of(pass);
    WEFT_CHECK(depth >= 1 && depth <= m->cfg.num_mtp, "internal: no MTP module of depth %d",
               depth);
    WEFT_CHECK(kv && kv->attend && out && out->rows,
               "internal: drafting reads a KV cache and makes logits on chosen rows");
    WEFT_CHECK(!m->acts || !m->acts->backward_due,
               "internal: a forward that kept its activations still waits for its backward");
    weft_activations *a = prepare_inputs(m, KEEP_NONE, batch, pass, out);
    mtp_acts *mk = &a->mtp[depth - 1];
    be->copy(be, mk->inputs, a->tokens, sizeof(int32_t) * a->d.T);
    weft_mtp_forward(m, a, depth - 1, h_prev, kv);
    if (out->hidden)
        be->copy(be, out->hidden, mk->h, weft_dtype_size(be->act_dtype) * a->d.T * a->d.C);
    check_head_on_rows(a, out);
    head_on_rows(m, a, mk->h, out, every_row_chosen(out, a->d.T));
}

// ------------------------------------------------------------------------------ backward ----

// From every head's dL/dh in its gradient buffer: the MTP modules last to first, carrying
// dL/dh_{k-1} down to the main head's input, then the decoder layers. An untied head is the last
// tensor and complete once every head has run.
static void trunk_backward(weft_model *m, weft_activations *a, const weft_pass_options *pass) {
    weft_backend *be = m->be;
    const weft_kv_provider *kv = provider_of(pass);
    dims d = a->d;
    int L = m->cfg.num_layers, D = m->cfg.num_mtp;
    size_t row = weft_dtype_size(be->act_dtype) * d.T * d.C;
    if (m->lm_head != m->embed) weft_notify_grads_ready(pass, m->lm_head);
    for (int k = D - 1; k >= 0; k--) {
        weft_mtp_backward(m, a, k, head_input(a, k), pass);
        weft_notify_grads_ready(pass, m->mtp[k].enorm);
    }
    if (D > 0) be->add_inplace(be, a->d_head0, a->d_carry, (size_t)d.T * d.C);
    be->zero(be, a->d_res, row);
    be->rmsnorm_backward(be, a->x_out, weft_model_param(m, m->final_norm), a->rstdf, a->d_head0,
                         a->d_res, weft_model_grad(m, m->final_norm), d.T, d.C);
    weft_notify_grads_ready(pass, m->final_norm);
    for (int l = L - 1; l >= 0; l--) {
        layer_acts *la = weft_layer_acts(m, a, l);
        if (a->keep == KEEP_INPUTS) weft_layer_forward(m, l, la, a, a->x_out, kv); // x_out: free
        weft_layer_backward(m, l, la, a, pass);
        weft_notify_grads_ready(pass, m->layers[l].input_norm);
    }
    be->embedding_backward(be, a->tokens, a->d_res, weft_model_grad(m, m->embed), d.T, d.C);
    weft_notify_grads_ready(pass, 0);
    a->backward_due = false;
}

// ------------------------------------------------------------------------------ public ----

void weft_model_forward_backward(weft_model *m, const weft_batch *batch, const float *loss_scale,
                                 const weft_pass_options *pass, const weft_forward_outputs *out) {
    run_forward(m, batch, keep_of(m, true), (head_mode){.fused = true, .loss_scale = loss_scale},
                pass, out);
    trunk_backward(m, m->acts, pass);
}

void weft_model_forward(weft_model *m, const weft_batch *batch, bool keep,
                        const weft_pass_options *pass, const weft_forward_outputs *out) {
    run_forward(m, batch, keep_of(m, keep), (head_mode){.fused = false}, pass, out);
}

void weft_model_backward(weft_model *m, const weft_head_weights *w,
                         const weft_pass_options *pass) {
    weft_activations *a = m->acts;
    WEFT_CHECK(a && a->backward_due && !a->fused,
               "internal: weft_model_backward without a forward that kept its activations");
    // Heads first, in forward order, as the fused path accumulates dW_head: the same bits.
    for (int k = 0; k < weft_model_heads(m); k++) {
        head_logits(m, a, k);
        m->be->logits_backward(m->be, a->logits, head_targets(a, k), w->d_logprob[k],
                               w->d_entropy[k], a->d.T, m->cfg.vocab_size);
        head_backward(m, a, k);
    }
    trunk_backward(m, a, pass);
}

size_t weft_model_activation_bytes(const weft_model *m, int T, int T_kv, int n_docs,
                                   bool exchange) {
    dims d = dims_of(m, &(weft_batch){.T = T, .T_kv = T_kv, .n_docs = n_docs});
    return weft_activations_bytes(m, keep_of(m, true), d, exchange);
}

void weft_model_reserve(weft_model *m, int T, int T_kv, int n_docs, bool provider) {
    dims d = dims_of(m, &(weft_batch){.T = T, .T_kv = T_kv, .n_docs = n_docs});
    weft_activations_reserve(m, keep_of(m, true), d, provider);
}

size_t weft_model_peak_bytes(const weft_model *m) { return m->acts ? m->acts->peak : 0; }
