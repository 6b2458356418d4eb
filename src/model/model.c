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
    int layer = m->params[i].layer, L = m->cfg.num_layers; // module k's tensors are at L + 1 + k
    return layer > L && layer <= L + m->cfg.num_mtp;
}

// ---------------------------------------------------------------------------- MTP names ----

// The MTP modules' own tensors under each scheme (weft_mtp_names); their decoder layers' tensors
// keep their suffixes.
static const char *const MTP_OWN[][3] = {
    {"enorm.weight", "token_layernorm.weight", "enorm.weight"},
    {"hnorm.weight", "hidden_layernorm.weight", "hnorm.weight"},
    {"eh_proj.weight", "input_proj.weight", "eh_proj.weight"},
    {"final_layernorm.weight", "final_layernorm.weight", "shared_head.norm.weight"},
};

// The name under `scheme` of module k's tensor whose weft suffix is `suffix`.
static void mtp_name(char *out, size_t cap, const weft_model *m, weft_mtp_names scheme, int k,
                     const char *suffix) {
    for (size_t i = 0; i < sizeof MTP_OWN / sizeof MTP_OWN[0]; i++)
        if (strcmp(suffix, MTP_OWN[i][0]) == 0) suffix = MTP_OWN[i][scheme];
    if (scheme == WEFT_MTP_NAMES_DEEPSEEK)
        snprintf(out, cap, "model.layers.%d.%s", m->cfg.num_layers + k, suffix);
    else
        snprintf(out, cap, "model.mtp_layers.%d.%s", k, suffix);
}

// DeepSeek-V3's per-module copies of the shared embedding (which = 0) and output head (1).
static void shared_copy_name(char *out, size_t cap, const weft_model *m, int k, int which) {
    snprintf(out, cap, "model.layers.%d.%s", m->cfg.num_layers + k,
             which ? "shared_head.head.weight" : "embed_tokens.weight");
}

// Renames the MTP tensors (built with weft's names) to the scheme the checkpoint uses, found by
// module 0's enorm, so loading reads them and every later write (checkpoints, gradients) uses the
// input's names.
static void adopt_mtp_names(weft_model *m, const weft_safetensors *st) {
    if (m->cfg.num_mtp == 0 || m->mtp_names != WEFT_MTP_NAMES_WEFT) return;
    char name[96];
    weft_mtp_names scheme = WEFT_MTP_NAMES_WEFT;
    for (int s = WEFT_MTP_NAMES_MIMO; s <= WEFT_MTP_NAMES_DEEPSEEK && !scheme; s++) {
        mtp_name(name, sizeof name, m, (weft_mtp_names)s, 0, "enorm.weight");
        if (weft_safetensors_find(st, name)) scheme = (weft_mtp_names)s;
    }
    if (!scheme) return; // weft's own names, or missing: the missing-tensor error names them
    for (int i = 0; i < m->n_params; i++) {
        int k, at;
        if (!weft_model_param_is_mtp(m, i) ||
            sscanf(m->params[i].name, "model.mtp_layers.%d.%n", &k, &at) != 1)
            continue;
        mtp_name(name, sizeof name, m, scheme, k, m->params[i].name + at);
        snprintf(m->params[i].name, sizeof m->params[i].name, "%s", name);
    }
    m->mtp_names = scheme;
    shared_copy_name(name, sizeof name, m, 0, 0);
    m->mtp_shared_copies = scheme == WEFT_MTP_NAMES_DEEPSEEK && weft_safetensors_find(st, name);
}

// Whether name is one of DeepSeek's per-module copies of the shared embedding and head.
static bool is_shared_copy(const weft_model *m, const char *name) {
    char copy[96];
    for (int k = 0; m->mtp_names == WEFT_MTP_NAMES_DEEPSEEK && k < m->cfg.num_mtp; k++)
        for (int which = 0; which < 2; which++) {
            shared_copy_name(copy, sizeof copy, m, k, which);
            if (strcmp(copy, name) == 0) return true;
        }
    return false;
}

