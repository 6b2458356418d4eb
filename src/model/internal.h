// model (private): what the model's files share: the activation arena of a pass (laid out by
// activations.c), the decoder blocks' forward and backward in it (blocks.c), run by the passes
// (passes.c).
#pragma once
#include "model/model.h"

// How much of a forward a pass keeps for its backward.
typedef enum {
    KEEP_NONE,   // scoring: nothing; layers run in one scratch set
    KEEP_INPUTS, // recomputation: each layer's input, the rest recomputed in backward
    KEEP_ALL,    // every layer's activations
} keep_mode;

// A micro-batch's sizes.
typedef struct dims {
    int T, C, I, H, KV, D, qd, kvd, n_docs, T_kv;
    // Rows of logits the activations hold: T, or for a generation forward the rows its head runs
    // on, none when it writes them to the caller's buffer (out->logits): a prefill chunk's
    // (T, V) would otherwise sit unused (1.2 GB in bf16 for 4096 rows of a 152K vocabulary).
    int logits_rows;
} dims;

// What one decoder layer keeps for its backward pass.
typedef struct layer_acts {
    void *x_in;            // (T, C) layer input; always kept, it is where recomputation restarts
    void *ln1, *q, *k, *v; // (T, C), (T, H*D), (T, KV*D) x2; q and k after RoPE
    void *q_pre, *k_pre;   // (T, H*D), (T, KV*D): q and k before their per-head norms (qk_norm)
    float *rstd_q, *rstd_k; // (T*H), (T*KV) the per-head norms' rstd (qk_norm)
    void *att;             // (T, H*D)
    float *lse, *rstd1;    // (H, T), (T)
    void *res1, *ln2;      // (T, C) residual after attention, its norm
    float *rstd2;          // (T)
    void *gate_up;         // (T, 2I): each row's gate projection, then its up projection
    void *act;             // (T, I)
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
    size_t capacity, used, peak;
    keep_mode keep;     // of the last forward
    bool fused;         // the last forward ran the heads' backward already (fused cross-entropy)
    bool backward_due;  // a kept forward waits for its backward
    dims d;
    layer_acts *layers; // (L + D) kept per layer; without KEEP_ALL only x_in (none at KEEP_NONE)
    layer_acts scratch; // the one layer's worth recomputation and scoring work in
    void *ping[2];      // KEEP_NONE: the layer inputs, alternating
    mtp_acts *mtp;      // (D); at KEEP_NONE every module shares mtp[0]'s buffers
    void *x_out, *lnf, *logits;          // (T, C), (T, C), (T, V): one logits buffer for all heads
    void *qkv; // (T, qd + 2 kvd) a layer's fused q|k|v projection rows; in backward their gradient
    float *rstdf, *row_loss, *correct;   // (T)
    void *d_head0;                       // (T, C) dL/d(lnf) through the main head
    void *d_res, *d_ln, *d_aux, *d_carry, *d_att, *d_q, *d_k, *d_v, *d_act;
    void *d_gate_up; // (T, 2I) as layer_acts' gate_up
    void *d_qk_pre; // (T, H*D) dL/dq (then dL/dk) before the per-head norms (qk_norm; else NULL)
    // With a key/value provider: one layer's key rows (2, T_kv, KV*D) and a second such block,
    // shared by all layers, so memory stays proportional to this rank's rows plus one layer's
    // keys. The second holds the keys' gradients in backward and is the provider's scratch in
    // forward; k_full is the scratch of the backward's reduce-scatter.
    void *k_full, *v_full, *dk_full, *dv_full;
    int kv_full_layer; // whose keys k_full holds now (-1: none), so backward gathers only if needed
    int32_t *tokens, *positions, *targets, *cu_seqlens, *cu_seqlens_kv;
    int32_t *head_rows;  // KEEP_NONE: (T) the rows a generation forward's head runs on
    void *head_input;    // KEEP_NONE: (T, C) those rows of h_0
    weft_attention_layout layout;
};

