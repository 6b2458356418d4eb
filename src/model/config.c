#include "model/config.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <stddef.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

static int get_int(json_t *root, const char *path, const char *key, bool required, int fallback) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        WEFT_CHECK(!required, "%s: missing \"%s\"; add it to the model's config.json", path, key);
        return fallback;
    }
    WEFT_CHECK(json_is_integer(v), "%s: \"%s\" must be an integer", path, key);
    json_int_t x = json_integer_value(v);
    WEFT_CHECK(x > 0 && x < (1 << 30), "%s: \"%s\" = %lld is out of range", path, key, (long long)x);
    return (int)x;
}

static double get_real(json_t *root, const char *path, const char *key, double fallback) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return fallback;
    WEFT_CHECK(json_is_number(v), "%s: \"%s\" must be a number", path, key);
    return json_number_value(v);
}

static bool get_bool(json_t *root, const char *path, const char *key, bool fallback) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return fallback;
    WEFT_CHECK(json_is_boolean(v), "%s: \"%s\" must be true or false", path, key);
    return json_is_true(v);
}

// ----------------------------------------------------------------------------- families ----

static const struct {
    const char *architecture, *model_type;
    weft_model_family family;
} FAMILIES[] = {
    {"Qwen2ForCausalLM", "qwen2", WEFT_FAMILY_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", WEFT_FAMILY_QWEN3},
    {"LlamaForCausalLM", "llama", WEFT_FAMILY_LLAMA},
    {"MiMoForCausalLM", "mimo", WEFT_FAMILY_MIMO},
};
enum { N_FAMILIES = sizeof FAMILIES / sizeof FAMILIES[0] };
#define SUPPORTED                                                                                  \
    "weft implements Qwen2ForCausalLM (qwen2, Qwen2.5 too), Qwen3ForCausalLM (qwen3), "            \
    "LlamaForCausalLM (llama) and MiMoForCausalLM (mimo)"

// A config's string field, NULL when absent; anything but a string is an error naming it.
static const char *get_string(json_t *root, const char *path, const char *key) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return NULL;
    WEFT_CHECK(json_is_string(v), "%s: \"%s\" must be a string", path, key);
    return json_string_value(v);
}

// Whether s holds one of the lower-case words, ignoring case.
static bool contains_any(const char *s, const char *const *words, int n) {
    char low[128];
    size_t len = s ? strlen(s) : 0;
    if (len >= sizeof low) len = sizeof low - 1;
    for (size_t i = 0; i < len; i++) low[i] = (char)tolower((unsigned char)s[i]);
    low[len] = 0;
    for (int i = 0; s && i < n; i++)
        if (strstr(low, words[i])) return true;
    return false;
}

// Mixture-of-experts models share names with weft's families (qwen2_moe, Qwen3MoeForCausalLM)
// and fail later as "missing tensor mlp.gate_proj"; they are told so up front.
static void refuse_moe(json_t *root, const char *path, const char *arch, const char *type) {
    static const char *const moe_words[] = {"moe", "mixtral", "deepseek_v2", "deepseek_v3",
                                            "deepseekv2", "deepseekv3", "dbrx", "jamba"};
    static const char *const expert_keys[] = {"num_experts", "num_local_experts",
                                              "n_routed_experts", "moe_intermediate_size"};
    int n_words = (int)(sizeof moe_words / sizeof moe_words[0]);
    const char *moe = contains_any(arch, moe_words, n_words)   ? arch
                      : contains_any(type, moe_words, n_words) ? type
                                                               : NULL;
    for (size_t i = 0; !moe && i < sizeof expert_keys / sizeof expert_keys[0]; i++) {
        json_t *v = json_object_get(root, expert_keys[i]);
        if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 0))
            moe = expert_keys[i];
    }
    WEFT_CHECK(!moe, "%s: \"%s\" says this is a mixture-of-experts (MoE) model; MoE is not "
               "supported (%s)", path, moe, SUPPORTED);
}

