#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/safetensors.h"

// ------------------------------------------------------------------------ parameter layout ----

static int add_param(weft_model *m, int cap, const char *name, int64_t rows, int64_t cols,
                     int layer) {
    WEFT_CHECK(m->n_params < cap, "internal: parameter table overflow");
    weft_param_info *p = &m->params[m->n_params];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->offset = m->n_elements;
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 0;
    p->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    p->weight_decay = p->ndim == 2;
    p->layer = layer;
    // Keep every tensor 64-byte aligned in the flat buffer for vector loads.
    m->n_elements += (p->numel + 15) / 16 * 16;
    return m->n_params++;
}

// The tensors of one decoder layer, named prefix + Hugging Face suffix.
static void add_decoder_layer(weft_model *m, int cap, weft_layer_params *lp, const char *prefix,
                              int layer) {
    const weft_model_config *c = &m->cfg;
    int C = c->hidden_size, I = c->intermediate_size;
    int qd = c->num_heads * c->head_dim, kvd = c->num_kv_heads * c->head_dim;
    char n[96];
#define P(field, suffix, rows, cols)                                                               \
    (snprintf(n, sizeof n, "%s%s", prefix, suffix), lp->field = add_param(m, cap, n, rows, cols, layer))
    P(input_norm, "input_layernorm.weight", C, 0);
    P(q_w, "self_attn.q_proj.weight", qd, C);
    P(k_w, "self_attn.k_proj.weight", kvd, C);
    P(v_w, "self_attn.v_proj.weight", kvd, C);
    if (c->attention_bias) {
        P(q_b, "self_attn.q_proj.bias", qd, 0);
        P(k_b, "self_attn.k_proj.bias", kvd, 0);
        P(v_b, "self_attn.v_proj.bias", kvd, 0);
    } else {
        lp->q_b = lp->k_b = lp->v_b = WEFT_ABSENT;
    }
    P(o_w, "self_attn.o_proj.weight", C, qd);
    P(post_norm, "post_attention_layernorm.weight", C, 0);
    P(gate_w, "mlp.gate_proj.weight", I, C);
    P(up_w, "mlp.up_proj.weight", I, C);
    P(down_w, "mlp.down_proj.weight", C, I);
#undef P
}

// Parameters are laid out in the order forward uses them: embedding, layers 0..L-1, final norm,
// MTP modules, lm_head. Gradient buckets later take this order reversed.
static void build_layout(weft_model *m) {
    const weft_model_config *c = &m->cfg;
    int C = c->hidden_size, L = c->num_layers, D = c->num_mtp;
    int cap = 3 + 12 * L + 16 * D;
    m->params = weft_alloc(sizeof(weft_param_info) * cap);
    m->layers = weft_alloc(sizeof(weft_layer_params) * (L + D));
    m->mtp = weft_alloc(sizeof(weft_mtp_params) * (D > 0 ? D : 1));
    m->embed = add_param(m, cap, "model.embed_tokens.weight", c->vocab_size, C, -1);
    char prefix[64], n[96];
    for (int l = 0; l < L; l++) {
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        add_decoder_layer(m, cap, &m->layers[l], prefix, l);
    }
    m->final_norm = add_param(m, cap, "model.norm.weight", C, 0, L);
    for (int k = 0; k < D; k++) {
        weft_mtp_params *mp = &m->mtp[k];
        int layer = L + 1 + k;
#define P(field, suffix, rows, cols)                                                               \
    (snprintf(n, sizeof n, "model.mtp_layers.%d.%s", k, suffix),                                   \
     mp->field = add_param(m, cap, n, rows, cols, layer))
        P(enorm, "enorm.weight", C, 0);
        P(hnorm, "hnorm.weight", C, 0);
        P(eh_proj, "eh_proj.weight", C, 2 * C);
        snprintf(prefix, sizeof prefix, "model.mtp_layers.%d.", k);
        add_decoder_layer(m, cap, &m->layers[L + k], prefix, layer);
        P(final_norm, "final_layernorm.weight", C, 0);
#undef P
    }
    m->lm_head = c->tie_word_embeddings
                     ? m->embed
                     : add_param(m, cap, "lm_head.weight", c->vocab_size, C, L + 1 + D);
}

bool weft_model_param_is_mtp(const weft_model *m, int i) {
    return strncmp(m->params[i].name, "model.mtp_layers.", 17) == 0;
}