// Lays the arena out for a micro-batch (growing it, never shrinking, so steady state allocates
// nothing) and returns it; the peak is what the arena has ever held.
weft_activations *weft_activations_prepare(weft_model *m, keep_mode keep, dims d, bool provider);
// Grows the arena to hold a pass of these sizes, without laying it out.
void weft_activations_reserve(weft_model *m, keep_mode keep, dims d, bool provider);
void weft_activations_free(weft_model *m);
// Frees the arena (the next pass allocates what it needs; the peak stays).
void weft_activations_release(weft_model *m);
// Bytes such a pass keeps (the arena's size for it).
size_t weft_activations_bytes(const weft_model *m, keep_mode keep, dims d, bool provider);

// ------------------------------------------------------------------------------ blocks.c ----

// A weight as the matmul sees it: the (out, in) block starting at column `col` of parameter
// `param`, whose rows are `ld` elements apart. Whole Hugging Face matrices have col 0, ld = in;
// eh_proj's two halves are the views that turn a concatenated input into two products.
typedef struct weight_view {
    int param, col, ld;
} weight_view;

static inline weight_view whole_weight(int param, int in) { return (weight_view){param, 0, in}; }

// y (T, out) = x (T, in) W^T + beta * y
void weft_linear_forward(weft_model *m, const void *x, weight_view w, void *y, int T, int in,
                         int out, float beta);
// y = RMSNorm(x) W^T (+ b) (T, out) for parameters norm, w, b (WEFT_ABSENT: no bias), or with
// swiglu its activation (W the gate rows then the up rows), as one op where a forward-only pass
// lets the backend fold the norm into the product (the same bits, a launch fewer); false, nothing
// done, where it does not.
bool weft_folded_norm_product(weft_model *m, const weft_activations *a, const void *x, int norm,
                              int w, int b, void *y, int out, bool swiglu);
// dx (T, in) = dy W + dx_beta * dx ; dW (out, in) += dy^T x
void weft_linear_backward(weft_model *m, const void *x, weight_view w, const void *dy, void *dx,
                          int T, int in, int out, float dx_beta);

// The layer activations a pass works in for layer l: its own, or (recomputing, scoring) the
// shared scratch set pointed at its input.
layer_acts *weft_layer_acts(weft_model *m, weft_activations *a, int l);
// Decoder layer l from la->x_in: everything its backward needs, and its output into out.
void weft_layer_forward(weft_model *m, int l, layer_acts *la, weft_activations *a, void *out,
                        const weft_kv_provider *kv);
// a->d_res holds dL/d(layer output) on entry and dL/d(layer input) on exit. Tells the pass's
// gradient hook as the MLP's and the output projection's gradients become final (the caller tells
// it when the whole layer's are), so data parallelism's buckets start, and progress, sooner.
void weft_layer_backward(weft_model *m, int l, const layer_acts *la, weft_activations *a,
                         const weft_pass_options *pass);

// MTP module k (0-based) from h_prev (T, C) and the shifted tokens in a->mtp[k].inputs to h_k.
void weft_mtp_forward(weft_model *m, weft_activations *a, int k, const void *h_prev,
                      const weft_kv_provider *kv);
// On entry a->d_carry holds dL/dh_k from module k+1 (when there is one) and a->mtp[k].d_head
// dL/dh_k through its own head; on exit a->d_carry holds dL/dh_{k-1} from this module.
void weft_mtp_backward(weft_model *m, weft_activations *a, int k, const void *h_prev,
                       const weft_pass_options *pass);

// Tells the pass's hook that the gradients of parameters [first_param, n_params) are final.
static inline void weft_notify_grads_ready(const weft_pass_options *pass, int first_param) {
    if (pass && pass->grads_ready.ready) pass->grads_ready.ready(pass->grads_ready.ctx, first_param);
}
