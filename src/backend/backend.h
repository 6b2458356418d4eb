// backend: device memory and every numeric op, one implementation per device (cpu/, later cuda/).
//
// Model code is written once against this table of function pointers. Pointers passed to ops are
// device pointers from `alloc`. Conventions, so a bf16 device fits later without model changes:
//   - activations (act): the backend's activation dtype (`act_dtype`), row-major.
//   - parameters (param): the backend's parameter dtype (`param_dtype`).
//   - gradients of parameters, norms' rstd, attention lse, losses: always fp32 ("f32").
//   - token ids, positions, targets, cu_seqlens: int32 on the device.
// Backward ops ACCUMULATE into parameter gradients (dW += ...) so micro-batches sum for free;
// input gradients are overwritten unless the op says "+=".
#pragma once
#include "core/core.h"

typedef enum weft_dtype { WEFT_F32 = 0, WEFT_BF16 = 1 } weft_dtype;
size_t weft_dtype_size(weft_dtype t);

// Which operand of a matmul is which element type, e.g. for dW (f32) += dY^T (act) X (act).
typedef struct weft_matmul_types {
    weft_dtype a, b, c;
} weft_matmul_types;

// Which query rows attend to which key rows (see attention_forward). The arrays are device
// pointers; the counts are host values.
typedef struct weft_attention_layout {
    int n_docs, Tq, Tkv;
    const int32_t *cu_q;  // (n_docs + 1) query rows per document
    const int32_t *cu_kv; // (n_docs + 1) key rows per document
    const int32_t *q_pos; // (Tq) position of each query in its document
} weft_attention_layout;

// A paged KV cache's pool (DESIGN.md section 11): n_blocks blocks, each holding block_size
// positions of every layer's keys and values, (n_blocks, layers, 2, block_size x width) in the
// activation dtype (width = kv heads x head dim). Position p of a sequence lives in the
// sequence's block block_table[p / block_size], at offset p % block_size. How a layer's keys and
// values are laid out inside a block is the backend's (rows on CUDA; the CPU keeps keys
// transposed), so only kv_store and paged_attention read or write them; a block is copied whole.
typedef struct weft_kv_pool {
    void *data; // device memory
    int n_blocks, layers, block_size, width;
} weft_kv_pool;

// The column blocks of a fused product's rows: rows of n separate matrices (rows, width[i]),
// side by side in one (rows, sum of widths) matrix (the q, k and v projections as one product).
enum { WEFT_MAX_COLUMN_PARTS = 3 };
typedef struct weft_column_parts {
    void *part[WEFT_MAX_COLUMN_PARTS];
    int width[WEFT_MAX_COLUMN_PARTS];
    int n;
} weft_column_parts;

// RoPE on rows, as rope_forward and rope_backward take it (their positions, inv_freq and scale):
// the first `heads` heads of head_dim values of each row turn.
typedef struct weft_rope_rows {
    const int32_t *positions;
    const float *inv_freq;
    float scale;
    int heads, head_dim;
} weft_rope_rows;

// A forward-only pass's product of normalized rows (norm_product, norm_product_store): RMSNorm
// of x (rows, C) with weights norm_w and eps, times W (N, C) (+ bias (N), or NULL).
typedef struct weft_norm_product {
    const void *x, *norm_w, *w, *bias;
    float eps;
    int rows, C;
} weft_norm_product;

// Which pooled keys the query rows of a paged attention see: rows [cu_q[s], cu_q[s + 1]) belong
// to sequence s, row r at position q_pos[r] sees that sequence's positions 0..q_pos[r], in the
// blocks block_tables[s * max_blocks + j]. Arrays on the device; counts on the host.
typedef struct weft_paged_layout {
    int n_seqs, Tq, max_blocks;
    const int32_t *cu_q;         // (n_seqs + 1)
    const int32_t *q_pos;        // (Tq)
    const int32_t *block_tables; // (n_seqs, max_blocks)
} weft_paged_layout;

typedef struct weft_backend weft_backend;