weft_model *weft_model_create(weft_backend *be, const weft_model_config *cfg, size_t pad_multiple) {
    weft_model *m = weft_alloc(sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    build_layout(m);
    size_t q = pad_multiple > 0 ? pad_multiple : 1;
    m->n_padded = (m->n_elements + q - 1) / q * q;
    m->param_buf = be->alloc(be, m->n_padded * weft_dtype_size(be->param_dtype));
    m->grad_buf = be->alloc(be, m->n_padded * sizeof(float));
    return m;
}

void *weft_model_param(const weft_model *m, int i) {
    return (char *)m->param_buf + m->params[i].offset * weft_dtype_size(m->be->param_dtype);
}
float *weft_model_grad(const weft_model *m, int i) { return m->grad_buf + m->params[i].offset; }

const weft_param_info *weft_model_find_param(const weft_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

size_t weft_model_param_bytes(const weft_model *m) {
    return m->n_padded * weft_dtype_size(m->be->param_dtype);
}
size_t weft_model_grad_bytes(const weft_model *m) { return m->n_padded * sizeof(float); }

static void notify_grads_ready(weft_model *m, int first_param) {
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, first_param);
}

void weft_model_zero_grad(weft_model *m) { m->be->zero(m->be, m->grad_buf, weft_model_grad_bytes(m)); }

void weft_model_load_safetensors(weft_model *m, const char *path) {
    weft_safetensors *st = weft_safetensors_load(path);
    for (int i = 0; i < m->n_params; i++) {
        const weft_param_info *p = &m->params[i];
        const weft_st_tensor *t = weft_safetensors_find(st, p->name);
        WEFT_CHECK(t, "%s: missing tensor \"%s\"; the weights do not match config.json", path,
                   p->name);
        bool same = t->ndim == p->ndim && t->shape[0] == p->shape[0] &&
                    (p->ndim == 1 || t->shape[1] == p->shape[1]);
        WEFT_CHECK(same,
                   "%s: tensor \"%s\" has shape [%lld%s%lld] but config.json implies [%lld%s%lld]",
                   path, p->name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                   t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)p->shape[0],
                   p->ndim > 1 ? ", " : "", p->ndim > 1 ? (long long)p->shape[1] : 0LL);
        float *host = weft_alloc(p->numel * sizeof(float));
        weft_safetensors_read_f32(st, t, host);
        m->be->from_f32(m->be, weft_model_param(m, i), m->be->param_dtype, host, p->numel);
        weft_free(host);
    }
    weft_safetensors_free(st);
}

void weft_model_add_tensors(const weft_model *m, weft_safetensors_writer *w, const char *prefix,
                            const float *flat, size_t base) {
    char name[160];
    for (int i = 0; i < m->n_params; i++) {
        const weft_param_info *p = &m->params[i];
        float *host = weft_alloc(p->numel * sizeof(float));
        if (flat) m->be->to_host(m->be, host, flat + p->offset - base, p->numel * sizeof(float));
        else m->be->to_f32(m->be, host, weft_model_param(m, i), m->be->param_dtype, p->numel);
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        weft_safetensors_writer_add_f32(w, name, host, p->ndim, p->shape);
        weft_free(host);
    }
}

void weft_model_init_random(weft_model *m, uint64_t seed) {
    weft_rng rng;
    weft_rng_seed(&rng, seed);
    double out_std = 0.02 / sqrt(2.0 * m->cfg.num_layers);
    for (int i = 0; i < m->n_params; i++) {
        const weft_param_info *p = &m->params[i];
        float *host = weft_alloc(p->numel * sizeof(float));
        bool is_output = strstr(p->name, "o_proj.weight") || strstr(p->name, "down_proj.weight");
        bool is_norm = strstr(p->name, "norm") != NULL;
        for (size_t j = 0; j < p->numel; j++)
            host[j] = is_norm ? 1.0f
                    : p->ndim == 1 ? 0.0f
                                   : (float)(weft_rng_normal(&rng) * (is_output ? out_std : 0.02));
        m->be->from_f32(m->be, weft_model_param(m, i), m->be->param_dtype, host, p->numel);
        weft_free(host);
    }
}

// ----------------------------------------------------------------------------- activations ----

// What one decoder layer keeps for its backward pass.
typedef struct layer_acts {
    void *x_in;            // (T, C) layer input; always kept, it is where recomputation restarts
    void *ln1, *q, *k, *v; // (T, C), (T, H*D), (T, KV*D) x2; q and k after RoPE
    void *att;             // (T, H*D)
    float *lse, *rstd1;    // (H, T), (T)
    void *res1, *ln2;      // (T, C) residual after attention, its norm
    float *rstd2;          // (T)
    void *gate, *up, *act; // (T, I)
} layer_acts;

