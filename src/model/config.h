// Model configuration, read from a Hugging Face config.json (Qwen2 / Llama family).
#pragma once
#include "core/core.h"

enum { WEFT_MAX_MTP = 4 }; // multi-token prediction depths supported

typedef struct weft_model_config {
    int vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim;
    double rope_theta, rms_norm_eps;
    bool tie_word_embeddings, attention_bias;
    int num_mtp;           // num_nextn_predict_layers: MTP modules D (0 = none)
    double mtp_loss_scale; // lambda: the MTP losses weigh lambda / D each
    // What generation needs to know, when config.json says (0 and -1: it does not).
    int max_position_embeddings; // the longest context the model was made for
    int eos_token_id;            // the end-of-text token (the first of a list)
} weft_model_config;

// Reads path (a config.json); any missing or inconsistent field is a fatal error naming it.
void weft_model_config_load(const char *path, weft_model_config *cfg);
// Checks the shape constraints (heads divide hidden, kv heads divide heads, even head_dim, ...).
void weft_model_config_validate(const weft_model_config *cfg, const char *source);
// Writes config.json with Hugging Face keys (Qwen2ForCausalLM), atomically.
bool weft_model_config_save(const weft_model_config *cfg, const char *path);
// Writes the config.json at `source` (the one cfg was loaded from) to `path`, atomically, with
// every field as it was but those where cfg now differs from what source says, and torch_dtype,
// which becomes `torch_dtype` (what the weights are saved as). config_over.c.
bool weft_model_config_save_over(const char *source, const weft_model_config *cfg, const char *torch_dtype,
                                 const char *path);
