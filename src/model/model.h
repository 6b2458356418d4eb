// model: the decoder's parameter layout and its passes over a packed batch (DESIGN.md section 2),
// written once against the backend's op table.
//
// One micro-batch runs one of three ways:
//  - weft_model_forward_backward: the SFT fast path. Each output head's fused cross-entropy turns
//    its logits into their gradient in place (no second (T, V) buffer), then backward runs.
//  - weft_model_forward(keep = true), then weft_model_backward with per-row weights dL/dlogp[t]
//    (and dL/dentropy[t]): any token-weighted objective. Cross-entropy is the weight -1/N on
//    targets; a policy-gradient loss computes its weights from the forward's log-probs.
//  - weft_model_forward(keep = false): scoring. Log-probs, entropy, logits and hidden states,
//    keeping no activation for a backward.
// Attention reads the keys and values of earlier positions through a weft_kv_provider: from the
// batch itself (none given), a context-parallel group's gather, or a KV cache. The model never
// knows which ranks, groups or cache sit behind it.
#pragma once
#include "backend/backend.h"
#include "model/batch.h"
#include "model/config.h"

enum { WEFT_MAX_HEADS = WEFT_MAX_MTP + 1 }; // head 0 predicts the next token, head k MTP depth k

// One named tensor in the flat parameter buffer (gradients use the same offsets).
typedef struct weft_param_info {
    char name[96];    // Hugging Face name
    size_t offset;    // in elements
    size_t numel;
    int ndim;
    int64_t shape[2];
    bool weight_decay; // matrices decay; norms and biases do not
    int layer;         // decoder layer, -1 before the first, num_layers after the last
} weft_param_info;

enum { WEFT_ABSENT = -1 };

// Indices into the parameter table for one decoder layer (WEFT_ABSENT where biases are off, and
// for q_norm / k_norm, Qwen3's RMSNorm per head on q and k, in the other families).
typedef struct weft_layer_params {
    int input_norm, q_w, q_b, k_w, k_b, v_w, v_b, q_norm, k_norm, o_w, post_norm, gate_w, up_w,
        down_w;
} weft_layer_params;

// One multi-token-prediction module's own tensors; its decoder layer is in `layers`.
typedef struct weft_mtp_params {
    int enorm, hnorm, eh_proj, final_norm;
} weft_mtp_params;

// How a checkpoint names the MTP modules' tensors; loading adopts the file's scheme and saving
// writes it back.
typedef enum weft_mtp_names {
    WEFT_MTP_NAMES_WEFT = 0, // model.mtp_layers.K.{enorm, hnorm, eh_proj, <layer>, final_layernorm}
    // MiMo: model.mtp_layers.K.{token_layernorm, hidden_layernorm, input_proj, <layer>,
    // final_layernorm}; input_proj reads [hidden; embedding], the reverse of eh_proj.
    WEFT_MTP_NAMES_MIMO,
    // DeepSeek-V3: model.layers.{L+K}.{enorm, hnorm, eh_proj, <layer>, shared_head.norm}, often
    // with copies of the shared embedding and head (embed_tokens, shared_head.head).
    WEFT_MTP_NAMES_DEEPSEEK,
} weft_mtp_names;

typedef struct weft_activations weft_activations;

// Where attention's keys and values come from when the batch does not hold them all: the other
// chunks of a context-parallel group's documents (DESIGN.md section 6), or the earlier positions
// of a continued document held in a KV cache (section 11). The batch's cu_seqlens_kv says how many
// key rows each document has; this rank's rows are the last of them in a continuation.
typedef struct weft_kv_provider {
    void *ctx;
    // kv (2, T, width): layer `layer`'s keys (after RoPE) then values of the batch's rows ->
    // kv_full (2, T_kv, width): every key row attention sees, document by document.
    // scratch: (2, T_kv, width), free to use.
    void (*gather)(void *ctx, int layer, const void *kv, void *kv_full, int width, void *scratch);
    // Backward: dkv_full (2, T_kv, width), this rank's gradient contributions for every key row ->
    // dkv (2, T, width), each of the batch's rows summed over the ranks that hold it. NULL for a
    // provider whose extra rows take no gradient (a KV cache): backward through it is an error.
    void (*reduce_scatter)(void *ctx, int layer, const void *dkv_full, void *dkv, int width,
                           void *scratch);
    // A provider that keeps the keys itself (a paged KV cache) gives attend instead of gather:
    // forward only, it stores layer `layer`'s keys and values of the batch's rows (kv: (2, T,
    // width), keys after RoPE) and computes the attention of q (T, H, D) over every key row each
    // of the rows sees: out (T, H, D), lse (H, T) f32.
    void (*attend)(void *ctx, int layer, const void *q, const void *kv, void *out, float *lse);
    // Optional, beside attend: layer `layer`'s q|k|v split taken over, fused (T, qd + 2 kvd) rows
    // into q (parts->part[0]) with q and k turned by rope, the keys and values going straight to
    // the provider's store, so that attend does not store them again (parts k and v may be left
    // unwritten): one launch where a split and a store were two.
    void (*split_store)(void *ctx, int layer, void *fused, const weft_column_parts *parts,
                        const weft_rope_rows *rope);
    // Optional, beside split_store: the normed q|k|v product before it too (np), where the
    // backend does both in one op; false: nothing done, the caller runs the product and then
    // split_store.
    bool (*norm_product_store)(void *ctx, int layer, const weft_norm_product *np, void *fused,
                               const weft_column_parts *parts, const weft_rope_rows *rope);
} weft_kv_provider;