// One MTP module's tensors besides its decoder layer's (which live in layers[L + k]).
typedef struct mtp_acts {
    void *emb, *en, *hn;              // (T, C) Emb(shifted tokens), its norm, norm of h_{k-1}
    void *out, *h;                    // (T, C) the layer's output and h_k after final_layernorm
    float *rstd_e, *rstd_h, *rstd_f;  // (T)
    void *d_head;                     // (T, C) dL/dh_k through this depth's logits
    int32_t *inputs, *targets;        // (T) device copies of the batch's rows
} mtp_acts;

struct weft_activations {
    char *arena;
    size_t capacity, used;
    layer_acts *layers; // (L + D) without recomputation; with it, only x_in is kept per layer
    layer_acts scratch; // the one layer's worth recomputation works in
    mtp_acts *mtp;      // (D)
    void *x_out, *lnf, *logits;          // (T, C), (T, C), (T, V): one logits buffer for all heads
    float *rstdf, *row_loss, *correct;   // (T)
    void *d_head0;                       // (T, C) dL/d(lnf) through the main head
    void *d_res, *d_ln, *d_aux, *d_carry, *d_att, *d_q, *d_k, *d_v, *d_act, *d_gate, *d_up;
    // Context parallelism only: one layer's whole-document keys and values (2, T_kv, KV*D) and
    // their gradients, shared by all layers, so memory stays proportional to this rank's rows plus
    // one layer's keys. Each doubles as the exchange's scratch while the other is in use.
    void *k_full, *v_full, *dk_full, *dv_full;
    int kv_full_layer; // whose keys k_full holds now (-1: none), so backward gathers only if needed
    int32_t *tokens, *positions, *targets, *cu_seqlens, *cu_seqlens_kv;
    weft_attention_layout layout;
};

// Hands out 64-byte-aligned slices of the arena; with arena == NULL it only measures.
static void *take(weft_activations *a, size_t bytes) {
    size_t at = (a->used + 63) / 64 * 64;
    a->used = at + bytes;
    return a->arena ? a->arena + at : NULL;
}

// Keys and values (or their gradients) as one (2, rows, width) block, so the context-parallel
// exchange moves both in one collective: *k gets the first half, *v the second.
static void take_kv(weft_activations *a, size_t half_bytes, void **k, void **v) {
    *k = take(a, 2 * half_bytes);
    *v = *k ? (char *)*k + half_bytes : NULL;
}

static void carve_layer(weft_activations *a, layer_acts *la, const weft_model_config *c, int T,
                        size_t esz, bool inner) {
    size_t C = c->hidden_size, I = c->intermediate_size, qd = (size_t)c->num_heads * c->head_dim;
    size_t kvd = (size_t)c->num_kv_heads * c->head_dim;
    if (!inner) {
        la->x_in = take(a, esz * T * C);
        return;
    }
    la->ln1 = take(a, esz * T * C);
    la->q = take(a, esz * T * qd);
    take_kv(a, esz * T * kvd, &la->k, &la->v);
    la->att = take(a, esz * T * qd);
    la->lse = take(a, sizeof(float) * T * c->num_heads);
    la->rstd1 = take(a, sizeof(float) * T);
    la->res1 = take(a, esz * T * C);
    la->ln2 = take(a, esz * T * C);
    la->rstd2 = take(a, sizeof(float) * T);
    la->gate = take(a, esz * T * I);
    la->up = take(a, esz * T * I);
    la->act = take(a, esz * T * I);
}

static void carve(weft_activations *a, const weft_model_config *c, bool recompute, int T,
                  int T_kv, int n_docs, bool exchange, size_t esz) {
    size_t C = c->hidden_size, I = c->intermediate_size;
    size_t qd = (size_t)c->num_heads * c->head_dim, kvd = (size_t)c->num_kv_heads * c->head_dim;
    size_t row = esz * T * C, f32 = sizeof(float) * T, ids = sizeof(int32_t) * T;
    a->used = 0;
    for (int l = 0; l < c->num_layers + c->num_mtp; l++) {
        carve_layer(a, &a->layers[l], c, T, esz, false);
        if (!recompute) carve_layer(a, &a->layers[l], c, T, esz, true);
    }
    if (recompute) carve_layer(a, &a->scratch, c, T, esz, true);
    for (int k = 0; k < c->num_mtp; k++) {
        mtp_acts *mk = &a->mtp[k];
        mk->emb = take(a, row), mk->en = take(a, row), mk->hn = take(a, row);
        mk->out = take(a, row), mk->h = take(a, row), mk->d_head = take(a, row);
        mk->rstd_e = take(a, f32), mk->rstd_h = take(a, f32), mk->rstd_f = take(a, f32);
        mk->inputs = take(a, ids), mk->targets = take(a, ids);
    }
    a->x_out = take(a, row);
    a->lnf = take(a, row);
    a->logits = take(a, esz * T * c->vocab_size);
    a->rstdf = take(a, f32);
    a->row_loss = take(a, f32);
    a->correct = take(a, f32);
    a->d_head0 = take(a, row);
    a->d_res = take(a, row);
    a->d_ln = take(a, row);
    a->d_aux = take(a, row);
    a->d_carry = take(a, row);
    a->d_att = take(a, esz * T * qd);
    a->d_q = take(a, esz * T * qd);
    take_kv(a, esz * T * kvd, &a->d_k, &a->d_v);
    a->d_act = take(a, esz * T * I);
    a->d_gate = take(a, esz * T * I);
    a->d_up = take(a, esz * T * I);
    a->tokens = take(a, ids);
    a->positions = take(a, ids);
    a->targets = take(a, ids);
    a->cu_seqlens = take(a, sizeof(int32_t) * (n_docs + 1));
    a->cu_seqlens_kv = take(a, sizeof(int32_t) * (n_docs + 1));
    if (exchange) {
        take_kv(a, esz * T_kv * kvd, &a->k_full, &a->v_full);
        take_kv(a, esz * T_kv * kvd, &a->dk_full, &a->dv_full);
    }
}