// The family named by "architectures" (its first entry) and "model_type"; a config naming neither
// is weft's own Qwen2.
static weft_model_family read_family(json_t *root, const char *path) {
    json_t *archs = json_object_get(root, "architectures");
    WEFT_CHECK(!archs || json_is_null(archs) ||
                   (json_is_array(archs) && json_array_size(archs) >= 1 &&
                    json_is_string(json_array_get(archs, 0))),
               "%s: \"architectures\" must be a list of names, e.g. [\"LlamaForCausalLM\"]", path);
    const char *arch = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    const char *type = get_string(root, path, "model_type");
    refuse_moe(root, path, arch, type);
    int by_arch = -1, by_type = -1;
    for (int i = 0; i < N_FAMILIES; i++) {
        if (arch && strcmp(arch, FAMILIES[i].architecture) == 0) by_arch = i;
        if (type && strcmp(type, FAMILIES[i].model_type) == 0) by_type = i;
    }
    WEFT_CHECK(!arch || by_arch >= 0, "%s: architecture \"%s\" is not one weft implements; %s",
               path, arch, SUPPORTED);
    WEFT_CHECK(!type || by_type >= 0, "%s: model_type \"%s\" is not one weft implements; %s",
               path, type, SUPPORTED);
    WEFT_CHECK(by_arch < 0 || by_type < 0 || by_arch == by_type,
               "%s: architectures says %s but model_type says \"%s\"; they must name one family",
               path, arch, type);
    int i = by_arch >= 0 ? by_arch : by_type;
    return i >= 0 ? FAMILIES[i].family : WEFT_FAMILY_QWEN2;
}

// Fields that change the math and that weft does not implement, each refused by name.
static void refuse_unimplemented(json_t *root, const char *path) {
    const char *act = get_string(root, path, "hidden_act");
    WEFT_CHECK(!act || strcmp(act, "silu") == 0 || strcmp(act, "swish") == 0,
               "%s: hidden_act \"%s\" is not implemented; weft's MLP is SwiGLU (hidden_act "
               "\"silu\")", path, act);
    WEFT_CHECK(!get_bool(root, path, "mlp_bias", false),
               "%s: mlp_bias true (biases on gate/up/down_proj) is not implemented", path);
    WEFT_CHECK(!get_bool(root, path, "use_sliding_window", false),
               "%s: use_sliding_window true (sliding-window attention) is not implemented; weft "
               "attends to the whole document", path);
    json_t *types = json_object_get(root, "layer_types");
    for (size_t i = 0; json_is_array(types) && i < json_array_size(types); i++) {
        const char *t = json_string_value(json_array_get(types, i));
        WEFT_CHECK(t && strcmp(t, "full_attention") == 0,
                   "%s: layer_types[%zu] = \"%s\" is not implemented; weft implements "
                   "\"full_attention\" layers only", path, i, t ? t : "(not a string)");
    }
    double partial = get_real(root, path, "partial_rotary_factor", 1.0);
    WEFT_CHECK(partial == 1.0, "%s: partial_rotary_factor %g is not implemented; weft rotates "
               "the whole head (1.0)", path, partial);
    double dropout = get_real(root, path, "attention_dropout", 0.0);
    WEFT_CHECK(dropout == 0.0, "%s: attention_dropout %g is not implemented; set it to 0.0",
               path, dropout);
}

// Biases by family: Qwen2 and MiMo always have q/k/v biases (weft's own configs may turn them off
// with attention_bias false); Llama's and Qwen3's attention_bias would also put one on o_proj,
// which weft does not implement.
static bool read_attention_bias(json_t *root, const char *path, weft_model_family f) {
    if (f == WEFT_FAMILY_QWEN2 || f == WEFT_FAMILY_MIMO)
        return get_bool(root, path, "attention_bias", true);
    WEFT_CHECK(!get_bool(root, path, "attention_bias", false),
               "%s: attention_bias true (biases on q/k/v and o_proj) is not implemented for %s",
               path, f == WEFT_FAMILY_LLAMA ? "LlamaForCausalLM" : "Qwen3ForCausalLM");
    return false;
}

// ----------------------------------------------------------------------------- rope_scaling ----