// Called during backward whenever the gradients of parameters [first_param, n_params) are final
// for this micro-batch (the layout is in reverse backward order, so first_param only falls). The
// data-parallel layer passes one to start reducing buckets while backward continues.
typedef struct weft_grad_hook {
    void (*ready)(void *ctx, int first_param);
    void *ctx;
} weft_grad_hook;

// What one pass needs besides the batch, given per call.
typedef struct weft_pass_options {
    const weft_kv_provider *kv; // NULL: every document is whole in the batch
    weft_grad_hook grads_ready; // backward only; {NULL}: nobody listens
    // A forward without keep whose inputs weft_model_upload_inputs sent before (same batch, same
    // chosen rows): it queues device work alone, which a backend graph can record and replay.
    bool uploaded;
    // Token ids the host does not know yet (drawn on the device by the step before, their
    // download still in flight): row r's id is token_source[token_from[r]] where token_from[r]
    // >= 0 (both device arrays; backend take_tokens), the batch's id elsewhere. NULL: the batch's.
    const int32_t *token_source, *token_from;
} weft_pass_options;

// Fixed at creation.
typedef struct weft_model_options {
    size_t pad_multiple; // buffers hold a multiple of this many elements (the distributed
                         // optimizer shards them); 0 or 1: no padding
    bool recompute;      // keep only each layer's input; recompute the rest in backward
    // Checkpoint tensors the model does not use that weft_model_load_safetensors may drop
    // (model.drop_tensors: names separated by commas, brackets and quotes ignored; copied). Any
    // other unused tensor is an error. NULL: none.
    const char *drop_tensors;
    // A model only run forward (weft generate, the RL reference policy, weft grad --score): no
    // gradient buffer (grad_buf NULL), whose fp32 copy of every parameter would take twice the
    // bf16 weights' memory on a GPU (from the KV pool, in generation).
    bool forward_only;
} weft_model_options;

typedef struct weft_model {
    weft_model_config cfg;
    weft_backend *be;
    weft_model_options opt;
    weft_param_info *params;
    int n_params;
    size_t n_elements;          // total parameter elements
    void *param_buf;            // (n_elements) param dtype
    float *grad_buf;            // (n_elements) f32, same offsets
    int embed, final_norm, lm_head; // lm_head == embed when tied
    weft_layer_params *layers;  // (num_layers + num_mtp): the MTP modules' layers come last
    weft_mtp_params *mtp;       // (num_mtp)
    size_t n_padded;            // buffer length: n_elements rounded up for even sharding
    float *rope_inv_freq;       // (head_dim / 2) f32 on the device: RoPE's table (rope_theta, rope_scaling)
    float rope_scale;           // cos and sin scaled by this (YaRN's attention factor, else 1)
    weft_mtp_names mtp_names;   // the MTP tensors' names (params[].name), as the checkpoint had
    bool mtp_shared_copies;     // DeepSeek names: the checkpoint held the embedding/head copies
    weft_activations *acts;     // the model's own working memory; see weft_model_peak_bytes
} weft_model;

weft_model *weft_model_create(weft_backend *be, const weft_model_config *cfg,
                              const weft_model_options *opt);
void weft_model_free(weft_model *m);
const weft_param_info *weft_model_find_param(const weft_model *m, const char *name);
// Weights by Hugging Face name; every parameter must be present with its shape, and every tensor
// of the file used (or listed in the options' drop_tensors). path: a model directory
// (model.safetensors, or model.safetensors.index.json and its shards) or one file.
void weft_model_load_safetensors(weft_model *m, const char *path);
// Scaled normal init for training from scratch (std 0.02, output projections 0.02/sqrt(2L)).
void weft_model_init_random(weft_model *m, uint64_t seed);
void *weft_model_param(const weft_model *m, int index);
float *weft_model_grad(const weft_model *m, int index);
int weft_model_heads(const weft_model *m); // 1 + MTP depth

// Device buffers a forward fills, each optional (NULL: not wanted). Rows are the batch's.
typedef struct weft_forward_outputs {
    // Head k's log p(target of row t), 0 on rows without a target: (T) f32.
    float *logprobs[WEFT_MAX_HEADS];
    // Head k's entropy of its whole next-token distribution at rows with a target, 0 elsewhere:
    // (T) f32.
    float *entropy[WEFT_MAX_HEADS];
    void *logits; // (T, V) act dtype: the main head's logits
    void *hidden; // (T, C) act dtype: h_0, the final-normed hidden state MTP drafting starts from
    // (2 * heads) f64, ADDED to: per head k, the cross-entropy summed over its targets at
    // stats[k] and its top-1 correct count at stats[heads + k]. Kept on the device, so a step reads
    // every micro-batch's sums back once.
    double *stats;
    // Generation (a forward without keep): the main head runs only on these rows of the batch
    // (host array of n_rows indices), so `logits` holds (n_rows, V) in this order; no other head
    // output is made. NULL: every row.
    const int32_t *rows;
    int n_rows;
    bool skip_mtp; // generation without drafting: the MTP modules do not run
} weft_forward_outputs;

