// The decoder's blocks over a packed batch: linear layers, a decoder layer (attention and MLP) and
// a multi-token-prediction module, forward and backward, in the activation arena of the pass.
#include "model/internal.h"

// ------------------------------------------------------------------------------- linear ops ----

static const void *weight_of(const weft_model *m, weight_view w) {
    return (const char *)weft_model_param(m, w.param) +
           (size_t)w.col * weft_dtype_size(m->be->param_dtype);
}

// Parameter id's values, or NULL for WEFT_ABSENT (a bias the model does not have).
static const void *param_or_null(const weft_model *m, int id) {
    return id == WEFT_ABSENT ? NULL : weft_model_param(m, id);
}

// y (T, out), rows ld_y apart, = x W^T + beta * c_in (NULL: y itself) + bias (NULL: none).
static void linear_into(weft_model *m, const void *x, weight_view w, float beta, const void *c_in,
                        const void *bias, void *y, int ld_y, int T, int in, int out) {
    weft_backend *be = m->be;
    weft_matmul_types ty = {be->act_dtype, be->param_dtype, be->act_dtype};
    be->matmul(be, false, true, T, out, in, 1.0f, x, in, weight_of(m, w), w.ld, beta, c_in, bias,
               y, ld_y, ty);
}

void weft_linear_forward(weft_model *m, const void *x, weight_view w, void *y, int T, int in,
                         int out, float beta) {
    linear_into(m, x, w, beta, NULL, NULL, y, out, T, in, out);
}

// y (T, out) = x W^T + b for parameters w and b (WEFT_ABSENT: no bias): the bias added in the
// matmul, which on a GPU's few-row products is the same launch.
static void linear_bias(weft_model *m, const void *x, int w, int b, void *y, int T, int in,
                        int out) {
    linear_into(m, x, whole_weight(w, in), 0.0f, NULL, param_or_null(m, b), y, out, T, in, out);
}

// weft_linear_backward for a dy whose rows are ld_dy apart.
static void linear_backward_rows(weft_model *m, const void *x, weight_view w, const void *dy,
                                 int ld_dy, void *dx, int T, int in, int out, float dx_beta) {
    weft_backend *be = m->be;
    weft_matmul_types tx = {be->act_dtype, be->param_dtype, be->act_dtype};
    weft_matmul_types tw = {be->act_dtype, be->act_dtype, WEFT_F32};
    be->matmul(be, false, false, T, in, out, 1.0f, dy, ld_dy, weight_of(m, w), w.ld, dx_beta,
               NULL, NULL, dx, in, tx);
    be->matmul(be, true, false, out, in, T, 1.0f, dy, ld_dy, x, in, 1.0f, NULL, NULL,
               weft_model_grad(m, w.param) + w.col, w.ld, tw);
}

void weft_linear_backward(weft_model *m, const void *x, weight_view w, const void *dy, void *dx,
                          int T, int in, int out, float dx_beta) {
    linear_backward_rows(m, x, w, dy, out, dx, T, in, out, dx_beta);
}

// y (T, out) = x W^T + residual, the residual read where it lies rather than copied into y first.
static void linear_residual(weft_model *m, const void *x, int w, const void *residual, void *y,
                            int T, int in, int out) {
    linear_into(m, x, whole_weight(w, in), 1.0f, residual, NULL, y, out, T, in, out);
}

static void linear_backward(weft_model *m, const void *x, int w, const void *dy, void *dx, int T,
                            int in, int out, float dx_beta) {
    weft_linear_backward(m, x, whole_weight(w, in), dy, dx, T, in, out, dx_beta);
}

// ---------------------------------------------------------------------- fused projections ----
//
// Projections of one input whose weights follow each other in the parameter buffer (and so in
// the gradient buffer) run as one product each way, as Megatron's fused fc1 and linear_qkv: the
// MLP's gate and up as one (2I, C) weight, q, k and v as one (qd + 2 kvd, C) weight (and their
// biases as one vector). Hugging Face's tensors lie in that order, each starting at a multiple
// of 16 elements, so they follow each other whenever their sizes are multiples of 16. Fewer,
// wider products: a decode step launches three matmuls (and two bias adds) fewer a layer, and
// on a GPU a batch of a few hundred rows gets more output tiles to spread over the SMs. Models
// whose tensors lie apart take one product a tensor.