// weft shares one embedding and one head between the main model and every MTP module, as
// DeepSeek-V3 does; a checkpoint's per-module copies must therefore equal them, else the model
// weft would train is not the file's.
static void check_shared_copies(const weft_model *m, const weft_safetensors *st, const char *path) {
    char copy[96];
    for (int k = 0; m->mtp_shared_copies && k < m->cfg.num_mtp; k++)
        for (int which = 0; which < 2; which++) {
            const weft_param_info *p = &m->params[which ? m->lm_head : m->embed];
            shared_copy_name(copy, sizeof copy, m, k, which);
            const weft_st_tensor *t = weft_safetensors_find(st, copy);
            WEFT_CHECK(t && weft_st_numel(t) == (int64_t)p->numel, "%s: tensor \"%s\" is missing "
                       "or not shaped like \"%s\", whose copy it is", path, copy, p->name);
            float *got = weft_alloc(p->numel * sizeof(float));
            float *want = weft_alloc(p->numel * sizeof(float));
            weft_safetensors_read_f32(st, t, got);
            m->be->to_f32(m->be, want, weft_model_param(m, (int)(p - m->params)),
                          m->be->param_dtype, p->numel);
            bool same = memcmp(got, want, p->numel * sizeof(float)) == 0;
            weft_free(got);
            weft_free(want);
            WEFT_CHECK(same, "%s: tensor \"%s\" differs from \"%s\"; weft shares the embedding "
                       "and output head with the MTP modules (as DeepSeek-V3 does) and cannot "
                       "train separate copies", path, copy, p->name);
        }
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
    m->grad_buf = opt->forward_only ? NULL : be->alloc(be, m->n_padded * sizeof(float));
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
float *weft_model_grad(const weft_model *m, int i) {
    WEFT_CHECK(m->grad_buf, "internal: a gradient of a model without its gradient buffer "
               "(forward_only, or released)");
    return m->grad_buf + m->params[i].offset;
}

const weft_param_info *weft_model_find_param(const weft_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

size_t weft_model_param_bytes(const weft_model *m) {
    return m->n_padded * weft_dtype_size(m->be->param_dtype);
}
size_t weft_model_grad_bytes(const weft_model *m) {
    return m->grad_buf ? m->n_padded * sizeof(float) : 0;
}

int weft_model_heads(const weft_model *m) { return 1 + m->cfg.num_mtp; }

void weft_model_zero_grad(weft_model *m) {
    WEFT_CHECK(m->grad_buf, "internal: zeroing the gradients of a model without its gradient "
               "buffer (forward_only, or released)");
    m->be->zero(m->be, m->grad_buf, weft_model_grad_bytes(m));
}

void weft_model_release_grad(weft_model *m) {
    WEFT_CHECK(m->grad_buf, "internal: releasing a gradient buffer the model does not hold");
    m->be->free(m->be, m->grad_buf);
    m->grad_buf = NULL;
}

void weft_model_release_activations(weft_model *m) { weft_activations_release(m); }

void weft_model_restore_grad(weft_model *m) {
    WEFT_CHECK(!m->grad_buf && !m->opt.forward_only,
               "internal: restoring a gradient buffer that was not released");
    m->grad_buf = m->be->alloc(m->be, m->n_padded * sizeof(float)); // zeroed
}

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
        WEFT_CHECK(rope_buffer || weft_model_find_param(m, name) || is_shared_copy(m, name) ||
                       listed(m->opt.drop_tensors, name),
                   "%s: tensor \"%s\" is not used by the model config.json describes; loading "
                   "would drop it and give a different model. Check config.json, or drop it on "
                   "purpose with model.drop_tensors=%s", path, name, name);
    }
}

void weft_model_load_safetensors(weft_model *m, const char *path) {
    weft_safetensors *st = weft_safetensors_open_model(path);
    adopt_mtp_names(m, st);
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
    check_shared_copies(m, st, path);
    weft_safetensors_free(st);
}

// Parameter i (or its slice of flat) as tensor `name`.
static void add_tensor(const weft_model *m, weft_safetensors_writer *w, const char *name, int i,
                       const float *flat, size_t base) {
    const weft_param_info *p = &m->params[i];
    float *host = weft_alloc(p->numel * sizeof(float));
    if (flat) m->be->to_host(m->be, host, flat + p->offset - base, p->numel * sizeof(float));
    else m->be->to_f32(m->be, host, weft_model_param(m, i), m->be->param_dtype, p->numel);
    weft_safetensors_writer_add_f32(w, name, host, p->ndim, p->shape);
    weft_free(host);
}

void weft_model_add_tensors(const weft_model *m, weft_safetensors_writer *w, const char *prefix,
                            const float *flat, size_t base) {
    char name[160];
    for (int i = 0; i < m->n_params; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, m->params[i].name);
        add_tensor(m, w, name, i, flat, base);
    }
    // The weights themselves written back with the checkpoint's DeepSeek-style copies, so the
    // output holds every tensor the input did.
    for (int k = 0; m->mtp_shared_copies && !prefix[0] && k < m->cfg.num_mtp; k++)
        for (int which = 0; which < 2; which++) {
            shared_copy_name(name, sizeof name, m, k, which);
            add_tensor(m, w, name, which ? m->lm_head : m->embed, flat, base);
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