// The filters of a device draw (sample_tokens). Off: top_k 0 (or >= V), top_p 1, min_p 0.
typedef struct weft_draw_filters {
    int top_k;
    double top_p, min_p;
} weft_draw_filters;
struct weft_backend {
    const char *name;
    weft_dtype act_dtype, param_dtype;
    // Buffers from `alloc` live on a GPU: the host reaches them only through to_host/to_device,
    // and collectives on them go through NCCL instead of MPI.
    bool device_memory;
    void *stream; // the cudaStream_t every op is queued on (NULL on the CPU)

    void *(*alloc)(weft_backend *self, size_t bytes); // zeroed
    void (*free)(weft_backend *self, void *p);
    void (*to_device)(weft_backend *self, void *dst, const void *src, size_t bytes);
    void (*to_host)(weft_backend *self, void *dst, const void *src, size_t bytes);
    void (*copy)(weft_backend *self, void *dst, const void *src, size_t bytes);
    void (*zero)(weft_backend *self, void *dst, size_t bytes);
    void (*synchronize)(weft_backend *self);
    // Bytes the device could still allocate (host RAM the CPU backend could take), for sizing
    // caches as a fraction of what is free.
    size_t (*memory_available)(weft_backend *self);
    // Optional (NULL: plain host memory serves). Host memory the device copies to and from at
    // full speed (pinned, on CUDA), for buffers that cross often, as the RL loop's offloaded
    // optimizer state does every step. An upload from it may still be in flight when to_device
    // returns: leave it unchanged until the stream has passed the copy (a later download on the
    // stream comes after it).
    void *(*host_alloc)(weft_backend *self, size_t bytes);
    void (*host_free)(weft_backend *self, void *p);
    // Optional (NULL: to_host is the only download). A download queued behind the work before it
    // into host memory from host_alloc, returning at once, so the host prepares the next step
    // while the device runs this one; download_wait(ticket) returns once the bytes are there.
    // Every ticket is waited for exactly once.
    void *(*download_begin)(weft_backend *self, void *dst, const void *src, size_t bytes);
    void (*download_wait)(weft_backend *self, void *ticket);

    // C (m, n) = alpha * op(A) op(B) + beta * C_in (+ bias), row-major; op(A) is (m, k), op(B)
    // is (k, n). lda/ldb/ldc are row strides of the stored (untransposed) matrices; c_in (laid out
    // like C) NULL means C itself. A residual added on the way (c_in the block's input) saves the
    // copy of it into C, a kernel launch per use. bias (n) (NULL: none; C of the act dtype, ldc =
    // n) is added to every row of the stored result, as a separate add after it would: the
    // product is rounded to C's type first. backward of a bias: bias_backward.
    void (*matmul)(weft_backend *self, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                   const void *a, int lda, const void *b, int ldb, float beta, const void *c_in,
                   const void *bias, void *c, int ldc, weft_matmul_types types);

    // out (T, C) = table[ids] ; table (V, C) param
    void (*embedding_forward)(weft_backend *self, const int32_t *ids, const void *table, void *out,
                              int T, int C);
    // dtable (V, C) f32 += scatter of dout (T, C)
    void (*embedding_backward)(weft_backend *self, const int32_t *ids, const void *dout,
                               float *dtable, int T, int C);

    // out (T, C) = x / rms(x) * w ; rstd (T) f32 saved for backward
    void (*rmsnorm_forward)(weft_backend *self, const void *x, const void *w, float eps, void *out,
                            float *rstd, int T, int C);
    // dx (T, C) += ... (x also feeds the residual stream) ; dw (C) f32 += ...
    void (*rmsnorm_backward)(weft_backend *self, const void *x, const void *w, const float *rstd,
                             const void *dout, void *dx, float *dw, int T, int C);

    // Copies between fused (rows, sum of parts' widths) and the parts (each (rows, width)):
    // into the parts, or with join, from them into fused. With rotate (else NULL), the same as
    // rope_forward on fused's rows before the split, or rope_backward after the join, in the
    // same pass: the q|k|v projection's one RoPE and one copy.
    void (*split_columns)(weft_backend *self, void *fused, const weft_column_parts *parts,
                          int rows, bool join, const weft_rope_rows *rotate);

    // The backward of matmul's bias: dbias (C) f32 += column sums of dout (T, C)
    void (*bias_backward)(weft_backend *self, const void *dout, float *dbias, int T, int C);