// Whether the n tensors params[0..n) follow each other in the buffer.
static bool consecutive(const weft_model *m, const int *params, int n) {
    for (int i = 1; i < n; i++) {
        const weft_param_info *prev = &m->params[params[i - 1]];
        if (m->params[params[i]].offset != prev->offset + prev->numel) return false;
    }
    return true;
}

static bool gate_up_adjacent(const weft_model *m, const weft_layer_params *p) {
    return consecutive(m, (const int[]){p->gate_w, p->up_w}, 2);
}

// gate_up (T, 2I) = [x W_gate^T, x W_up^T] for x (T, C).
static void gate_up_forward(weft_model *m, const weft_layer_params *p, const void *x,
                            void *gate_up, dims d) {
    if (gate_up_adjacent(m, p)) {
        linear_into(m, x, whole_weight(p->gate_w, d.C), 0.0f, NULL, NULL, gate_up, 2 * d.I, d.T,
                    d.C, 2 * d.I);
        return;
    }
    char *up = (char *)gate_up + weft_dtype_size(m->be->act_dtype) * d.I;
    linear_into(m, x, whole_weight(p->gate_w, d.C), 0.0f, NULL, NULL, gate_up, 2 * d.I, d.T, d.C,
                d.I);
    linear_into(m, x, whole_weight(p->up_w, d.C), 0.0f, NULL, NULL, up, 2 * d.I, d.T, d.C, d.I);
}

// dx (T, C) = dL/dx through both projections from d_gate_up (T, 2I); their weights' gradients.
static void gate_up_backward(weft_model *m, const weft_layer_params *p, const void *x,
                             const void *d_gate_up, void *dx, dims d) {
    if (gate_up_adjacent(m, p)) {
        linear_backward_rows(m, x, whole_weight(p->gate_w, d.C), d_gate_up, 2 * d.I, dx, d.T,
                             d.C, 2 * d.I, 0.0f);
        return;
    }
    const char *d_up = (const char *)d_gate_up + weft_dtype_size(m->be->act_dtype) * d.I;
    linear_backward_rows(m, x, whole_weight(p->gate_w, d.C), d_gate_up, 2 * d.I, dx, d.T, d.C,
                         d.I, 0.0f);
    linear_backward_rows(m, x, whole_weight(p->up_w, d.C), d_up, 2 * d.I, dx, d.T, d.C, d.I, 1.0f);
}

// q, k and v as one product where their weights (and biases, if any) follow each other.
static bool qkv_fused(const weft_model *m, const weft_layer_params *p) {
    return consecutive(m, (const int[]){p->q_w, p->k_w, p->v_w}, 3) &&
           (p->q_b == WEFT_ABSENT || consecutive(m, (const int[]){p->q_b, p->k_b, p->v_b}, 3));
}

static weft_column_parts qkv_parts(void *q, void *k, void *v, dims d) {
    return (weft_column_parts){.part = {q, k, v}, .width = {d.qd, d.kvd, d.kvd}, .n = 3};
}

// ------------------------------------------------------------------------- decoder layer ----

// out (T, C) = RMSNorm of x (T, C) with the weights of parameter `norm`, and its rstd (T).
static void norm_rows(weft_model *m, const weft_activations *a, const void *x, int norm,
                      void *out, float *rstd) {
    m->be->rmsnorm_forward(m->be, x, weft_model_param(m, norm), (float)m->cfg.rms_norm_eps, out,
                           rstd, a->d.T, a->d.C);
}

// RMSNorm(x) with parameter `norm`, times parameter w (+ b), over the batch's rows.
static weft_norm_product norm_product_of(weft_model *m, const weft_activations *a, const void *x,
                                         int norm, int w, int b) {
    return (weft_norm_product){.x = x, .norm_w = weft_model_param(m, norm),
                               .w = weft_model_param(m, w), .bias = param_or_null(m, b),
                               .eps = (float)m->cfg.rms_norm_eps, .rows = a->d.T, .C = a->d.C};
}