// The SFT fast path. Adds to grad_buf the gradient of
// sum_k loss_scale[k] * (sum of head k's target cross-entropies): loss_scale[0] = 1/N and
// loss_scale[k] = lambda/(D N_k) give the objective of DESIGN.md sections 3 and 8, and
// micro-batches accumulate. `out` may be NULL.
void weft_model_forward_backward(weft_model *m, const weft_batch *batch, const float *loss_scale,
                                 const weft_pass_options *pass, const weft_forward_outputs *out);

// Forward only. keep = true keeps what weft_model_backward needs (the next backward must follow
// before another forward); keep = false keeps nothing beyond the outputs.
void weft_model_forward(weft_model *m, const weft_batch *batch, bool keep,
                        const weft_pass_options *pass, const weft_forward_outputs *out);

// What a forward without keep reads from the host: the batch's index arrays and out->rows (the
// chosen head rows), uploaded now, for a forward with pass->uploaded to follow.
void weft_model_upload_inputs(weft_model *m, const weft_batch *batch,
                              const weft_pass_options *pass, const weft_forward_outputs *out);

// Drafting for speculative decoding (DESIGN.md sections 8 and 11): MTP module `depth` (1-based)
// alone over the batch's rows, keeping nothing, its attention through a KV cache's provider. The
// batch's tokens are the module's input tokens (at the row of position t, token t + depth) and
// h_prev (T, C) holds h_{depth-1} of each row. Writes h_depth (T, C) to out->hidden (if given) and
// the shared head's logits of out->rows to out->logits.
void weft_model_draft_forward(weft_model *m, int depth, const weft_batch *batch,
                              const void *h_prev, const weft_pass_options *pass,
                              const weft_forward_outputs *out);

// Per head k and row t, device (T) f32 arrays, each optional (NULL: zero).
typedef struct weft_head_weights {
    const float *d_logprob[WEFT_MAX_HEADS]; // dL/dlogp_k(t)
    const float *d_entropy[WEFT_MAX_HEADS]; // dL/dH_k(t)
} weft_head_weights;

// Backward of the kept forward: ADDS to grad_buf the gradient of
// sum_k sum_t (d_logprob[k][t] * logp_k(t) + d_entropy[k][t] * H_k(t)). The weights -1/N (head 0)
// and -lambda/(D N_k) (head k) on target rows give exactly weft_model_forward_backward's gradient.
void weft_model_backward(weft_model *m, const weft_head_weights *w, const weft_pass_options *pass);

// Whether parameter i belongs to a multi-token-prediction module.
bool weft_model_param_is_mtp(const weft_model *m, int i);
void weft_model_zero_grad(weft_model *m);
// A phase that runs no backward (the hybrid RL loop's rollout) may give the gradient buffer's
// memory back: release frees it, restore allocates it again, zeroed. Nothing reads or writes
// gradients in between.
void weft_model_release_grad(weft_model *m);
void weft_model_restore_grad(weft_model *m);
// Frees the activation memory, sized by the largest pass so far; the next pass allocates what it
// needs (weft_model_peak_bytes keeps its record).
void weft_model_release_activations(weft_model *m);
// Adds one tensor per parameter, named prefix + Hugging Face name, to a safetensors writer: the
// parameters themselves when flat is NULL, else the f32 buffer `flat` laid out like the parameters
// from element `base` on (gradients, optimizer moments, a shard of them).
struct weft_safetensors_writer;
void weft_model_add_tensors(const weft_model *m, struct weft_safetensors_writer *w,
                            const char *prefix, const float *flat, size_t base);
// Activation bytes a training pass keeps for a micro-batch of T rows whose attention sees T_kv
// key rows (exchange: through a provider) over n_docs documents: what weft_model_peak_bytes
// counts for such a batch.
size_t weft_model_activation_bytes(const weft_model *m, int T, int T_kv, int n_docs,
                                   bool exchange);
// Grows the activation memory, now, to what a training pass over up to T rows, T_kv key rows and
// n_docs documents needs (provider: through a key/value provider), so that the passes of a step
// allocate (and on a GPU wait for) nothing. Sizes only grow.
void weft_model_reserve(weft_model *m, int T, int T_kv, int n_docs, bool provider);
// The most activation memory any pass so far has held.
size_t weft_model_peak_bytes(const weft_model *m);
// Bytes of parameters and gradients as held on the device.
size_t weft_model_param_bytes(const weft_model *m);
size_t weft_model_grad_bytes(const weft_model *m);