    // Rotary embedding in place on the first H heads of D of x's T rows, ld elements apart (ld
    // H * D: x (T, H, D); more: q and k heads at the start of fused q|k|v rows), Hugging Face
    // rotate-half convention: pair (i, i + D/2) of every head of row t turns by the angle
    // positions[t] * inv_freq[i], and both cos and sin are scaled by `scale` (YaRN's attention
    // factor, else 1). inv_freq (D/2) f32 on the device is the model's table (weft_rope_table),
    // so every rope scaling is one table. backward applies the adjoint to dx in place: the
    // inverse rotation, scaled by `scale`.
    void (*rope_forward)(weft_backend *self, void *x, int ld, const int32_t *positions,
                         const float *inv_freq, float scale, int T, int H, int D);
    void (*rope_backward)(weft_backend *self, void *dx, int ld, const int32_t *positions,
                          const float *inv_freq, float scale, int T, int H, int D);

    // Causal attention over packed documents, grouped-query heads (H % KV == 0: query head h
    // reads kv head h / (H/KV)). Query rows [cu_q[d], cu_q[d+1]) of document d see key rows
    // cu_kv[d] + [0, q_pos[row]]: causal by position, never across documents. Without context
    // parallelism queries and keys are the same rows (cu_q == cu_kv, q_pos the position); under
    // it the queries are this rank's chunks and the keys the whole (gathered) document.
    // q (Tq, H, D), k/v (Tkv, KV, D); out (Tq, H, D); lse (H, Tq) f32 log-sum-exp per row.
    void (*attention_forward)(weft_backend *self, const void *q, const void *k, const void *v,
                              const weft_attention_layout *layout, void *out, float *lse, int H,
                              int KV, int D);
    // dq (Tq, H, D), dk/dv (Tkv, KV, D) overwritten.
    void (*attention_backward)(weft_backend *self, const void *q, const void *k, const void *v,
                               const weft_attention_layout *layout, const void *out,
                               const float *lse, const void *dout, void *dq, void *dk, void *dv,
                               int H, int KV, int D);

    // Writes T rows of one layer's keys and values into the pool: row t to slot[t] (block *
    // block_size + offset); a negative slot stores nothing (a padding row). k, v (T, width) act
    // dtype; slot (T) int32 on the device.
    void (*kv_store)(weft_backend *self, const weft_kv_pool *pool, int layer, const int32_t *slot,
                     const void *k, const void *v, int T);
    // split_columns of q|k|v rows (parts q, k, v, each T rows) with rotate, and kv_store of k
    // and v, as one op: a decode step's split and store in one launch on a GPU, where the parts
    // k and v may be left unwritten (the pool holds them).
    void (*split_store)(weft_backend *self, void *fused, const weft_column_parts *parts, int T,
                        const weft_rope_rows *rotate, const weft_kv_pool *pool, int layer,
                        const int32_t *slot);
    // Causal attention of q (Tq, H, D) over the keys and values of `layer` held in the pool, as
    // the layout says; out (Tq, H, D), lse (H, Tq) f32. Per row the same arithmetic as
    // attention_forward over the same keys in one contiguous document, so a decoded row matches
    // the training forward's (bit for bit on the CPU).
    void (*paged_attention)(weft_backend *self, const void *q, const weft_kv_pool *pool,
                            int layer, const weft_paged_layout *layout, void *out, float *lse,
                            int H, int KV, int D);