// Through the backend's norm_product (internal.h).
bool weft_folded_norm_product(weft_model *m, const weft_activations *a, const void *x, int norm,
                              int w, int b, void *y, int out, bool swiglu) {
    weft_backend *be = m->be;
    if (a->keep != KEEP_NONE || !be->norm_product) return false;
    weft_norm_product np = norm_product_of(m, a, x, norm, w, b);
    return be->norm_product(be, &np, y, out, swiglu);
}

// A forward-only pass's q|k|v product of layer l's normed input and the provider's store of its
// rows in one op, where the provider and the backend have it; false: nothing done.
static bool stored_with_product(weft_model *m, const weft_layer_params *p, const layer_acts *la,
                                const weft_activations *a, int l, const weft_kv_provider *kv,
                                const weft_column_parts *parts, const weft_rope_rows *rope) {
    if (a->keep != KEEP_NONE || !kv->norm_product_store) return false;
    weft_norm_product np = norm_product_of(m, a, la->x_in, p->input_norm, p->q_w, p->q_b);
    return kv->norm_product_store(kv->ctx, l, &np, a->qkv, parts, rope);
}

// Fills a->k_full / v_full with every key row layer l's attention sees, through the provider.
static void gather_kv(int l, const layer_acts *la, weft_activations *a,
                      const weft_kv_provider *kv) {
    if (a->kv_full_layer == l) return;
    kv->gather(kv->ctx, l, la->k, a->k_full, a->d.kvd, a->dk_full); // dk_full: free until backward
    a->kv_full_layer = l;
}

layer_acts *weft_layer_acts(weft_model *m, weft_activations *a, int l) {
    if (a->keep == KEEP_ALL) return &a->layers[l];
    a->scratch.x_in = a->keep == KEEP_NONE ? a->ping[l & 1] : a->layers[l].x_in;
    return &a->scratch;
}

// The batch's RoPE on the first `heads` heads of each row.
static weft_rope_rows rope_of(const weft_model *m, const weft_activations *a, int heads) {
    return (weft_rope_rows){.positions = a->positions, .inv_freq = m->rope_inv_freq,
                            .scale = m->rope_scale, .heads = heads, .head_dim = a->d.D};
}

// RoPE on T rows ld apart, their first `heads` heads; backward: the inverse rotation.
static void rope_rows(weft_model *m, const weft_activations *a, void *x, int ld, int heads,
                      bool backward) {
    weft_backend *be = m->be;
    weft_rope_rows r = rope_of(m, a, heads);
    (backward ? be->rope_backward : be->rope_forward)(be, x, ld, r.positions, r.inv_freq, r.scale,
                                                      a->d.T, heads, r.head_dim);
}

// q (T, qd), k (T, kvd) and la->v = la->ln1 W^T (+ bias, in the matmul) of layer l, la->ln1
// the input norm of la->x_in. Fused (qkv_fused): one product into a->qkv, whose rows start with
// the q and k heads, so that with `rotate` the split turns both on the way (one launch), and a
// provider that stores keys may take the split over (split_store), storing them in the same
// launch; the norm may be folded into that product (ln1 then unwritten). Whether q and k come
// out rotated.
static bool project_qkv(weft_model *m, int l, const weft_layer_params *p, layer_acts *la,
                        weft_activations *a, void *q, void *k, bool rotate,
                        const weft_kv_provider *kv) {
    dims d = a->d;
    if (qkv_fused(m, p)) {
        int width = d.qd + 2 * d.kvd;
        weft_column_parts parts = qkv_parts(q, k, la->v, d);
        weft_rope_rows rope = rope_of(m, a, d.H + d.KV);
        bool stores = rotate && kv && kv->split_store;
        if (stores && stored_with_product(m, p, la, a, l, kv, &parts, &rope)) return rotate;
        if (!weft_folded_norm_product(m, a, la->x_in, p->input_norm, p->q_w, p->q_b, a->qkv,
                                      width, false)) {
            norm_rows(m, a, la->x_in, p->input_norm, la->ln1, la->rstd1);
            linear_bias(m, la->ln1, p->q_w, p->q_b, a->qkv, d.T, d.C, width);
        }
        if (stores) kv->split_store(kv->ctx, l, a->qkv, &parts, &rope);
        else m->be->split_columns(m->be, a->qkv, &parts, d.T, false, rotate ? &rope : NULL);
        return rotate;
    }
    norm_rows(m, a, la->x_in, p->input_norm, la->ln1, la->rstd1);
    linear_bias(m, la->ln1, p->q_w, p->q_b, q, d.T, d.C, d.qd);
    linear_bias(m, la->ln1, p->k_w, p->k_b, k, d.T, d.C, d.kvd);
    linear_bias(m, la->ln1, p->v_w, p->v_b, la->v, d.T, d.C, d.kvd);
    return false;
}