// Sizes the arena for a micro-batch of T tokens; grows (never shrinks) so steady state allocates
// nothing. The peak is what the arena holds: every byte of activations lives in it.
static weft_activations *prepare_activations(weft_model *m, int T, int T_kv, int n_docs) {
    weft_activations *a = m->acts;
    if (!a) {
        a = m->acts = weft_alloc(sizeof *a);
        a->layers = weft_alloc(sizeof(layer_acts) * (m->cfg.num_layers + m->cfg.num_mtp));
        a->mtp = weft_alloc(sizeof(mtp_acts) * (m->cfg.num_mtp > 0 ? m->cfg.num_mtp : 1));
    }
    char *arena = a->arena;
    a->arena = NULL;
    carve(a, &m->cfg, m->recompute, T, T_kv, n_docs, m->kv_exchange != NULL,
          weft_dtype_size(m->be->act_dtype));
    size_t need = a->used;
    if (need > a->capacity) {
        if (arena) m->be->free(m->be, arena);
        arena = m->be->alloc(m->be, need);
        a->capacity = need;
    }
    a->arena = arena;
    carve(a, &m->cfg, m->recompute, T, T_kv, n_docs, m->kv_exchange != NULL,
          weft_dtype_size(m->be->act_dtype));
    if (need > m->peak_activation_bytes) m->peak_activation_bytes = need;
    return a;
}

size_t weft_model_activation_bytes(const weft_model *m, int T, int T_kv, int n_docs,
                                   bool exchange) {
    weft_activations a = {0};
    a.layers = weft_alloc(sizeof(layer_acts) * (m->cfg.num_layers + m->cfg.num_mtp));
    a.mtp = weft_alloc(sizeof(mtp_acts) * (m->cfg.num_mtp > 0 ? m->cfg.num_mtp : 1));
    carve(&a, &m->cfg, m->recompute, T, T_kv, n_docs, exchange, weft_dtype_size(m->be->act_dtype));
    weft_free(a.layers);
    weft_free(a.mtp);
    return a.used;
}

void weft_model_free(weft_model *m) {
    if (!m) return;
    if (m->acts) {
        if (m->acts->arena) m->be->free(m->be, m->acts->arena);
        weft_free(m->acts->layers);
        weft_free(m->acts->mtp);
        weft_free(m->acts);
    }
    m->be->free(m->be, m->param_buf);
    m->be->free(m->be, m->grad_buf);
    weft_free(m->params);
    weft_free(m->layers);
    weft_free(m->mtp);
    weft_free(m);
}

// ------------------------------------------------------------------------------- linear ops ----

// A weight as the matmul sees it: the (out, in) block starting at column `col` of parameter
// `param`, whose rows are `ld` elements apart. Whole Hugging Face matrices have col 0, ld = in;
// eh_proj's two halves are the views that turn a concatenated input into two products.
typedef struct weight_view {
    int param, col, ld;
} weight_view;

static weight_view whole(int param, int in) { return (weight_view){param, 0, in}; }

// y (T, out) = x (T, in) W^T + beta * y
static void linear_forward_view(weft_model *m, const void *x, weight_view w, void *y, int T, int in,
                                int out, float beta) {
    weft_backend *be = m->be;
    weft_matmul_types ty = {be->act_dtype, be->param_dtype, be->act_dtype};
    const char *wp = (const char *)weft_model_param(m, w.param) +
                     (size_t)w.col * weft_dtype_size(be->param_dtype);
    be->matmul(be, false, true, T, out, in, 1.0f, x, in, wp, w.ld, beta, y, out, ty);
}

