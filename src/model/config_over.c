// model: a loaded model's config.json written back with only what training changed, so that a
// checkpoint keeps every field of the input (architecture, token ids, rope settings, fields weft
// does not read) and other tools load it as the same model.
#include "model/config.h"

#include <jansson.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { FIELD_INT, FIELD_REAL, FIELD_BOOL } field_kind;

// The config.json fields weft reads into weft_model_config, by key.
static const struct {
    const char *key;
    size_t offset;
    field_kind kind;
} FIELDS[] = {
#define F(key, member, kind) {key, offsetof(weft_model_config, member), kind}
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
    F("max_position_embeddings", max_position_embeddings, FIELD_INT),
    F("eos_token_id", eos_token_id, FIELD_INT),
#undef F
};

static json_t *field_json(const weft_model_config *c, size_t i) {
    const char *p = (const char *)c + FIELDS[i].offset;
    switch (FIELDS[i].kind) {
    case FIELD_INT: return json_integer(*(const int *)p);
    case FIELD_REAL: return json_real(*(const double *)p);
    default: return json_boolean(*(const bool *)p);
    }
}

static bool field_equal(const weft_model_config *a, const weft_model_config *b, size_t i) {
    const char *x = (const char *)a + FIELDS[i].offset, *y = (const char *)b + FIELDS[i].offset;
    switch (FIELDS[i].kind) {
    case FIELD_INT: return *(const int *)x == *(const int *)y;
    case FIELD_REAL: return *(const double *)x == *(const double *)y;
    default: return *(const bool *)x == *(const bool *)y;
    }
}

bool weft_model_config_save_over(const char *source, const weft_model_config *cfg, const char *torch_dtype,
                                 const char *path) {
    // What source says, as weft reads it: a field is rewritten only where cfg differs from that,
    // so a list of EOS ids or an absent head_dim stays as it was when training left them alone.
    weft_model_config was;
    weft_model_config_load(source, &was);
    json_error_t err;
    json_t *root = json_load_file(source, 0, &err);
    WEFT_CHECK(root && json_is_object(root), "%s: unreadable (%s); it was read when the job started: was it "
               "changed since?", source, root ? "not an object" : err.text);
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++)
        if (!field_equal(&was, cfg, i)) json_object_set_new(root, FIELDS[i].key, field_json(cfg, i));
    json_object_set_new(root, "torch_dtype", json_string(torch_dtype));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    bool ok = text && weft_write_file_atomic(path, text, strlen(text));
    free(text);
    return ok;
}