// Layer l's attention inputs from la->ln1: la->q and la->k (rotated), la->v (or the provider's
// store: project_qkv). With Qwen3's per-head norms, which come between the projection and the
// rotation, the projections land in q_pre / k_pre.
static void attention_inputs_forward(weft_model *m, int l, const weft_layer_params *p,
                                     layer_acts *la, weft_activations *a,
                                     const weft_kv_provider *kv) {
    weft_backend *be = m->be;
    dims d = a->d;
    bool qk_norm = p->q_norm != WEFT_ABSENT;
    bool rotated = project_qkv(m, l, p, la, a, qk_norm ? la->q_pre : la->q,
                               qk_norm ? la->k_pre : la->k, !qk_norm, kv);
    if (qk_norm) { // RMSNorm over each head's D values: T*H rows of width D, before RoPE
        float eps = (float)m->cfg.rms_norm_eps;
        be->rmsnorm_forward(be, la->q_pre, weft_model_param(m, p->q_norm), eps, la->q, la->rstd_q,
                            d.T * d.H, d.D);
        be->rmsnorm_forward(be, la->k_pre, weft_model_param(m, p->k_norm), eps, la->k, la->rstd_k,
                            d.T * d.KV, d.D);
    }
    if (!rotated) {
        rope_rows(m, a, la->q, d.qd, d.H, false);
        rope_rows(m, a, la->k, d.kvd, d.KV, false);
    }
}

// la->act = swiglu(la->ln2 W^T) for the gate and up weights, la->ln2 the post-attention norm of
// la->res1. A forward-only pass keeps no product for a backward, so where the weights are one
// tensor the backend may form both in one op (swiglu_product: one launch at a decode step's few
// rows), the norm folded in too where it can (ln2 then unwritten), with the same bits.
static void mlp_input_forward(weft_model *m, const weft_layer_params *p, layer_acts *la,
                              const weft_activations *a) {
    weft_backend *be = m->be;
    dims d = a->d;
    if (a->keep == KEEP_NONE && gate_up_adjacent(m, p)) {
        if (weft_folded_norm_product(m, a, la->res1, p->post_norm, p->gate_w, WEFT_ABSENT,
                                     la->act, d.I, true))
            return;
        norm_rows(m, a, la->res1, p->post_norm, la->ln2, la->rstd2);
        be->swiglu_product(be, la->ln2, weft_model_param(m, p->gate_w), la->gate_up, la->act,
                           d.T, d.C, d.I);
        return;
    }
    norm_rows(m, a, la->res1, p->post_norm, la->ln2, la->rstd2);
    gate_up_forward(m, p, la->ln2, la->gate_up, d);
    be->swiglu_forward(be, la->gate_up, la->act, d.T, d.I);
}