// dx (T, in) = dy W + dx_beta * dx ; dW (out, in) += dy^T x
static void linear_backward_view(weft_model *m, const void *x, weight_view w, const void *dy,
                                 void *dx, int T, int in, int out, float dx_beta) {
    weft_backend *be = m->be;
    weft_matmul_types tx = {be->act_dtype, be->param_dtype, be->act_dtype};
    weft_matmul_types tw = {be->act_dtype, be->act_dtype, WEFT_F32};
    const char *wp = (const char *)weft_model_param(m, w.param) +
                     (size_t)w.col * weft_dtype_size(be->param_dtype);
    be->matmul(be, false, false, T, in, out, 1.0f, dy, out, wp, w.ld, dx_beta, dx, in, tx);
    be->matmul(be, true, false, out, in, T, 1.0f, dy, out, x, in, 1.0f,
               weft_model_grad(m, w.param) + w.col, w.ld, tw);
}

static void linear_forward(weft_model *m, const void *x, int w, void *y, int T, int in, int out,
                           float beta) {
    linear_forward_view(m, x, whole(w, in), y, T, in, out, beta);
}

static void linear_backward(weft_model *m, const void *x, int w, const void *dy, void *dx, int T,
                            int in, int out, float dx_beta) {
    linear_backward_view(m, x, whole(w, in), dy, dx, T, in, out, dx_beta);
}

// ------------------------------------------------------------------------- decoder layer ----

typedef struct dims {
    int T, C, I, H, KV, D, qd, kvd, n_docs;
} dims;

static dims dims_of(const weft_model *m, const weft_batch *b) {
    const weft_model_config *c = &m->cfg;
    return (dims){b->T,         c->hidden_size,  c->intermediate_size,
                  c->num_heads, c->num_kv_heads, c->head_dim,
                  c->num_heads * c->head_dim, c->num_kv_heads * c->head_dim, b->n_docs};
}

// Fills a->k_full / v_full with layer l's whole-document keys and values from every rank's rows.
static void gather_kv(weft_model *m, int l, const layer_acts *la, weft_activations *a, dims d) {
    if (a->kv_full_layer == l) return;
    const weft_kv_exchange *ex = m->kv_exchange;
    ex->gather(ex->ctx, la->k, a->k_full, d.kvd, a->dk_full); // dk_full is free until backward
    a->kv_full_layer = l;
}

// Computes everything the layer's backward needs from la->x_in, and the layer output into out.
static void layer_forward(weft_model *m, int l, layer_acts *la, weft_activations *a,
                          void *out, dims d) {
    weft_backend *be = m->be;
    const weft_layer_params *p = &m->layers[l];
    size_t esz = weft_dtype_size(be->act_dtype);
    double theta = m->cfg.rope_theta;
    float eps = (float)m->cfg.rms_norm_eps;

    be->rmsnorm_forward(be, la->x_in, weft_model_param(m, p->input_norm), eps, la->ln1, la->rstd1,
                        d.T, d.C);
    linear_forward(m, la->ln1, p->q_w, la->q, d.T, d.C, d.qd, 0.0f);
    linear_forward(m, la->ln1, p->k_w, la->k, d.T, d.C, d.kvd, 0.0f);
    linear_forward(m, la->ln1, p->v_w, la->v, d.T, d.C, d.kvd, 0.0f);
    if (p->q_b != WEFT_ABSENT) {
        be->bias_forward(be, la->q, weft_model_param(m, p->q_b), d.T, d.qd);
        be->bias_forward(be, la->k, weft_model_param(m, p->k_b), d.T, d.kvd);
        be->bias_forward(be, la->v, weft_model_param(m, p->v_b), d.T, d.kvd);
    }
    be->rope_forward(be, la->q, a->positions, theta, d.T, d.H, d.D);
    be->rope_forward(be, la->k, a->positions, theta, d.T, d.KV, d.D);
    const void *k = la->k, *v = la->v;
    if (m->kv_exchange) {
        gather_kv(m, l, la, a, d);
        k = a->k_full, v = a->v_full;
    }
    be->attention_forward(be, la->q, k, v, &a->layout, la->att, la->lse, d.H, d.KV, d.D);
    be->copy(be, la->res1, la->x_in, esz * d.T * d.C);
    linear_forward(m, la->att, p->o_w, la->res1, d.T, d.qd, d.C, 1.0f);

    be->rmsnorm_forward(be, la->res1, weft_model_param(m, p->post_norm), eps, la->ln2, la->rstd2,
                        d.T, d.C);
    linear_forward(m, la->ln2, p->gate_w, la->gate, d.T, d.C, d.I, 0.0f);
    linear_forward(m, la->ln2, p->up_w, la->up, d.T, d.C, d.I, 0.0f);
    be->swiglu_forward(be, la->gate, la->up, la->act, (size_t)d.T * d.I);
    be->copy(be, out, la->res1, esz * d.T * d.C);
    linear_forward(m, la->act, p->down_w, out, d.T, d.I, d.C, 1.0f);
}