    // out (rows, width) = silu(gate) * up, where gate_up (rows, 2 width) holds each row's gate
    // then its up (the fused gate and up projections' output); backward overwrites d_gate_up
    void (*swiglu_forward)(weft_backend *self, const void *gate_up, void *out, int rows,
                           int width);
    // A forward-only pass's MLP input: out (rows, width) = swiglu_forward of the product
    // x W^T (rows, 2 width), x (rows, C) act dtype, W (2 width, C) param dtype (the gate rows
    // then the up rows), bit for bit as matmul into gate_up and swiglu_forward give it. gate_up
    // (rows, 2 width) is scratch the op may leave unwritten (the product need not be kept).
    void (*swiglu_product)(weft_backend *self, const void *x, const void *w, void *gate_up,
                           void *out, int rows, int C, int width);
    void (*swiglu_backward)(weft_backend *self, const void *gate_up, const void *dout,
                            void *d_gate_up, int rows, int width);
    // Optional (NULL, or false returned: nothing done, and the caller runs the ops one by one). A
    // forward-only pass's product of normalized rows in one op: rmsnorm_forward of np->x with
    // np->norm_w into a buffer, then that buffer times W (N, C) (+ bias) into y (rows, N) as
    // matmul stores it, or with swiglu (W (2N, C), the gate rows then the up rows; no bias) as
    // swiglu_product does; the same bits, the normalized rows never written.
    bool (*norm_product)(weft_backend *self, const weft_norm_product *np, void *y, int N,
                         bool swiglu);
    // Optional, as norm_product. A decode step's q|k|v in one op: norm_product of np into fused
    // (np->rows, the parts' widths) and then split_store of those rows, the same bits in part q
    // and the pool; fused and the parts k and v may be left unwritten.
    bool (*norm_product_store)(weft_backend *self, const weft_norm_product *np, void *fused,
                               const weft_column_parts *parts, const weft_rope_rows *rotate,
                               const weft_kv_pool *pool, int layer, const int32_t *slot);

    // y (N) += x
    void (*add_inplace)(weft_backend *self, void *y, const void *x, size_t N);

    // Fused masked cross-entropy on logits (T, V), in place: rows with targets[t] >= 0 become
    // scale * (softmax - onehot), other rows 0. Per-row loss (T) f32 is written (0 without a
    // target) and, if correct != NULL, 1 where argmax == target. Returns nothing; sums are
    // reduced by `sum_f32`.
    void (*cross_entropy)(weft_backend *self, void *logits, const int32_t *targets, float scale,
                          float *row_loss, float *correct, int T, int V);

    // Log-probabilities of the targets under softmax(logits), logits (T, V) unchanged:
    // logprob (T) f32 = logits[t, y] - logsumexp(logits[t]) where y = targets[t] >= 0, else 0;
    // entropy (T) f32 or NULL: -sum_j p_j log p_j on rows with a target, else 0; correct (T) f32
    // or NULL: 1 where argmax == target. The same arithmetic as cross_entropy's loss, so
    // logprob = -row_loss bit for bit.
    void (*logprobs)(weft_backend *self, const void *logits, const int32_t *targets,
                     float *logprob, float *entropy, float *correct, int T, int V);
    // lse (T) f32: each row's log-normalizer, such that -(lse[t] - logits[t, y]) in f32 is the
    // logprobs op's logprob of token y bit for bit: the rollout downloads it beside the logits it
    // draws from on the host and needs no second trip for the drawn tokens' log-probs. Optional:
    // NULL where logprobs' arithmetic does not split so (the CPU, whose rollout reads the logits
    // in place and calls logprobs itself).
    void (*log_normalizers)(weft_backend *self, const void *logits, float *lse, int T, int V);
    // Draws n tokens: draw d reads row rows[d] of logits (., V) and takes, with temperature 0,
    // its first largest logit; else, of the tokens the filters keep (rollout/sampling.h's
    // processed distribution: top-k, then top-p over its survivors, then min-p; NULL: none), the
    // first whose cumulative weight exp((l - max) / temperature) in token order, in double,
    // exceeds u[d] (in [0, 1)) times the kept total. tokens (n) int32; logprob (n) f32: the drawn
    // token's log-probability under the model (temperature 1), the bits logprobs gives that row
    // and token; processed (n) f32: its log-probability under the distribution drawn from (0 when
    // greedy). A draw depends on its row and u alone. Optional: NULL where the caller draws on
    // the host (the CPU backend, whose rollout reads the logits in place).
    void (*sample_tokens)(weft_backend *self, const void *logits, const int32_t *rows,
                          const double *u, int n, int V, float temperature,
                          const weft_draw_filters *filters, int32_t *tokens, float *logprob,
                          float *processed);
    // Speculative sampling's verification (rollout/speculate.c's rule) of n sequences' drafts, on
    // the device: sequence i's index (n, 2 + k) int32 holds its first target row p_row, its
    // n_drafts (0..k) and the draft rows its drafts came from (k): draft row r was drawn from row
    // r of draft_logits (., V) and is token draft_tokens[r]; its u (n, 2k + 1) the acceptance
    // numbers (k; -1 accepts any draft), the residual draws' (k) and the bonus token's. Draft d
    // is checked against logits row p_row + d under the processed distributions (sample_tokens';
    // greedy: it passes where it is that row's first largest logit); the first that fails is
    // replaced by a token drawn from max(0, p - q) normalized (p's largest logit, greedy), and
    // when all pass a bonus token is drawn from row p_row + n_drafts. count (n) int32: the tokens
    // emitted, at most k + 1; tokens, logprob, processed (n, k + 1): as sample_tokens'
    // (processed: under p's processed distribution). A sequence's outcome depends on its rows
    // and numbers alone. Optional.
    void (*verify_drafts)(weft_backend *self, const void *logits, const void *draft_logits,
                          const int32_t *draft_tokens, const int32_t *index, const double *u,
                          int n, int k, int V, float temperature, const weft_draw_filters *filters,
                          int32_t *tokens, float *logprob, float *processed, int32_t *count);
    // tokens[r] = drawn[from[r]] for the rows r < n with from[r] >= 0 (int32 on the device; the
    // other rows keep theirs): token ids drawn by the step before, which the host has not read
    // yet, fed to the next. Optional with sample_tokens.
    void (*take_tokens)(weft_backend *self, int32_t *tokens, const int32_t *drawn,
                        const int32_t *from, int n);
    // In place on logits (T, V): the gradient of sum_t (d_logprob[t] * logp_t + d_entropy[t] *
    // H_t) with respect to them. Rows with a target become d_logprob[t] * (onehot - p) -
    // d_entropy[t] * p * (log p + H), other rows 0. d_entropy may be NULL. With d_entropy NULL and
    // d_logprob[t] = -scale this is cross_entropy's gradient bit for bit.
    void (*logits_backward)(weft_backend *self, void *logits, const int32_t *targets,
                            const float *d_logprob, const float *d_entropy, int T, int V);