void weft_layer_forward(weft_model *m, int l, layer_acts *la, weft_activations *a, void *out,
                        const weft_kv_provider *kv) {
    weft_backend *be = m->be;
    const weft_layer_params *p = &m->layers[l];
    dims d = a->d;
    attention_inputs_forward(m, l, p, la, a, kv); // the input norm too
    const void *k = la->k, *v = la->v;
    if (kv && kv->attend) {
        kv->attend(kv->ctx, l, la->q, la->k, la->att, la->lse);
    } else {
        if (kv) {
            gather_kv(l, la, a, kv);
            k = a->k_full, v = a->v_full;
        }
        be->attention_forward(be, la->q, k, v, &a->layout, la->att, la->lse, d.H, d.KV, d.D);
    }
    linear_residual(m, la->att, p->o_w, la->x_in, la->res1, d.T, d.qd, d.C);
    mlp_input_forward(m, p, la, a); // the post-attention norm too
    linear_residual(m, la->act, p->down_w, la->res1, out, d.T, d.I, d.C);
}

// Attention's backward from a->d_att into a->d_q, d_k, d_v; through the provider's reduce-scatter
// when the keys came from it.
static void attention_backward(weft_model *m, int l, const layer_acts *la, weft_activations *a,
                               const weft_kv_provider *kv) {
    weft_backend *be = m->be;
    dims d = a->d;
    if (!kv) {
        be->attention_backward(be, la->q, la->k, la->v, &a->layout, la->att, la->lse, a->d_att,
                               a->d_q, a->d_k, a->d_v, d.H, d.KV, d.D);
        return;
    }
    WEFT_CHECK(kv->reduce_scatter && !kv->attend, "internal: a backward through a key/value "
               "provider that takes no gradients (a KV cache)");
    gather_kv(l, la, a, kv); // a no-op when this layer's keys are still there
    be->attention_backward(be, la->q, a->k_full, a->v_full, &a->layout, la->att, la->lse,
                           a->d_att, a->d_q, a->dk_full, a->dv_full, d.H, d.KV, d.D);
    kv->reduce_scatter(kv->ctx, l, a->dk_full, a->d_k, d.kvd, a->k_full); // k_full is spent
    a->kv_full_layer = -1;
}

// Qwen3's per-head norm backward, in place on d (rows, D): dL/d(normed) in, dL/d(projection) out.
// rmsnorm_backward adds into its dx (built for the residual stream), so it goes through the zeroed
// scratch and is copied back.
static void head_norm_backward(weft_model *m, const void *x, int w, const float *rstd, void *d,
                               void *scratch, int rows, int D) {
    weft_backend *be = m->be;
    size_t bytes = weft_dtype_size(be->act_dtype) * (size_t)rows * D;
    be->zero(be, scratch, bytes);
    be->rmsnorm_backward(be, x, weft_model_param(m, w), rstd, d, scratch, weft_model_grad(m, w),
                         rows, D);
    be->copy(be, d, scratch, bytes);
}

// project_qkv's backward: a->d_ln = dL/d(ln1), and the q, k and v weights' (and biases')
// gradients, from dL/d of the projections: in a->qkv when `joined`, else in a->d_q, d_k, d_v.
static void project_qkv_backward(weft_model *m, const weft_layer_params *p, const layer_acts *la,
                                 weft_activations *a, bool joined) {
    weft_backend *be = m->be;
    dims d = a->d;
    bool bias = p->q_b != WEFT_ABSENT;
    if (qkv_fused(m, p)) {
        int width = d.qd + 2 * d.kvd;
        weft_column_parts parts = qkv_parts(a->d_q, a->d_k, a->d_v, d);
        if (!joined) be->split_columns(be, a->qkv, &parts, d.T, true, NULL);
        if (bias) be->bias_backward(be, a->qkv, weft_model_grad(m, p->q_b), d.T, width);
        linear_backward(m, la->ln1, p->q_w, a->qkv, a->d_ln, d.T, d.C, width, 0.0f);
        return;
    }
    if (bias) {
        be->bias_backward(be, a->d_q, weft_model_grad(m, p->q_b), d.T, d.qd);
        be->bias_backward(be, a->d_k, weft_model_grad(m, p->k_b), d.T, d.kvd);
        be->bias_backward(be, a->d_v, weft_model_grad(m, p->v_b), d.T, d.kvd);
    }
    linear_backward(m, la->ln1, p->q_w, a->d_q, a->d_ln, d.T, d.C, d.qd, 0.0f);
    linear_backward(m, la->ln1, p->k_w, a->d_k, a->d_ln, d.T, d.C, d.kvd, 1.0f);
    linear_backward(m, la->ln1, p->v_w, a->d_v, a->d_ln, d.T, d.C, d.kvd, 1.0f);
}

