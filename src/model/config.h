// Model configuration, read from a Hugging Face config.json: the families weft implements (Qwen2,
// Qwen2.5, Qwen3, Llama 2/3.x, MiMo) and every field that changes their math. A field weft does
// not implement is an error naming it, never a silently different model.
#pragma once
#include "core/core.h"

enum { WEFT_MAX_MTP = 4 };      // multi-token prediction depths supported
enum { WEFT_MAX_END_IDS = 8 };  // end-of-text ids a model directory may list

// The architecture a config.json names. Zero is Qwen2, weft's own from-scratch family.
typedef enum weft_model_family {
    WEFT_FAMILY_QWEN2 = 0, // Qwen2ForCausalLM (Qwen2, Qwen2.5): q/k/v biases
    WEFT_FAMILY_QWEN3,     // Qwen3ForCausalLM: RMSNorm per head on q and k, no biases
    WEFT_FAMILY_LLAMA,     // LlamaForCausalLM: no biases
    WEFT_FAMILY_MIMO,      // MiMoForCausalLM: Qwen2 with MTP modules under MiMo's names
} weft_model_family;

// RoPE's frequency scaling (config.json's rope_scaling); every type becomes one table of inverse
// frequencies (weft_rope_table). Zero is plain RoPE.
typedef enum weft_rope_type {
    WEFT_ROPE_DEFAULT = 0,
    WEFT_ROPE_LINEAR,
    WEFT_ROPE_LLAMA3,
    WEFT_ROPE_YARN,
} weft_rope_type;

typedef struct weft_rope_scaling {
    weft_rope_type type;
    double factor;                         // linear, llama3, yarn
    double low_freq_factor, high_freq_factor; // llama3
    int original_max_position_embeddings;  // llama3; yarn (0: max_position_embeddings)
    double beta_fast, beta_slow;           // yarn (0: transformers' 32 and 1)
    double attention_factor;               // yarn (0: from factor, mscale, mscale_all_dim)
    double mscale, mscale_all_dim;         // yarn (0: unset)
    bool no_truncate;                      // yarn's "truncate": false
} weft_rope_scaling;

typedef struct weft_model_config {
    int vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim;
    double rope_theta, rms_norm_eps;
    bool tie_word_embeddings, attention_bias;
    weft_model_family family;
    bool qk_norm;                  // Qwen3's q_norm / k_norm (set by the family)
    weft_rope_scaling rope_scaling;
    int num_mtp;           // num_nextn_predict_layers: MTP modules D (0 = none)
    double mtp_loss_scale; // lambda: the MTP losses weigh lambda / D each
    // What generation needs to know, when config.json says (0 and -1: it does not).
    int max_position_embeddings; // the longest context the model was made for
    int eos_token_id;            // the end-of-text token (the first of a list)
    // Every id that ends generation: generation_config.json's "eos_token_id" beside config.json
    // where it names any (what transformers' generate and vLLM stop at), else config.json's; an
    // id or a list. An instruct model's end of turn may be only in the list (Llama 3.1's
    // [128001, 128008, 128009] ends turns with the last).
    int n_end_ids, end_ids[WEFT_MAX_END_IDS];
} weft_model_config;

// Reads path (a config.json); any missing or inconsistent field is a fatal error naming it, and so
// is an architecture or a field weft does not implement.
void weft_model_config_load(const char *path, weft_model_config *cfg);
// Checks the shape constraints (heads divide hidden, kv heads divide heads, even head_dim, ...).
void weft_model_config_validate(const weft_model_config *cfg, const char *source);
// Writes config.json with Hugging Face keys (the family's architecture), atomically.
bool weft_model_config_save(const weft_model_config *cfg, const char *path);
// Writes the config.json at `source` (the one cfg was loaded from) to `path`, atomically, with
// every field as it was but those where cfg now differs from what source says, and torch_dtype,
// which becomes `torch_dtype` (what the weights are saved as).
bool weft_model_config_save_over(const char *source, const weft_model_config *cfg, const char *torch_dtype,
                                 const char *path);
// RoPE's inverse frequencies inv_freq (head_dim / 2) and the factor cos and sin are scaled by, as
// transformers' ROPE_INIT_FUNCTIONS compute them for the config's rope_scaling.
void weft_rope_table(const weft_model_config *cfg, float *inv_freq, float *attention_factor);