// a->d_res holds dL/d(layer output) on entry and dL/d(layer input) on exit.
static void layer_backward(weft_model *m, int l, const layer_acts *la, weft_activations *a, dims d) {
    weft_backend *be = m->be;
    const weft_layer_params *p = &m->layers[l];
    double theta = m->cfg.rope_theta;

    // MLP: out = res1 + down(swiglu(gate(ln2), up(ln2)))
    linear_backward(m, la->act, p->down_w, a->d_res, a->d_act, d.T, d.I, d.C, 0.0f);
    be->swiglu_backward(be, la->gate, la->up, a->d_act, a->d_gate, a->d_up, (size_t)d.T * d.I);
    linear_backward(m, la->ln2, p->gate_w, a->d_gate, a->d_ln, d.T, d.C, d.I, 0.0f);
    linear_backward(m, la->ln2, p->up_w, a->d_up, a->d_ln, d.T, d.C, d.I, 1.0f);
    be->rmsnorm_backward(be, la->res1, weft_model_param(m, p->post_norm), la->rstd2, a->d_ln,
                         a->d_res, weft_model_grad(m, p->post_norm), d.T, d.C);

    // Attention: res1 = x_in + o(attn(rope(q), rope(k), v))
    linear_backward(m, la->att, p->o_w, a->d_res, a->d_att, d.T, d.qd, d.C, 0.0f);
    if (m->kv_exchange) {
        const weft_kv_exchange *ex = m->kv_exchange;
        gather_kv(m, l, la, a, d); // a no-op when this layer's keys are still there
        be->attention_backward(be, la->q, a->k_full, a->v_full, &a->layout, la->att, la->lse,
                               a->d_att, a->d_q, a->dk_full, a->dv_full, d.H, d.KV, d.D);
        ex->reduce_scatter(ex->ctx, a->dk_full, a->d_k, d.kvd, a->k_full); // k_full is spent
        a->kv_full_layer = -1;
    } else {
        be->attention_backward(be, la->q, la->k, la->v, &a->layout, la->att, la->lse, a->d_att,
                               a->d_q, a->d_k, a->d_v, d.H, d.KV, d.D);
    }
    be->rope_backward(be, a->d_q, a->positions, theta, d.T, d.H, d.D);
    be->rope_backward(be, a->d_k, a->positions, theta, d.T, d.KV, d.D);
    if (p->q_b != WEFT_ABSENT) {
        be->bias_backward(be, a->d_q, weft_model_grad(m, p->q_b), d.T, d.qd);
        be->bias_backward(be, a->d_k, weft_model_grad(m, p->k_b), d.T, d.kvd);
        be->bias_backward(be, a->d_v, weft_model_grad(m, p->v_b), d.T, d.kvd);
    }
    linear_backward(m, la->ln1, p->q_w, a->d_q, a->d_ln, d.T, d.C, d.qd, 0.0f);
    linear_backward(m, la->ln1, p->k_w, a->d_k, a->d_ln, d.T, d.C, d.kvd, 1.0f);
    linear_backward(m, la->ln1, p->v_w, a->d_v, a->d_ln, d.T, d.C, d.kvd, 1.0f);
    be->rmsnorm_backward(be, la->x_in, weft_model_param(m, p->input_norm), la->rstd1, a->d_ln,
                         a->d_res, weft_model_grad(m, p->input_norm), d.T, d.C);
}

// With recomputation a layer's inner activations live in the shared scratch set, refilled from
// the kept input; without it each layer has its own.
static layer_acts *inner_acts(weft_model *m, weft_activations *a, int l) {
    if (!m->recompute) return &a->layers[l];
    a->scratch.x_in = a->layers[l].x_in;
    return &a->scratch;
}

// One output head: logits (T, V) = h W_head^T, fused cross-entropy against targets (their
// gradient, scaled, replaces the logits), then straight away dh (T, C) = dlogits W_head and
// dW_head += dlogits^T h. Running each head's backward at once lets every head share one logits
// buffer.
static void head_forward_backward(weft_model *m, weft_activations *a, const void *h,
                                  const int32_t *targets, float scale, void *dh, dims d,
                                  weft_forward_stats *stats, int head, float *logits_host,
                                  float *row_loss_host) {
    weft_backend *be = m->be;
    int V = m->cfg.vocab_size;
    linear_forward(m, h, m->lm_head, a->logits, d.T, d.C, V, 0.0f);
    if (logits_host) be->to_f32(be, logits_host, a->logits, be->act_dtype, (size_t)d.T * V);
    be->cross_entropy(be, a->logits, targets, scale, a->row_loss, a->correct, d.T, V);
    stats->loss_sum[head] = be->sum_f32(be, a->row_loss, d.T);
    if (row_loss_host) be->to_host(be, row_loss_host, a->row_loss, sizeof(float) * d.T);
    stats->correct[head] = be->sum_f32(be, a->correct, d.T);
    linear_backward(m, h, m->lm_head, a->logits, dh, d.T, d.C, V, 0.0f);
}

