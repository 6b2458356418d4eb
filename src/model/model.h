// model: the decoder's parameter layout and its forward/backward over a packed batch, written once
// against the backend's op table.
#pragma once
#include "backend/backend.h"
#include "model/batch.h"
#include "model/config.h"

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

// Indices into the parameter table for one decoder layer (WEFT_ABSENT where biases are off).
typedef struct weft_layer_params {
    int input_norm, q_w, q_b, k_w, k_b, v_w, v_b, o_w, post_norm, gate_w, up_w, down_w;
} weft_layer_params;

// One multi-token-prediction module's own tensors; its decoder layer is in `layers`.
typedef struct weft_mtp_params {
    int enorm, hnorm, eh_proj, final_norm;
} weft_mtp_params;

typedef struct weft_activations weft_activations;

// What attention needs from the ranks that hold the other chunks of this batch's documents
// (context parallelism, DESIGN.md section 6). The parallel layer supplies it; the model never
// learns which ranks or library sit behind it. NULL: every document is whole in the batch.
typedef struct weft_kv_exchange {
    void *ctx;
    // kv (2, T, width): this rank's keys then values -> kv_full (2, T_kv, width): every
    // document's rows from all ranks, in document order. scratch: (2, T_kv, width).
    void (*gather)(void *ctx, const void *kv, void *kv_full, int width, void *scratch);
    // dkv_full (2, T_kv, width): this rank's gradient contributions for whole documents ->
    // dkv (2, T, width): each of this rank's rows summed over the ranks. scratch as above.
    void (*reduce_scatter)(void *ctx, const void *dkv_full, void *dkv, int width, void *scratch);
} weft_kv_exchange;

typedef struct weft_model {
    weft_model_config cfg;
    weft_backend *be;
    weft_param_info *params;
    int n_params;
    size_t n_elements;          // total parameter elements
    void *param_buf;            // (n_elements) param dtype
    float *grad_buf;            // (n_elements) f32, same offsets
    int embed, final_norm, lm_head; // lm_head == embed when tied
    weft_layer_params *layers;  // (num_layers + num_mtp): the MTP modules' layers come last
    weft_mtp_params *mtp;       // (num_mtp)
    size_t n_padded;            // buffer length: n_elements rounded up for even sharding
    bool recompute;             // recompute each block's activations in backward
    // Called during backward whenever the gradients of parameters [first_param, n_params) are
    // final for this micro-batch (the layout is in reverse backward order, so this only grows).
    // The parallel layer supplies it to start reducing buckets while backward continues.
    void (*grads_ready)(void *ctx, int first_param);
    void *grads_ready_ctx;
    const weft_kv_exchange *kv_exchange; // NULL without context parallelism
    weft_activations *acts;
    size_t peak_activation_bytes;
} weft_model;

// Buffers hold a multiple of `pad_multiple` elements (the distributed optimizer shards them).
weft_model *weft_model_create(weft_backend *be, const weft_model_config *cfg, size_t pad_multiple);
void weft_model_free(weft_model *m);
const weft_param_info *weft_model_find_param(const weft_model *m, const char *name);
// Weights by Hugging Face name; every parameter must be present with its shape.
void weft_model_load_safetensors(weft_model *m, const char *path);
// Scaled normal init for training from scratch (std 0.02, output projections 0.02/sqrt(2L)).
void weft_model_init_random(weft_model *m, uint64_t seed);
void *weft_model_param(const weft_model *m, int index);
float *weft_model_grad(const weft_model *m, int index);

// Per head (index 0: the main next-token head, k: MTP depth k) sums over a micro-batch.
typedef struct weft_forward_stats {
    double loss_sum[WEFT_MAX_MTP + 1]; // cross-entropy summed over the head's targets
    double correct[WEFT_MAX_MTP + 1];  // targets whose argmax prediction was right
} weft_forward_stats;

// Host copies of per-row outputs of the main head, each optional (NULL: not wanted).
typedef struct weft_model_outputs {
    float *logits;   // (T, V)
    float *logprobs; // (T) log-probability of each row's target; 0 on rows without one
} weft_model_outputs;

// Forward and backward over one packed micro-batch. Gradients of
// sum_k loss_scale[k] * (sum of head k's target losses) are ADDED to grad_buf, so micro-batches
// accumulate; loss_scale[0] = 1/N and loss_scale[k] = lambda/(D N_k) give the objective of
// DESIGN.md sections 3 and 8. `out` may be NULL.
weft_forward_stats weft_model_forward_backward(weft_model *m, const weft_batch *batch,
                                               const float *loss_scale,
                                               const weft_model_outputs *out);
// Whether parameter i belongs to a multi-token-prediction module.
bool weft_model_param_is_mtp(const weft_model *m, int i);
void weft_model_zero_grad(weft_model *m);
// Adds one tensor per parameter, named prefix + Hugging Face name, to a safetensors writer: the
// parameters themselves when flat is NULL, else the f32 buffer `flat` laid out like the parameters
// from element `base` on (gradients, optimizer moments, a shard of them).
struct weft_safetensors_writer;
void weft_model_add_tensors(const weft_model *m, struct weft_safetensors_writer *w,
                            const char *prefix, const float *flat, size_t base);
// Activation bytes of a micro-batch of T rows whose attention sees T_kv key rows (with a K/V
// exchange) over n_docs documents: what the job's peak_activations counts for such a batch.
size_t weft_model_activation_bytes(const weft_model *m, int T, int T_kv, int n_docs, bool exchange);
// Bytes of parameters and gradients as held on the device.
size_t weft_model_param_bytes(const weft_model *m);
size_t weft_model_grad_bytes(const weft_model *m);