// attention_inputs_forward's backward, from a->d_q, d_k, d_v (dL/d of the rotated q and k, and
// of v) to a->d_ln; d_q and d_k are spent. Without per-head norms the fused rows are joined and
// q's and k's gradients turned back in one launch.
static void attention_inputs_backward(weft_model *m, const weft_layer_params *p,
                                      const layer_acts *la, weft_activations *a) {
    weft_backend *be = m->be;
    dims d = a->d;
    bool qk_norm = p->q_norm != WEFT_ABSENT, joined = !qk_norm && qkv_fused(m, p);
    if (joined) {
        weft_column_parts parts = qkv_parts(a->d_q, a->d_k, a->d_v, d);
        weft_rope_rows rope = rope_of(m, a, d.H + d.KV);
        be->split_columns(be, a->qkv, &parts, d.T, true, &rope);
    } else {
        rope_rows(m, a, a->d_q, d.qd, d.H, true);
        rope_rows(m, a, a->d_k, d.kvd, d.KV, true);
    }
    if (qk_norm) {
        head_norm_backward(m, la->q_pre, p->q_norm, la->rstd_q, a->d_q, a->d_qk_pre, d.T * d.H,
                           d.D);
        head_norm_backward(m, la->k_pre, p->k_norm, la->rstd_k, a->d_k, a->d_qk_pre, d.T * d.KV,
                           d.D);
    }
    project_qkv_backward(m, p, la, a, joined);
}

void weft_layer_backward(weft_model *m, int l, const layer_acts *la, weft_activations *a,
                         const weft_pass_options *pass) {
    weft_backend *be = m->be;
    const weft_kv_provider *kv = pass ? pass->kv : NULL;
    const weft_layer_params *p = &m->layers[l];
    dims d = a->d;

    // MLP: out = res1 + down(swiglu(gate(ln2), up(ln2)))
    linear_backward(m, la->act, p->down_w, a->d_res, a->d_act, d.T, d.I, d.C, 0.0f);
    be->swiglu_backward(be, la->gate_up, a->d_act, a->d_gate_up, d.T, d.I);
    gate_up_backward(m, p, la->ln2, a->d_gate_up, a->d_ln, d);
    be->rmsnorm_backward(be, la->res1, weft_model_param(m, p->post_norm), la->rstd2, a->d_ln,
                         a->d_res, weft_model_grad(m, p->post_norm), d.T, d.C);
    weft_notify_grads_ready(pass, p->post_norm);

    // Attention: res1 = x_in + o(attn(rope(q), rope(k), v))
    linear_backward(m, la->att, p->o_w, a->d_res, a->d_att, d.T, d.qd, d.C, 0.0f);
    weft_notify_grads_ready(pass, p->o_w);
    attention_backward(m, l, la, a, kv);
    attention_inputs_backward(m, p, la, a);
    be->rmsnorm_backward(be, la->x_in, weft_model_param(m, p->input_norm), la->rstd1, a->d_ln,
                         a->d_res, weft_model_grad(m, p->input_norm), d.T, d.C);
}

// ---------------------------------------------------------------------------- MTP module ----

// eh_proj's two halves: half 0 reads enorm(Emb(x)), half 1 hnorm(h_{k-1}); columns [0, C) are
// half 0's, except in MiMo's input_proj, which reads [hidden; embedding].
static weight_view eh_half(const weft_model *m, int k, int half) {
    int C = m->cfg.hidden_size, col = m->mtp_names == WEFT_MTP_NAMES_MIMO ? 1 - half : half;
    return (weight_view){m->mtp[k].eh_proj, col * C, 2 * C};
}