// eh_proj's two halves: columns [0, C) read enorm(Emb(x)), columns [C, 2C) read hnorm(h_{k-1}).
static weight_view eh_half(const weft_model *m, int k, int half) {
    int C = m->cfg.hidden_size;
    return (weight_view){m->mtp[k].eh_proj, half * C, 2 * C};
}

// MTP module k (0-based): from h_prev (T, C) and the shifted tokens to h_k, its loss and dL/dh_k.
static void mtp_forward(weft_model *m, weft_activations *a, int k, const void *h_prev,
                        float scale, dims d, weft_forward_stats *stats) {
    weft_backend *be = m->be;
    const weft_mtp_params *p = &m->mtp[k];
    mtp_acts *mk = &a->mtp[k];
    int l = m->cfg.num_layers + k;
    float eps = (float)m->cfg.rms_norm_eps;
    be->embedding_forward(be, mk->inputs, weft_model_param(m, m->embed), mk->emb, d.T, d.C);
    be->rmsnorm_forward(be, mk->emb, weft_model_param(m, p->enorm), eps, mk->en, mk->rstd_e, d.T,
                        d.C);
    be->rmsnorm_forward(be, h_prev, weft_model_param(m, p->hnorm), eps, mk->hn, mk->rstd_h, d.T,
                        d.C);
    void *z = a->layers[l].x_in;
    linear_forward_view(m, mk->en, eh_half(m, k, 0), z, d.T, d.C, d.C, 0.0f);
    linear_forward_view(m, mk->hn, eh_half(m, k, 1), z, d.T, d.C, d.C, 1.0f);
    layer_forward(m, l, inner_acts(m, a, l), a, mk->out, d);
    be->rmsnorm_forward(be, mk->out, weft_model_param(m, p->final_norm), eps, mk->h, mk->rstd_f,
                        d.T, d.C);
    head_forward_backward(m, a, mk->h, mk->targets, scale, mk->d_head, d, stats, k + 1, NULL, NULL);
}

// On entry a->d_carry holds dL/dh_k from module k+1 (when there is one); on exit it holds
// dL/dh_{k-1} from this module.
static void mtp_backward(weft_model *m, weft_activations *a, int k, const void *h_prev, dims d) {
    weft_backend *be = m->be;
    const weft_mtp_params *p = &m->mtp[k];
    mtp_acts *mk = &a->mtp[k];
    int l = m->cfg.num_layers + k;
    size_t row = weft_dtype_size(be->act_dtype) * d.T * d.C;
    if (k + 1 < m->cfg.num_mtp) be->add_inplace(be, mk->d_head, a->d_carry, (size_t)d.T * d.C);
    be->zero(be, a->d_res, row);
    be->rmsnorm_backward(be, mk->out, weft_model_param(m, p->final_norm), mk->rstd_f, mk->d_head,
                         a->d_res, weft_model_grad(m, p->final_norm), d.T, d.C);
    layer_acts *la = inner_acts(m, a, l);
    if (m->recompute) layer_forward(m, l, la, a, mk->out, d); // out is free after its norm
    layer_backward(m, l, la, a, d);
    // a->d_res = dL/dz; split it through eh_proj's halves.
    linear_backward_view(m, mk->en, eh_half(m, k, 0), a->d_res, a->d_ln, d.T, d.C, d.C, 0.0f);
    linear_backward_view(m, mk->hn, eh_half(m, k, 1), a->d_res, a->d_aux, d.T, d.C, d.C, 0.0f);
    be->zero(be, a->d_res, row);
    be->rmsnorm_backward(be, mk->emb, weft_model_param(m, p->enorm), mk->rstd_e, a->d_ln, a->d_res,
                         weft_model_grad(m, p->enorm), d.T, d.C);
    be->embedding_backward(be, mk->inputs, a->d_res, weft_model_grad(m, m->embed), d.T, d.C);
    be->zero(be, a->d_carry, row);
    be->rmsnorm_backward(be, h_prev, weft_model_param(m, p->hnorm), mk->rstd_h, a->d_aux,
                         a->d_carry, weft_model_grad(m, p->hnorm), d.T, d.C);
}

