#include "model/config.h"

#include <jansson.h>
#include <string.h>

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

void weft_model_config_load(const char *path, weft_model_config *cfg) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    WEFT_CHECK(root, "%s%s%.0d: %s; the model directory needs a valid Hugging Face config.json",
               path, err.line > 0 ? ":" : "", err.line > 0 ? err.line : 0, err.text);
    WEFT_CHECK(json_is_object(root), "%s: expected a JSON object", path);
    *cfg = (weft_model_config){
        .vocab_size = get_int(root, path, "vocab_size", true, 0),
        .hidden_size = get_int(root, path, "hidden_size", true, 0),
        .intermediate_size = get_int(root, path, "intermediate_size", true, 0),
        .num_layers = get_int(root, path, "num_hidden_layers", true, 0),
        .num_heads = get_int(root, path, "num_attention_heads", true, 0),
        .rope_theta = get_real(root, path, "rope_theta", 10000.0),
        .rms_norm_eps = get_real(root, path, "rms_norm_eps", 1e-6),
        .tie_word_embeddings = get_bool(root, path, "tie_word_embeddings", false),
        .attention_bias = get_bool(root, path, "attention_bias", true), // Qwen2's q/k/v biases
    };
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
    json_t *eos = json_object_get(root, "eos_token_id");
    if (json_is_array(eos)) eos = json_array_get(eos, 0);
    WEFT_CHECK(!eos || json_is_null(eos) || json_is_integer(eos),
               "%s: \"eos_token_id\" must be an integer or a list of them", path);
    json_int_t eos_id = json_is_integer(eos) ? json_integer_value(eos) : -1;
    WEFT_CHECK(eos_id >= -1 && eos_id < cfg->vocab_size,
               "%s: \"eos_token_id\" = %lld is outside the vocabulary [0, %d)", path,
               (long long)eos_id, cfg->vocab_size);
    cfg->eos_token_id = (int)eos_id;
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
}

bool weft_model_config_save(const weft_model_config *c, const char *path) {
    json_t *root = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:b, s:s, s:s, s:i, s:f}",
        "architectures", "Qwen2ForCausalLM", "model_type", "qwen2", "vocab_size", c->vocab_size,
        "hidden_size", c->hidden_size, "intermediate_size", c->intermediate_size,
        "num_hidden_layers", c->num_layers, "num_attention_heads", c->num_heads,
        "num_key_value_heads", c->num_kv_heads, "head_dim", c->head_dim, "rope_theta",
        c->rope_theta, "rms_norm_eps", c->rms_norm_eps, "tie_word_embeddings",
        c->tie_word_embeddings, "attention_bias", c->attention_bias, "hidden_act", "silu",
        "torch_dtype", "float32", "num_nextn_predict_layers", c->num_mtp, "mtp_loss_scale",
        c->mtp_loss_scale);
    if (c->max_position_embeddings > 0)
        json_object_set_new(root, "max_position_embeddings", json_integer(c->max_position_embeddings));
    if (c->eos_token_id >= 0) json_object_set_new(root, "eos_token_id", json_integer(c->eos_token_id));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(root);
    bool ok = text && weft_write_file_atomic(path, text, strlen(text));
    free(text);
    return ok;
}