static double scaling_real(json_t *rs, const char *path, const char *key, bool required) {
    json_t *v = json_object_get(rs, key);
    WEFT_CHECK(!required || (v && !json_is_null(v)),
               "%s: rope_scaling lacks \"%s\", which its type needs", path, key);
    if (!v || json_is_null(v)) return 0.0;
    WEFT_CHECK(json_is_number(v) && json_number_value(v) > 0,
               "%s: rope_scaling.%s must be a positive number", path, key);
    return json_number_value(v);
}

// Every key a type reads; any other key is refused, since it could only mean math weft skips.
static void check_scaling_keys(json_t *rs, const char *path, const char *type,
                               const char *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach(rs, key, v) {
        char padded[80];
        snprintf(padded, sizeof padded, " %s ", key);
        WEFT_CHECK(strstr(allowed, padded), "%s: rope_scaling.%s is not implemented for "
                   "rope_type \"%s\" (weft reads:%s)", path, key, type, allowed);
    }
}

static void read_rope_scaling(json_t *root, const char *path, weft_rope_scaling *s) {
    *s = (weft_rope_scaling){0};
    json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs)) return;
    WEFT_CHECK(json_is_object(rs), "%s: rope_scaling must be an object or null", path);
    // transformers reads "rope_type", and "type" in older configs.
    const char *type = get_string(rs, path, "rope_type");
    if (!type) type = get_string(rs, path, "type");
    WEFT_CHECK(type, "%s: rope_scaling names no rope_type", path);
    if (strcmp(type, "default") == 0) {
        check_scaling_keys(rs, path, type, " rope_type type ");
    } else if (strcmp(type, "linear") == 0) {
        check_scaling_keys(rs, path, type, " rope_type type factor ");
        *s = (weft_rope_scaling){.type = WEFT_ROPE_LINEAR,
                                 .factor = scaling_real(rs, path, "factor", true)};
    } else if (strcmp(type, "llama3") == 0) {
        check_scaling_keys(rs, path, type, " rope_type type factor low_freq_factor "
                           "high_freq_factor original_max_position_embeddings ");
        *s = (weft_rope_scaling){
            .type = WEFT_ROPE_LLAMA3, .factor = scaling_real(rs, path, "factor", true),
            .low_freq_factor = scaling_real(rs, path, "low_freq_factor", true),
            .high_freq_factor = scaling_real(rs, path, "high_freq_factor", true),
            .original_max_position_embeddings =
                get_int(rs, path, "original_max_position_embeddings", true, 0)};
        WEFT_CHECK(s->high_freq_factor > s->low_freq_factor, "%s: rope_scaling.high_freq_factor "
                   "must be larger than low_freq_factor", path);
    } else if (strcmp(type, "yarn") == 0) {
        check_scaling_keys(rs, path, type, " rope_type type factor attention_factor beta_fast "
                           "beta_slow mscale mscale_all_dim original_max_position_embeddings "
                           "truncate ");
        *s = (weft_rope_scaling){
            .type = WEFT_ROPE_YARN, .factor = scaling_real(rs, path, "factor", true),
            .attention_factor = scaling_real(rs, path, "attention_factor", false),
            .beta_fast = scaling_real(rs, path, "beta_fast", false),
            .beta_slow = scaling_real(rs, path, "beta_slow", false),
            .mscale = scaling_real(rs, path, "mscale", false),
            .mscale_all_dim = scaling_real(rs, path, "mscale_all_dim", false),
            .original_max_position_embeddings =
                get_int(rs, path, "original_max_position_embeddings", false, 0),
            .no_truncate = !get_bool(rs, path, "truncate", true)};
    } else {
        weft_fatal("%s: rope_scaling rope_type \"%s\" is not implemented; weft implements "
                   "default, linear, llama3 and yarn", path, type);
    }
}

// ---------------------------------------------------------------------------------- load ----