    // sum of x (N) f32 / sum of squares of x (N) f32, accumulated in double on the host side.
    double (*sum_f32)(weft_backend *self, const float *x, size_t N);
    double (*sumsq_f32)(weft_backend *self, const float *x, size_t N);
    // *acc (one f64 in device memory) += scale * sum of x (N) f32, or of its squares, without
    // the host waiting: a step's sums stay on the device and are read back once.
    void (*accumulate_f32)(weft_backend *self, const float *x, size_t N, bool squares,
                           double scale, double *acc);
    void (*scale_f32)(weft_backend *self, float *x, float s, size_t N);

    // AdamW on one parameter tensor: decoupled weight decay, bias-corrected moments.
    // param (N) param dtype, master (N) f32 or NULL when params are f32, grad/m/v (N) f32.
    void (*adamw)(weft_backend *self, void *param, float *master, const float *grad, float *m,
                  float *v, size_t N, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int step);

    // Converts between the host's fp32 and the device's param/act dtype (for loading weights,
    // writing outputs): dst (N) device dtype <- src (N) host f32, and back.
    void (*from_f32)(weft_backend *self, void *dst, weft_dtype dst_type, const float *src_host,
                     size_t N);
    void (*to_f32)(weft_backend *self, float *dst_host, const void *src, weft_dtype src_type,
                   size_t N);

    // Graphs (optional: NULL where the backend has none). Between capture_begin and capture_end
    // the ops queued are recorded instead of run, and may not allocate, free, upload, download or
    // synchronize; graph_launch then runs the recording, with the pointers and sizes it was
    // queued with, on the memory as it is at that point. Where launching an op costs the host more
    // than the device takes to run it (a decode step of the rollout: hundreds of small kernels),
    // one graph launch replaces them all. capture_begin returns false when it cannot capture now
    // (the CUDA profile times every op, so it runs them one by one); graph_free takes a graph.
    bool (*capture_begin)(weft_backend *self);
    void *(*capture_end)(weft_backend *self);
    void (*graph_launch)(weft_backend *self, void *graph);
    void (*graph_free)(weft_backend *self, void *graph);

