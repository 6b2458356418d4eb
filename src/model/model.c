#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/internal.h"
#include "model/safetensors.h"

// ------------------------------------------------------------------------ parameter layout ----

// The most elements the flat parameter buffer may hold: 2^40 (4 TiB of fp32), far beyond any
// model weft can train, and low enough that every byte count derived from it fits a size_t.
#define MAX_ELEMENTS ((size_t)1 << 40)

static noreturn void too_large(const weft_model_config *c, const char *name) {
    weft_fatal("the model's sizes (vocab %d, hidden_size %d, intermediate_size %d, %d layers, "
               "%d heads of %d) need more than 2^40 parameters at tensor \"%s\"; check "
               "config.json or the model.* settings",
               c->vocab_size, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads,
               c->head_dim, name);
}

static int add_param(weft_model *m, int cap, const char *name, int64_t rows, int64_t cols,
                     int layer) {
    WEFT_CHECK(m->n_params < cap, "internal: parameter table overflow");
    weft_param_info *p = &m->params[m->n_params];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->offset = m->n_elements;
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 0;
    // Sizes come from files: every product and sum is checked, so a huge config is an error
    // rather than a wrapped, wrong allocation size.
    size_t numel, padded;
    if (rows < 0 || __builtin_mul_overflow((size_t)rows, (size_t)(cols > 0 ? cols : 1), &numel) ||
        numel > MAX_ELEMENTS || __builtin_add_overflow(m->n_elements, (numel + 15) / 16 * 16, &padded) ||
        padded > MAX_ELEMENTS)
        too_large(&m->cfg, name);
    p->numel = numel;
    p->weight_decay = p->ndim == 2;
    p->layer = layer;
    // Keep every tensor 64-byte aligned in the flat buffer for vector loads.
    m->n_elements = padded;
    return m->n_params++;
}

// The tensors of one decoder layer, named prefix + Hugging Face suffix.
static void add_decoder_layer(weft_model *m, int cap, weft_layer_params *lp, const char *prefix,
                              int layer) {
    const weft_model_config *c = &m->cfg;
    int64_t C = c->hidden_size, I = c->intermediate_size;
    int64_t qd = (int64_t)c->num_heads * c->head_dim, kvd = (int64_t)c->num_kv_heads * c->head_dim;
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
    // Before o_proj: backward tells its hook that o_proj's gradients and everything after them
    // are final while these are still to come.
    if (c->qk_norm) {
        P(q_norm, "self_attn.q_norm.weight", c->head_dim, 0);
        P(k_norm, "self_attn.k_norm.weight", c->head_dim, 0);
    } else {
        lp->q_norm = lp->k_norm = WEFT_ABSENT;
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
    int64_t C = c->hidden_size;
    int L = c->num_layers, D = c->num_mtp;
    // Validated sizes are below 2^30, but 14 tensors a layer would overflow an int: the table's
    // size is checked, and a layer count whose table would not fit is the too-large error.
    if (L < 0 || D < 0 || (int64_t)L + D > (INT32_MAX - 3) / 18) too_large(c, "model.layers");
    int cap = 3 + 14 * L + 18 * D;
    m->params = weft_alloc(sizeof(weft_param_info) * (size_t)cap);
    m->layers = weft_alloc(sizeof(weft_layer_params) * (size_t)(L + D > 0 ? L + D : 1));
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

weft_model *weft_model_create(weft_backend *be, const weft_model_config *cfg,
                              const weft_model_options *opt) {
    weft_model *m = weft_alloc(sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    m->opt = *opt;
    m->opt.drop_tensors = opt->drop_tensors ? weft_strdup(opt->drop_tensors) : NULL;
    build_layout(m);
    size_t q = opt->pad_multiple > 0 ? opt->pad_multiple : 1;
    m->n_padded = (m->n_elements + q - 1) / q * q;
    m->param_buf = be->alloc(be, m->n_padded * weft_dtype_size(be->param_dtype));
    m->grad_buf = be->alloc(be, m->n_padded * sizeof(float));
    // RoPE's frequencies, once: every rope scaling is this one table (and a factor).
    size_t half = (size_t)cfg->head_dim / 2;
    float *freq = weft_alloc(half * sizeof(float));
    weft_rope_table(cfg, freq, &m->rope_scale);
    m->rope_inv_freq = be->alloc(be, half * sizeof(float));
    be->to_device(be, m->rope_inv_freq, freq, half * sizeof(float));
    weft_free(freq);
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

int weft_model_heads(const weft_model *m) { return 1 + m->cfg.num_mtp; }

void weft_model_zero_grad(weft_model *m) { m->be->zero(m->be, m->grad_buf, weft_model_grad_bytes(m)); }

// "[8]", "[16, 32]", "[]": every dimension, none printed for a scalar.
static void format_shape(char *out, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

// Whether `list` (names separated by commas, spaces, brackets or quotes) holds name.
static bool listed(const char *list, const char *name) {
    static const char *const SEPARATORS = ", []\"'\t\n";
    size_t n = strlen(name);
    for (const char *s = list; s && *s;) {
        s += strspn(s, SEPARATORS);
        size_t len = strcspn(s, SEPARATORS);
        if (len == n && strncmp(s, name, n) == 0) return true;
        s += len;
    }
    return false;
}

// A tensor of the checkpoint that no parameter reads would be dropped without a word, leaving a
// different model than the checkpoint's (Qwen3's q_norm read as a Qwen2): each is an error naming
// it, unless the options list it. transformers' rotary inv_freq buffers are weft's RoPE table.
static void check_all_used(const weft_model *m, const weft_safetensors *st, const char *path) {
    for (int i = 0; i < st->n; i++) {
        const char *name = st->tensors[i].name;
        size_t len = strlen(name), buf = strlen("rotary_emb.inv_freq");
        bool rope_buffer = len >= buf && strcmp(name + len - buf, "rotary_emb.inv_freq") == 0;
        WEFT_CHECK(rope_buffer || weft_model_find_param(m, name) ||
                       listed(m->opt.drop_tensors, name),
                   "%s: tensor \"%s\" is not used by the model config.json describes; loading "
                   "would drop it and give a different model. Check config.json, or drop it on "
                   "purpose with model.drop_tensors=%s", path, name, name);
    }
}

void weft_model_load_safetensors(weft_model *m, const char *path) {
    weft_safetensors *st = weft_safetensors_load(path);
    check_all_used(m, st, path);
    for (int i = 0; i < m->n_params; i++) {
        const weft_param_info *p = &m->params[i];
        const weft_st_tensor *t = weft_safetensors_find(st, p->name);
        WEFT_CHECK(t, "%s: missing tensor \"%s\"; the weights do not match config.json", path,
                   p->name);
        bool same = t->ndim == p->ndim && t->shape[0] == p->shape[0] &&
                    (p->ndim == 1 || t->shape[1] == p->shape[1]);
        if (!same) {
            char got[96], want[96];
            format_shape(got, sizeof got, t->ndim, t->shape);
            format_shape(want, sizeof want, p->ndim, p->shape);
            weft_fatal("%s: tensor \"%s\" has shape %s but config.json implies %s; the weights "
                       "do not match config.json", path, p->name, got, want);
        }
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

void weft_model_free(weft_model *m) {
    if (!m) return;
    weft_activations_free(m);
    m->be->free(m->be, m->param_buf);
    m->be->free(m->be, m->grad_buf);
    m->be->free(m->be, m->rope_inv_freq);
    weft_free(m->params);
    weft_free(m->layers);
    weft_free(m->mtp);
    weft_free((char *)m->opt.drop_tensors);
    weft_free(m);
}