// An "eos_token_id" (an id, a list of them, or null) into cfg->end_ids.
static void read_end_ids(json_t *v, const char *path, weft_model_config *cfg) {
    cfg->n_end_ids = 0;
    if (!v || json_is_null(v)) return;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    WEFT_CHECK(n <= WEFT_MAX_END_IDS, "%s: \"eos_token_id\" lists %zu ids; weft stops at up to %d",
               path, n, WEFT_MAX_END_IDS);
    for (size_t i = 0; i < n; i++) {
        json_t *id = json_is_array(v) ? json_array_get(v, i) : v;
        WEFT_CHECK(json_is_integer(id), "%s: \"eos_token_id\" must be an integer or a list of them",
                   path);
        json_int_t x = json_integer_value(id);
        WEFT_CHECK(x >= 0 && x < cfg->vocab_size,
                   "%s: \"eos_token_id\" = %lld is outside the vocabulary [0, %d)", path,
                   (long long)x, cfg->vocab_size);
        cfg->end_ids[cfg->n_end_ids++] = (int)x;
    }
}

// generation_config.json beside the config.json at path, where it names end-of-text ids, decides
// where generation stops (its other fields, sampling defaults, are not read: weft's sampling.*
// settings are the whole of what samples).
static void read_generation_end_ids(const char *config_path, weft_model_config *cfg) {
    const char *slash = strrchr(config_path, '/');
    int dir_len = slash ? (int)(slash - config_path) + 1 : 0;
    size_t size = (size_t)dir_len + sizeof "generation_config.json";
    char *path = weft_alloc(size);
    snprintf(path, size, "%.*sgeneration_config.json", dir_len, config_path);
    if (access(path, F_OK) != 0) {
        weft_free(path);
        return;
    }
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    WEFT_CHECK(json_is_object(root), "%s: not a JSON object (%s); fix or remove the file", path,
               root ? "another JSON value" : err.text);
    json_t *v = json_object_get(root, "eos_token_id");
    if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
        read_end_ids(v, path, cfg);
    json_decref(root);
    weft_free(path);
}

void weft_model_config_load(const char *path, weft_model_config *cfg) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    WEFT_CHECK(root, "%s%s%.0d: %s; the model directory needs a valid Hugging Face config.json",
               path, err.line > 0 ? ":" : "", err.line > 0 ? err.line : 0, err.text);
    WEFT_CHECK(json_is_object(root), "%s: expected a JSON object", path);
    weft_model_family family = read_family(root, path);
    refuse_unimplemented(root, path);
    *cfg = (weft_model_config){
        .vocab_size = get_int(root, path, "vocab_size", true, 0),
        .hidden_size = get_int(root, path, "hidden_size", true, 0),
        .intermediate_size = get_int(root, path, "intermediate_size", true, 0),
        .num_layers = get_int(root, path, "num_hidden_layers", true, 0),
        .num_heads = get_int(root, path, "num_attention_heads", true, 0),
        .rope_theta = get_real(root, path, "rope_theta", 10000.0),
        .rms_norm_eps = get_real(root, path, "rms_norm_eps", 1e-6),
        .tie_word_embeddings = get_bool(root, path, "tie_word_embeddings", false),
        .attention_bias = read_attention_bias(root, path, family),
        .family = family,
        .qk_norm = family == WEFT_FAMILY_QWEN3,
    };
    read_rope_scaling(root, path, &cfg->rope_scaling);
    cfg->num_kv_heads = get_int(root, path, "num_key_value_heads", false, cfg->num_heads);
    cfg->head_dim = get_int(root, path, "head_dim", false, cfg->hidden_size / cfg->num_heads);
    json_t *mtp = json_object_get(root, "num_nextn_predict_layers");
    WEFT_CHECK(!mtp || json_is_null(mtp) || json_is_integer(mtp),
               "%s: \"num_nextn_predict_layers\" must be an integer", path);
    json_int_t n_mtp = json_is_integer(mtp) ? json_integer_value(mtp) : 0;
    WEFT_CHECK(n_mtp >= 0 && n_mtp <= WEFT_MAX_MTP,
               "%s: num_nextn_predict_layers = %lld; weft supports 0 to %d MTP modules", path,
               (long long)n_mtp, WEFT_MAX_MTP);
    cfg->num_mtp = (int)n_mtp;
    cfg->mtp_loss_scale = get_real(root, path, "mtp_loss_scale", 0.1);
    cfg->max_position_embeddings = get_int(root, path, "max_position_embeddings", false, 0);
    read_end_ids(json_object_get(root, "eos_token_id"), path, cfg);
    cfg->eos_token_id = cfg->n_end_ids > 0 ? cfg->end_ids[0] : -1;
    read_generation_end_ids(path, cfg);
    json_decref(root);
    weft_model_config_validate(cfg, path);
}