    // Optional (NULL where a backend keeps nothing). Between params_fixed and params_released
    // the caller promises that the `bytes` at `params` do not change, so the backend may keep
    // copies derived from them: the CPU backend packs the weights among them once for products of
    // a few rows (a decode step), instead of on every call. Results are the same bits either way.
    void (*params_fixed)(weft_backend *self, const void *params, size_t bytes);
    void (*params_released)(weft_backend *self);
    // Optional. While the parameters are fixed and `rounded` is set, products x W^T may read
    // weights among them rounded to bf16 (the CPU backend: half the bytes of its fp32 weights),
    // each row's bits still its own alone. Only for passes whose results propose and are then
    // checked, never recorded: speculative drafts (rollout.draft_bf16).
    void (*round_fixed_weights)(weft_backend *self, bool rounded);
    // Optional (NULL where every forward op already is, as on the CPU: row-stable products, one
    // attention order). While `on`, the forward-only ops give each row the same bits whatever
    // other rows share the call and however many: every product x W^T (matmul into the
    // activation type, swiglu_product) takes one reduction order for any row count,
    // norm_product and norm_product_store decline, and paged_attention splits a row's keys at a
    // fixed size. attention_forward is not covered: a caller that needs the same bits routes
    // every row through paged_attention (rollout.batch_invariant). Errors where the device
    // cannot.
    void (*batch_invariant)(weft_backend *self, bool on);

    void (*destroy)(weft_backend *self); // frees what impl holds
    void *impl;
    // How often the host has waited for the device (downloads, synchronize, sums read back): a
    // training step should wait a fixed number of times, never once per micro-batch. And the bytes
    // the host has read back (downloads).
    long host_waits;
    size_t host_bytes_read;
    // Bytes of `alloc` buffers live now, and the most live since the last
    // weft_backend_reset_peak: the measured memory of a phase (rollout's KV pool comes and goes).
    size_t bytes_in_use, peak_bytes;
    // alloc and free calls so far: while it stands still, every pointer a graph recorded is live.
    long allocations;
    // Seconds the host waits for queued device work before it ends the job as stuck (a kernel or
    // copy that never finishes would otherwise hang it for good); 0: no limit. A new backend has
    // WEFT_DEVICE_TIMEOUT; weft_backend_set_wait_timeout sets the job's. The CPU never waits.
    double wait_timeout;
};

// For the backends' alloc and free: bytes (> 0: allocated, < 0: freed).
void weft_backend_count_bytes(weft_backend *b, long long bytes);
// Starts a new peak from the bytes live now.
void weft_backend_reset_peak(weft_backend *b);
// The job's device_timeout (checked with the job's settings): see wait_timeout.
#define WEFT_DEVICE_TIMEOUT 300.0 // the default, as parallel.collective_timeout's
void weft_backend_set_wait_timeout(weft_backend *b, double seconds);

weft_backend *weft_backend_cpu_create(void);
// The GPU with index local_rank % (visible GPUs): one rank per GPU on each node. In a build
// without CUDA it ends the job with a message saying so.
weft_backend *weft_backend_cuda_create(int local_rank);
// Visible CUDA GPUs; 0 without a GPU, a driver, or CUDA support in this build.
int weft_cuda_device_count(void);
// GPU `device`'s compute capability as 10 x major + minor (90 for H100 and H200); 0 without one.
int weft_cuda_compute_capability(int device);
// A symbol of the CUDA plugin (libweft_cuda.so, opened on first use: backend/cuda_plugin.c), for
// comm's NCCL side, which lives in the plugin too. NULL with *error saying why when the plugin or
// the symbol is missing. Only in builds with CUDA.
void *weft_cuda_plugin_symbol(const char *name, const char **error);
typedef enum { WEFT_DEVICE_CPU, WEFT_DEVICE_CUDA } weft_device;
// The backend of a job's `device` setting.
weft_backend *weft_backend_create(weft_device device, int local_rank);
// Process-wide set-up the backends need before any thread exists: call first thing in main().
// It may re-execute the process (OpenBLAS's core type can only be chosen before it loads).
void weft_backend_prepare_process(void);
void weft_backend_destroy(weft_backend *b);