// MTP module k's parameters, activations and decoder layer index.
typedef struct mtp_module {
    const weft_mtp_params *p;
    mtp_acts *mk;
    int layer;
} mtp_module;

static mtp_module module_of(const weft_model *m, weft_activations *a, int k) {
    return (mtp_module){&m->mtp[k], &a->mtp[k], m->cfg.num_layers + k};
}

void weft_mtp_forward(weft_model *m, weft_activations *a, int k, const void *h_prev,
                      const weft_kv_provider *kv) {
    weft_backend *be = m->be;
    mtp_module mod = module_of(m, a, k);
    const weft_mtp_params *p = mod.p;
    mtp_acts *mk = mod.mk;
    dims d = a->d;
    int l = mod.layer;
    float eps = (float)m->cfg.rms_norm_eps;
    be->embedding_forward(be, mk->inputs, weft_model_param(m, m->embed), mk->emb, d.T, d.C);
    be->rmsnorm_forward(be, mk->emb, weft_model_param(m, p->enorm), eps, mk->en, mk->rstd_e, d.T,
                        d.C);
    be->rmsnorm_forward(be, h_prev, weft_model_param(m, p->hnorm), eps, mk->hn, mk->rstd_h, d.T,
                        d.C);
    layer_acts *la = weft_layer_acts(m, a, l);
    weft_linear_forward(m, mk->en, eh_half(m, k, 0), la->x_in, d.T, d.C, d.C, 0.0f);
    weft_linear_forward(m, mk->hn, eh_half(m, k, 1), la->x_in, d.T, d.C, d.C, 1.0f);
    weft_layer_forward(m, l, la, a, mk->out, kv);
    be->rmsnorm_forward(be, mk->out, weft_model_param(m, p->final_norm), eps, mk->h, mk->rstd_f,
                        d.T, d.C);
}

void weft_mtp_backward(weft_model *m, weft_activations *a, int k, const void *h_prev,
                       const weft_pass_options *pass) {
    const weft_kv_provider *kv = pass ? pass->kv : NULL;
    weft_backend *be = m->be;
    mtp_module mod = module_of(m, a, k);
    dims d = a->d;
    const weft_mtp_params *p = mod.p;
    mtp_acts *mk = mod.mk;
    int l = mod.layer;
    size_t row = weft_dtype_size(be->act_dtype) * d.T * d.C;
    if (k + 1 < m->cfg.num_mtp) be->add_inplace(be, mk->d_head, a->d_carry, (size_t)d.T * d.C);
    be->zero(be, a->d_res, row);
    be->rmsnorm_backward(be, mk->out, weft_model_param(m, p->final_norm), mk->rstd_f, mk->d_head,
                         a->d_res, weft_model_grad(m, p->final_norm), d.T, d.C);
    layer_acts *la = weft_layer_acts(m, a, l);
    if (a->keep == KEEP_INPUTS) weft_layer_forward(m, l, la, a, mk->out, kv); // out is free now
    weft_layer_backward(m, l, la, a, pass);
    // a->d_res = dL/dz; split it through eh_proj's halves.
    weft_linear_backward(m, mk->en, eh_half(m, k, 0), a->d_res, a->d_ln, d.T, d.C, d.C, 0.0f);
    weft_linear_backward(m, mk->hn, eh_half(m, k, 1), a->d_res, a->d_aux, d.T, d.C, d.C, 0.0f);
    be->zero(be, a->d_res, row);
    be->rmsnorm_backward(be, mk->emb, weft_model_param(m, p->enorm), mk->rstd_e, a->d_ln, a->d_res,
                         weft_model_grad(m, p->enorm), d.T, d.C);
    be->embedding_backward(be, mk->inputs, a->d_res, weft_model_grad(m, m->embed), d.T, d.C);
    be->zero(be, a->d_carry, row);
    be->rmsnorm_backward(be, h_prev, weft_model_param(m, p->hnorm), mk->rstd_h, a->d_aux,
                         a->d_carry, weft_model_grad(m, p->hnorm), d.T, d.C);
}