// Every size must be at least 1: a zero divides (the matmul's row split, hidden / heads) or leaves
// a model with nothing in it, and must stop here with a message rather than crash a pass later.
static void check_sizes(const weft_model_config *c, const char *source) {
    const struct {
        const char *key, *setting; // config.json's name, the from-scratch setting's
        int value;
    } sizes[] = {{"vocab_size", "the tokenizer's vocabulary", c->vocab_size},
                 {"hidden_size", "model.hidden_size", c->hidden_size},
                 {"intermediate_size", "model.intermediate_size", c->intermediate_size},
                 {"num_hidden_layers", "model.num_layers", c->num_layers},
                 {"num_attention_heads", "model.num_heads", c->num_heads},
                 {"num_key_value_heads", "model.num_kv_heads", c->num_kv_heads},
                 {"head_dim", "model.head_dim", c->head_dim}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        WEFT_CHECK(sizes[i].value >= 1 && sizes[i].value < (1 << 30),
                   "%s: %s (%s) = %d; it must be a positive integer below 2^30%s", source,
                   sizes[i].key, sizes[i].setting, sizes[i].value,
                   strcmp(sizes[i].key, "head_dim") == 0
                       ? " (when not given it is hidden_size / num_attention_heads, 0 when there "
                         "are more heads than hidden units)"
                       : "");
}

void weft_model_config_validate(const weft_model_config *c, const char *source) {
    check_sizes(c, source);
    WEFT_CHECK(c->num_heads % c->num_kv_heads == 0,
               "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
               source, c->num_heads, c->num_kv_heads);
    WEFT_CHECK(c->head_dim % 2 == 0, "%s: head_dim (%d) must be even for rotary embeddings",
               source, c->head_dim);
    WEFT_CHECK(c->num_mtp >= 0 && c->num_mtp <= WEFT_MAX_MTP,
               "%s: num_nextn_predict_layers = %d; weft supports 0 to %d MTP modules", source,
               c->num_mtp, WEFT_MAX_MTP);
    WEFT_CHECK(c->mtp_loss_scale >= 0, "%s: mtp_loss_scale must not be negative", source);
    WEFT_CHECK(c->rope_theta > 0 && c->rms_norm_eps > 0,
               "%s: rope_theta and rms_norm_eps must be positive", source);
    WEFT_CHECK(c->rope_scaling.type != WEFT_ROPE_YARN ||
                   c->rope_scaling.original_max_position_embeddings > 0 ||
                   c->max_position_embeddings > 0,
               "%s: rope_scaling of type yarn needs original_max_position_embeddings (in "
               "rope_scaling) or max_position_embeddings", source);
    WEFT_CHECK(!c->attention_bias ||
                   (c->family != WEFT_FAMILY_LLAMA && c->family != WEFT_FAMILY_QWEN3),
               "%s: attention_bias true is not implemented for Llama and Qwen3", source);
}

// ---------------------------------------------------------------------------------- save ----

static json_t *rope_scaling_json(const weft_rope_scaling *s) {
    static const char *const names[] = {"default", "linear", "llama3", "yarn"};
    json_t *o = json_pack("{s:s, s:f}", "rope_type", names[s->type], "factor", s->factor);
    if (s->type == WEFT_ROPE_LLAMA3) {
        json_object_set_new(o, "low_freq_factor", json_real(s->low_freq_factor));
        json_object_set_new(o, "high_freq_factor", json_real(s->high_freq_factor));
    }
    const struct {
        const char *key;
        double value;
    } optional[] = {{"attention_factor", s->attention_factor}, {"beta_fast", s->beta_fast},
                    {"beta_slow", s->beta_slow}, {"mscale", s->mscale},
                    {"mscale_all_dim", s->mscale_all_dim}};
    for (size_t i = 0; s->type == WEFT_ROPE_YARN && i < sizeof optional / sizeof optional[0]; i++)
        if (optional[i].value > 0) json_object_set_new(o, optional[i].key, json_real(optional[i].value));
    if (s->type == WEFT_ROPE_YARN && s->no_truncate) json_object_set_new(o, "truncate", json_false());
    if (s->original_max_position_embeddings > 0)
        json_object_set_new(o, "original_max_position_embeddings",
                            json_integer(s->original_max_position_embeddings));
    return o;
}

// The config.json fields weft reads into weft_model_config, by key: what both writers put.
// absent_below: a value under it means config.json did not say (max_position_embeddings 0,
// eos_token_id -1), and the field is left out.
static const struct {
    const char *key;
    size_t offset;
    enum { FIELD_INT, FIELD_REAL, FIELD_BOOL } kind;
    int absent_below;
} FIELDS[] = {
#define F(key, member, kind) {key, offsetof(weft_model_config, member), kind, INT_MIN}
    F("vocab_size", vocab_size, FIELD_INT),
    F("hidden_size", hidden_size, FIELD_INT),
    F("intermediate_size", intermediate_size, FIELD_INT),
    F("num_hidden_layers", num_layers, FIELD_INT),
    F("num_attention_heads", num_heads, FIELD_INT),
    F("num_key_value_heads", num_kv_heads, FIELD_INT),
    F("head_dim", head_dim, FIELD_INT),
    F("rope_theta", rope_theta, FIELD_REAL),
    F("rms_norm_eps", rms_norm_eps, FIELD_REAL),
    F("tie_word_embeddings", tie_word_embeddings, FIELD_BOOL),
    F("attention_bias", attention_bias, FIELD_BOOL),
    F("num_nextn_predict_layers", num_mtp, FIELD_INT),
    F("mtp_loss_scale", mtp_loss_scale, FIELD_REAL),
#undef F
    {"max_position_embeddings", offsetof(weft_model_config, max_position_embeddings), FIELD_INT, 1},
    {"eos_token_id", offsetof(weft_model_config, eos_token_id), FIELD_INT, 0},
};
enum { N_FIELDS = sizeof FIELDS / sizeof FIELDS[0] };

static json_t *field_json(const weft_model_config *c, int i) {
    const char *p = (const char *)c + FIELDS[i].offset;
    switch (FIELDS[i].kind) {
    case FIELD_INT: return *(const int *)p < FIELDS[i].absent_below ? NULL : json_integer(*(const int *)p);
    case FIELD_REAL: return json_real(*(const double *)p);
    default: return json_boolean(*(const bool *)p);
    }
}

// Sets every field of c in root; with `was` (what root said, as weft read it) only those where c
// differs, so a list of EOS ids or an absent head_dim stays as it was when training left it alone.
static void put_fields(json_t *root, const weft_model_config *c, const weft_model_config *was) {
    for (int i = 0; i < N_FIELDS; i++) {
        json_t *now = field_json(c, i), *before = was ? field_json(was, i) : NULL;
        if (now && !json_equal(now, before)) json_object_set(root, FIELDS[i].key, now);
        json_decref(now), json_decref(before);
    }
}

static bool write_json(json_t *root, const char *path) {
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    bool ok = text && weft_write_file_atomic(path, text, strlen(text));
    free(text);
    return ok;
}

bool weft_model_config_save(const weft_model_config *c, const char *path) {
    int f = 0;
    while (f + 1 < N_FAMILIES && FAMILIES[f].family != c->family) f++;
    // transformers' Qwen2 always has q/k/v biases: a Qwen2 without them (built from scratch with
    // attention_bias false) is, exactly, a Llama, and is written as one so that it loads as itself.
    if (c->family == WEFT_FAMILY_QWEN2 && !c->attention_bias)
        while (FAMILIES[f].family != WEFT_FAMILY_LLAMA) f = (f + 1) % N_FAMILIES;
    json_t *root = json_pack("{s:[s], s:s, s:s, s:s}", "architectures", FAMILIES[f].architecture,
                             "model_type", FAMILIES[f].model_type, "hidden_act", "silu",
                             "torch_dtype", "float32");
    put_fields(root, c, NULL);
    if (c->rope_scaling.type != WEFT_ROPE_DEFAULT)
        json_object_set_new(root, "rope_scaling", rope_scaling_json(&c->rope_scaling));
    return write_json(root, path);
}

bool weft_model_config_save_over(const char *source, const weft_model_config *cfg,
                                 const char *torch_dtype, const char *path) {
    weft_model_config was;
    weft_model_config_load(source, &was);
    json_error_t err;
    json_t *root = json_load_file(source, 0, &err);
    WEFT_CHECK(root && json_is_object(root), "%s: unreadable (%s); it was read when the job "
               "started: was it changed since?", source, root ? "not an object" : err.text);
    put_fields(root, cfg, &was);
    json_object_set_new(root, "torch_dtype", json_string(torch_dtype));
    return write_json(root, path);
}

// ------------------------------------------------------------------------------ RoPE table ----

// YaRN's attention scaling for a context `scale` times longer (transformers' get_mscale).
static double yarn_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

// The dimension (of dim) whose wavelength turns `rotations` times over max_pos positions.
static double yarn_correction_dim(double rotations, int dim, double base, double max_pos) {
    return dim * log(max_pos / (rotations * 2 * M_PI)) / (2 * log(base));
}

// YaRN's ramp over the dimensions [low, high] between interpolated (below low: extrapolated, kept)
// and scaled frequencies, and its attention factor.
static void yarn_ramp(const weft_model_config *c, double *low, double *high, float *factor) {
    const weft_rope_scaling *s = &c->rope_scaling;
    double max_pos = s->original_max_position_embeddings > 0 ? s->original_max_position_embeddings
                                                             : c->max_position_embeddings;
    double fast = s->beta_fast > 0 ? s->beta_fast : 32, slow = s->beta_slow > 0 ? s->beta_slow : 1;
    *low = yarn_correction_dim(fast, c->head_dim, c->rope_theta, max_pos);
    *high = yarn_correction_dim(slow, c->head_dim, c->rope_theta, max_pos);
    if (!s->no_truncate) *low = floor(*low), *high = ceil(*high);
    *low = fmax(*low, 0), *high = fmin(*high, c->head_dim - 1);
    if (*low == *high) *high += 0.001; // transformers' guard against a zero-width ramp
    *factor = (float)(s->attention_factor > 0 ? s->attention_factor
                      : s->mscale > 0 && s->mscale_all_dim > 0
                          ? yarn_mscale(s->factor, s->mscale) / yarn_mscale(s->factor, s->mscale_all_dim)
                          : yarn_mscale(s->factor, 1.0));
}

// Llama 3.1's scaling: long wavelengths divided by factor, short ones kept, a smooth blend between.
static double llama3_scale(const weft_rope_scaling *s, double f) {
    double wavelen = 2 * M_PI / f, old = s->original_max_position_embeddings;
    if (wavelen < old / s->high_freq_factor) return f;
    if (wavelen > old / s->low_freq_factor) return f / s->factor;
    double smooth = (old / wavelen - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
    return (1 - smooth) * f / s->factor + smooth * f;
}

void weft_rope_table(const weft_model_config *c, float *inv_freq, float *attention_factor) {
    const weft_rope_scaling *s = &c->rope_scaling;
    double low = 0, high = 0;
    *attention_factor = 1.0f;
    if (s->type == WEFT_ROPE_YARN) yarn_ramp(c, &low, &high, attention_factor);
    for (int i = 0; i < c->head_dim / 2; i++) {
        double f = pow(c->rope_theta, -2.0 * i / c->head_dim);
        if (s->type == WEFT_ROPE_LINEAR) f /= s->factor;
        if (s->type == WEFT_ROPE_LLAMA3) f = llama3_scale(s, f);
        if (s->type == WEFT_ROPE_YARN) {
            double keep = 1 - fmin(fmax((i - low) / (high - low), 0), 1);
            f = f / s->factor * (1 - keep) + f * keep;
        }
        inv_freq[i] = (float)f;
    }
}