weft_forward_stats weft_model_forward_backward(weft_model *m, const weft_batch *batch,
                                               const float *loss_scale,
                                               const weft_model_outputs *out) {
    weft_backend *be = m->be;
    dims d = dims_of(m, batch);
    int L = m->cfg.num_layers, D = m->cfg.num_mtp;
    size_t esz = weft_dtype_size(be->act_dtype), row = esz * d.T * d.C;
    WEFT_CHECK(batch->mtp_depth == D, "internal: batch built for %d MTP depths, model has %d",
               batch->mtp_depth, D);
    WEFT_CHECK(m->kv_exchange || batch->T_kv == batch->T,
               "internal: a batch of document chunks needs a key/value exchange");
    weft_activations *a = prepare_activations(m, d.T, batch->T_kv, d.n_docs);
    be->to_device(be, a->tokens, batch->tokens, sizeof(int32_t) * d.T);
    be->to_device(be, a->positions, batch->positions, sizeof(int32_t) * d.T);
    be->to_device(be, a->targets, batch->targets, sizeof(int32_t) * d.T);
    be->to_device(be, a->cu_seqlens, batch->cu_seqlens, sizeof(int32_t) * (d.n_docs + 1));
    be->to_device(be, a->cu_seqlens_kv, batch->cu_seqlens_kv, sizeof(int32_t) * (d.n_docs + 1));
    a->layout = (weft_attention_layout){.n_docs = d.n_docs, .Tq = d.T, .Tkv = batch->T_kv,
                                        .cu_q = a->cu_seqlens, .cu_kv = a->cu_seqlens_kv,
                                        .q_pos = a->positions};
    a->kv_full_layer = -1;
    for (int k = 0; k < D; k++) {
        be->to_device(be, a->mtp[k].inputs, weft_batch_mtp_inputs(batch, k + 1), sizeof(int32_t) * d.T);
        be->to_device(be, a->mtp[k].targets, weft_batch_mtp_targets(batch, k + 1), sizeof(int32_t) * d.T);
    }
    weft_forward_stats stats = {0};

    // Main decoder, its head, then the MTP modules in order (module k reads h_{k-1}).
    be->embedding_forward(be, a->tokens, weft_model_param(m, m->embed), a->layers[0].x_in, d.T, d.C);
    for (int l = 0; l < L; l++) {
        void *out = l + 1 < L ? a->layers[l + 1].x_in : a->x_out;
        layer_forward(m, l, inner_acts(m, a, l), a, out, d);
    }
    be->rmsnorm_forward(be, a->x_out, weft_model_param(m, m->final_norm),
                        (float)m->cfg.rms_norm_eps, a->lnf, a->rstdf, d.T, d.C);
    float *logprobs = out ? out->logprobs : NULL;
    head_forward_backward(m, a, a->lnf, a->targets, loss_scale[0], a->d_head0, d, &stats, 0,
                          out ? out->logits : NULL, logprobs);
    for (int t = 0; logprobs && t < d.T; t++)
        logprobs[t] = batch->targets[t] >= 0 ? -logprobs[t] : 0.0f;
    for (int k = 0; k < D; k++)
        mtp_forward(m, a, k, k == 0 ? a->lnf : a->mtp[k - 1].h, loss_scale[k + 1], d, &stats);

    // Backward: MTP modules last to first, carrying dL/dh_{k-1} down to the main head's input.
    // An untied head is the last tensor and complete once every head has run.
    if (m->lm_head != m->embed) notify_grads_ready(m, m->lm_head);
    for (int k = D - 1; k >= 0; k--) {
        mtp_backward(m, a, k, k == 0 ? a->lnf : a->mtp[k - 1].h, d);
        notify_grads_ready(m, m->mtp[k].enorm);
    }
    if (D > 0) be->add_inplace(be, a->d_head0, a->d_carry, (size_t)d.T * d.C);
    be->zero(be, a->d_res, row);
    be->rmsnorm_backward(be, a->x_out, weft_model_param(m, m->final_norm), a->rstdf, a->d_head0,
                         a->d_res, weft_model_grad(m, m->final_norm), d.T, d.C);
    notify_grads_ready(m, m->final_norm);
    for (int l = L - 1; l >= 0; l--) {
        layer_acts *la = inner_acts(m, a, l);
        if (m->recompute) layer_forward(m, l, la, a, a->x_out, d); // x_out is free by now
        layer_backward(m, l, la, a, d);
        notify_grads_ready(m, m->layers[l].input_norm);
    }
    be->embedding_backward(be, a->tokens, a->d_res, weft_model_grad(m, m->embed), d.T, d.C);
    notify_grads_ready(m, 0);
    return stats;
}
