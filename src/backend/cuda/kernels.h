// The CUDA kernels' C interface, implemented in the .cu files beside it. The backend table
// (cuda.c) is plain C and calls only these launchers, so no weft header is ever compiled as C++.
// Tensors named "bf16" hold bfloat16 bits; every launch is asynchronous on `stream`.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Where the launchers queue their kernels: a CUDA stream, and whether each kernel may be launched
// while the one before it still runs (programmatic dependent launch, sm_90 and newer). Every weft
// kernel first waits until the kernels before it have finished (common.cuh's
// wait_for_earlier_kernels), so an early launch hides only the launch's latency: the same work in
// the same order, the same bits. cuda.c owns the one queue; the launchers only read it.
// prefetch_weights: the few-row and skinny products ask L2 for their weights before that wait
// (common.cuh's fixed_rows), so an early-launched product streams them meanwhile.
// skinny_shared_x: skinny.cu stages x in shared memory from 33 rows on (past 64 it always does).
typedef struct weft_cuda_queue {
    struct CUstream_st *stream;
    bool early_launch, prefetch_weights, skinny_shared_x;
} weft_cuda_queue;
typedef const weft_cuda_queue *weft_cuda_stream;

// Attention head dimensions the kernels are built for (one lane owns up to 4 of 128 dims).
enum { WEFT_CUDA_MAX_HEAD_DIM = 128 };

// out (T, C) bf16 = table[ids] ; dtable (V, C) f32 += rows of dout (T, C) bf16
void weft_cuda_embedding_forward(weft_cuda_stream s, const int32_t *ids, const void *table,
                                 void *out, int T, int C);
// (the backward adds each table row's occurrences in token order, without atomics: the same bits
// on every run)
void weft_cuda_embedding_backward(weft_cuda_stream s, const int32_t *ids, const void *dout,
                                  float *dtable, int T, int C);

// RMSNorm over rows of x (T, C) bf16 with weight w (C) bf16; rstd (T) f32.
// backward: dx (T, C) bf16 += ..., dw (C) f32 += ...
void weft_cuda_rmsnorm_forward(weft_cuda_stream s, const void *x, const void *w, float eps,
                               void *out, float *rstd, int T, int C);
void weft_cuda_rmsnorm_backward(weft_cuda_stream s, const void *x, const void *w,
                                const float *rstd, const void *dout, void *dx, float *dw, int T,
                                int C, float *partials);

// x (T, C) bf16 += bias (C) bf16 ; dbias (C) f32 += column sums of dout (T, C) bf16
void weft_cuda_bias_forward(weft_cuda_stream s, void *x, const void *bias, int T, int C);
void weft_cuda_bias_backward(weft_cuda_stream s, const void *dout, float *dbias, int T, int C,
                             float *partials);
// The device scratch the column reductions above (rmsnorm's dw, the bias's db) take: per-block
// sums added in block order, with no atomics, so the gradients are the same bits on every run.
size_t weft_cuda_column_partials_bytes(int T, int C);

// Rotates pairs (i, i + D/2) of the first H heads of D of x's T rows (ld apart) bf16 in place by
// sign * pos * inv_freq[i] (inv_freq (D/2) f32 on the device) and scales both by scale.
void weft_cuda_rope(weft_cuda_stream s, void *x, int ld, const int32_t *positions,
                    const float *inv_freq, float scale, int T, int H, int D, float sign);

// y (M, N) bf16 = alpha x (M, K) W^T + beta c_in (M, N) (+ bias (N), NULL: none, added to the
// stored bf16 result as weft_cuda_bias_forward adds it), for M <= WEFT_CUDA_FEW_ROWS: x and W
// (N, K) bf16 row-major with row strides ldx, ldw; y and c_in (which may be y) with ldc. The
// decode step's projections, streaming W at bandwidth where a GEMM's tiles leave SMs idle; each
// row's result is the same bits whatever rows come with it (few_rows.cu). covers: M in range,
// K, ldx, ldw multiples of 8 and x, W 16-byte aligned; else use the GEMM.
enum { WEFT_CUDA_FEW_ROWS = 8 };
bool weft_cuda_few_rows_covers(int M, int K, const void *x, int ldx, const void *w, int ldw);
void weft_cuda_few_rows(weft_cuda_stream s, int M, int N, int K, float alpha, const void *x,
                        int ldx, const void *w, int ldw, float beta, const void *c_in,
                        const void *bias, void *y, int ldc);
// The same product for WEFT_CUDA_FEW_ROWS < M <= WEFT_CUDA_SKINNY_ROWS on the tensor cores
// (mma.sync, compute capability 8.0 and up): blocks of 64 columns and a range of K, whose fp32
// sums the last block of each column block adds in a fixed order, so runs repeat bit for bit
// (skinny.cu). It takes any M (blocks of 64 rows past 64), and each row's result is the same
// bits whatever rows come with it, from 1 to thousands (not few_rows.cu's bits: another order),
// which batch-invariant generation relies on. partials: device scratch of
// weft_cuda_skinny_partials_bytes; arrived: the arrival counters. fits: K a multiple of 32, ldx
// and ldw of 8, x and W 16-byte aligned; else use the GEMM. WEFT_CUDA_SKINNY_ROWS: the most rows
// the backend gives it by default (switches.h).
enum { WEFT_CUDA_SKINNY_ROWS = 64 };
// Arrival counters: WEFT_CUDA_ARRIVAL_COUNTERS device ints, zero before the first call of a
// kernel that takes them, which leaves them zero. A kernel's blocks count themselves in there
// so that the last to finish of a group adds the group's partial sums in a fixed order. Kernels
// on one stream never overlap (each waits for the one before: wait_for_earlier_kernels), so
// they share one set.
enum { WEFT_CUDA_ARRIVAL_COUNTERS = 1024 };
bool weft_cuda_skinny_fits(int K, const void *x, int ldx, const void *w, int ldw);
size_t weft_cuda_skinny_partials_bytes(int M, int N, int K);
void weft_cuda_skinny(weft_cuda_stream s, int M, int N, int K, float alpha, const void *x,
                      int ldx, const void *w, int ldw, float beta, const void *c_in,
                      const void *bias, void *y, int ldc, float *partials, int *arrived);
// y (M, width) = swiglu of x W^T (M, 2 width), as weft_cuda_few_rows_swiglu for such rows: the
// bits of weft_cuda_skinny into (M, 2 width) and then weft_cuda_swiglu_forward; partials of
// weft_cuda_skinny_partials_bytes(M, 2 width, K).
void weft_cuda_skinny_swiglu(weft_cuda_stream s, int M, int width, int K, const void *x, int ldx,
                             const void *w, int ldw, void *y, int ldy, float *partials,
                             int *arrived);
// y (M, width) bf16 = swiglu of x W^T (M, 2 width), W (2 width, K) the gate rows then the up
// rows (ldw apart): the bits of weft_cuda_few_rows into (M, 2 width) and then
// weft_cuda_swiglu_forward, in one launch and without the product. Where covers says so.
void weft_cuda_few_rows_swiglu(weft_cuda_stream s, int M, int width, int K, const void *x,
                               int ldx, const void *w, int ldw, void *y, int ldy);
// weft_cuda_few_rows (alpha 1, beta 0, bias; y (M, N)) or, with swiglu, weft_cuda_few_rows_swiglu
// (width N) of x's rows normalized on the way in: the bits of weft_cuda_rmsnorm_forward (weights
// norm_w (K)) into a buffer and then the product, in one launch and without the normalized rows.
// Rows K apart; where few_rows covers (M, K, x, w) and norm_w is 16-byte aligned.
void weft_cuda_few_rows_normed(weft_cuda_stream s, int M, int N, int K, const void *x,
                               const void *norm_w, float eps, const void *w, const void *bias,
                               void *y, bool swiglu);
// weft_cuda_few_rows_normed of a q|k|v product (N = q_width + 2 kv_width) followed by
// weft_cuda_split_store of its rows, in one launch: the same bits in q and the pool, the fused
// rows never written. Also where D % 2 == 0 and q_width and kv_width are multiples of D.
void weft_cuda_few_rows_normed_store(weft_cuda_stream s, int M, int K, const void *x,
                                     const void *norm_w, float eps, const void *w,
                                     const void *bias, void *q, int q_width, int kv_width,
                                     const int32_t *positions, const float *inv_freq, float scale,
                                     int heads, int D, void *pool, int layers, int block_size,
                                     int layer, const int32_t *slot);

// Copies between fused (rows, sum of widths) and n (at most 3) parts (rows, widths[i]): into
// them, or with join from them (backend.h's weft_column_parts, passed as its fields). bf16.
// heads > 0 also turns each fused row's first `heads` heads of D as weft_cuda_rope does (same
// bits), before the split (fused turned too) or, backward (sign -1), after the join.
void weft_cuda_split_columns(weft_cuda_stream s, void *fused, void *const *parts,
                             const int *widths, int n, int rows, bool join,
                             const int32_t *positions, const float *inv_freq, float scale,
                             int heads, int D);

// out (rows, width) = silu(gate) * up, gate and up the two halves of each row of gate_up (rows,
// 2 width); backward overwrites d_gate_up (rows, 2 width). All bf16.
void weft_cuda_swiglu_forward(weft_cuda_stream s, const void *gate_up, void *out, int rows,
                              int width);
void weft_cuda_swiglu_backward(weft_cuda_stream s, const void *gate_up, const void *dout,
                               void *d_gate_up, int rows, int width);

// y (N) bf16 += x (N) bf16 ; x (N) f32 *= scale
void weft_cuda_add_bf16(weft_cuda_stream s, void *y, const void *x, size_t N);
void weft_cuda_scale_f32(weft_cuda_stream s, float *x, float scale, size_t N);
// *result (device double) = sum of x, or of x squared, times scale; with accumulate it is added
// to *result instead. partials: WEFT_CUDA_SUM_PARTIALS doubles of device scratch (the blocks'
// sums, added in a fixed order: the result is the same bits on every run).
enum { WEFT_CUDA_SUM_PARTIALS = 8192 };
void weft_cuda_sum_f32(weft_cuda_stream s, const float *x, size_t N, bool squares, double scale,
                       bool accumulate, double *result, double *partials);

// AdamW over N elements with fp32 state; with master != NULL the fp32 master is updated and
// param (bf16) is its rounding, else param is the fp32 tensor itself.
void weft_cuda_adamw(weft_cuda_stream s, void *param, float *master, const float *grad, float *m,
                     float *v, size_t N, float lr, float beta1, float beta2, float eps,
                     float weight_decay, int step);

// Fused masked cross-entropy in place on logits (T, V) bf16: rows with a target become
// scale * (softmax - onehot), the rest 0; row_loss (T) f32, correct (T) f32 or NULL.
void weft_cuda_cross_entropy(weft_cuda_stream s, void *logits, const int32_t *targets,
                             float scale, float *row_loss, float *correct, int T, int V);
// The targets' log-probs (T) f32, entropy (T) f32 or NULL and correct (T) f32 or NULL from logits
// (T, V) bf16, which stay as they are.
void weft_cuda_logprobs(weft_cuda_stream s, const void *logits, const int32_t *targets,
                        float *logprob, float *entropy, float *correct, int T, int V);
// backend.h's log_normalizers: lse (T) f32 of logits (T, V) bf16.
void weft_cuda_log_normalizers(weft_cuda_stream s, const void *logits, float *lse, int T, int V);
// Draws n tokens from rows of logits (., V) bf16: backend.h's sample_tokens (sampling.cu).
void weft_cuda_sample_tokens(weft_cuda_stream s, const void *logits, const int32_t *rows,
                             const double *u, int n, int V, float temperature, int top_k,
                             double top_p, double min_p, int32_t *tokens, float *logprob,
                             float *processed);
// Checks n sequences' drafts against rows of logits (., V) bf16: backend.h's verify_drafts
// (sampling.cu).
void weft_cuda_verify_drafts(weft_cuda_stream s, const void *logits, const void *draft_logits,
                             const int32_t *draft_tokens, const int32_t *index, const double *u,
                             int n, int k, int V, float temperature, int top_k, double top_p,
                             double min_p, int32_t *tokens, float *logprob, float *processed,
                             int32_t *count);
// backend.h's take_tokens (sampling.cu).
void weft_cuda_take_tokens(weft_cuda_stream s, int32_t *tokens, const int32_t *drawn,
                           const int32_t *from, int n);
// In place on logits (T, V) bf16: the gradient of sum_t d_logprob[t] logp_t + d_entropy[t] H_t
// (d_entropy may be NULL); rows without a target become 0.
void weft_cuda_logits_backward(weft_cuda_stream s, void *logits, const int32_t *targets,
                               const float *d_logprob, const float *d_entropy, int T, int V);

// Varlen causal attention, grouped-query heads, as the backend op (backend.h) describes.
// q (Tq, H, D), k/v (Tkv, KV, D), out (Tq, H, D) bf16; lse (H, Tq) f32. Every tensor is dense;
// the mma kernels also need them 16-byte aligned.
typedef struct weft_cuda_attention_args {
    int n_docs, Tq, Tkv, H, KV, D;
    const int32_t *cu_q, *cu_kv, *q_pos; // device arrays
} weft_cuda_attention_args;

// Two kernel families behind one contract: "mma" runs QK^T, PV and the backward products on the
// tensor cores (bf16 mma.sync, fp32 accumulators; head_dim a multiple of 16, sm_80 or newer);
// "simt" is the fp32 CUDA-core version for any head_dim up to the limit.
void weft_cuda_attention_forward_mma(weft_cuda_stream s, const weft_cuda_attention_args *a,
                                     const void *q, const void *k, const void *v, void *out,
                                     float *lse);
void weft_cuda_attention_forward_simt(weft_cuda_stream s, const weft_cuda_attention_args *a,
                                      const void *q, const void *k, const void *v, void *out,
                                      float *lse);
// A third family, "hopper", for sm_90a (TMA, mbarriers, wgmma; attention_hopper*.cu). It covers
// head_dim 64 or 128 with at least one query and one key row (the caller runs the mma kernels on
// the rest); on those it returns false, with nothing launched, only where the driver refuses its
// TMA descriptors. Its lse is the mma one's, so either backward follows either forward. The
// forward takes blocks of 128 query rows, or at head_dim 64 of rows_at_64 = 192 (three consumer
// warpgroups, as FlashAttention-3 tiles head_dim 64).
bool weft_cuda_attention_hopper_covers(const weft_cuda_attention_args *a);
// Whether this family can run here: the plugin holds its sm_90a code for the current device
// (BUILT), or the emulator runs it (EMULATED: only where WEFT_CUDA_ATTENTION=hopper names it, as
// the op test does, since emulating it costs CI several times the mma kernels' time).
typedef enum { WEFT_HOPPER_ABSENT, WEFT_HOPPER_BUILT, WEFT_HOPPER_EMULATED } weft_cuda_hopper_code;
weft_cuda_hopper_code weft_cuda_attention_hopper_code(void);
bool weft_cuda_attention_forward_hopper(weft_cuda_stream s, const weft_cuda_attention_args *a,
                                        const void *q, const void *k, const void *v, void *out,
                                        float *lse, int rows_at_64);
// The backward computes dQ in the dK/dV kernel, summed in a fixed order, where ordered_dq, else
// (faster so far, the backend's default) in a kernel of its own (attention_hopper_backward.cu),
// whose blocks take 192 query rows at head_dim 64 where rows_at_64 says so, as the forward's;
// its scratch is as many bytes as the function below says (the mma backward's partials, then with
// ordered_dq the fp32 sums).
size_t weft_cuda_attention_hopper_scratch_bytes(const weft_cuda_attention_args *a, bool ordered_dq);
bool weft_cuda_attention_backward_hopper(weft_cuda_stream s, const weft_cuda_attention_args *a,
                                         const void *q, const void *k, const void *v,
                                         const float *lse, const void *dout, const float *delta,
                                         void *dq, void *dk, void *dv, float *scratch,
                                         bool ordered_dq, int rows_at_64);
// delta (H, Tq) f32 = rowsum(dout * out), the backward's first pass.
void weft_cuda_attention_delta(weft_cuda_stream s, const void *out, const void *dout,
                               float *delta, int Tq, int H, int D);
// dq, dk, dv overwritten (bf16), from the forward's lse and the delta above. The mma backward
// also needs weft_cuda_attention_partials_bytes(a) of device scratch (0 without grouped heads).
size_t weft_cuda_attention_partials_bytes(const weft_cuda_attention_args *a);
void weft_cuda_attention_backward_mma(weft_cuda_stream s, const weft_cuda_attention_args *a,
                                      const void *q, const void *k, const void *v,
                                      const float *lse, const void *dout, const float *delta,
                                      void *dq, void *dk, void *dv, float *partials);
void weft_cuda_attention_backward_simt(weft_cuda_stream s, const weft_cuda_attention_args *a,
                                       const void *q, const void *k, const void *v,
                                       const float *lse, const void *dout, const float *delta,
                                       void *dq, void *dk, void *dv);

// The paged KV cache (backend.h's weft_kv_pool and weft_paged_layout, passed as their fields).
// pool (n_blocks, layers, 2, block_size, width) bf16.
typedef struct weft_cuda_paged_args {
    void *pool;
    int layers, block_size, width; // width = KV * D
    int n_seqs, Tq, max_blocks, H, KV, D;
    const int32_t *cu_q, *q_pos, *block_tables; // device arrays
    int split_keys; // positions per split-K block; 0: the launcher's choice (tests force splits)
    bool tensor_cores; // mma.sync (compute capability 8.0 and up) at head_dim 64 and 128
} weft_cuda_paged_args;
// split_keys of a batch-invariant call (the backend's batch_invariant): fixed, so a row's splits,
// and its bits, depend on its own keys alone. Two tiles a warp (paged.cu).
enum { WEFT_CUDA_INVARIANT_SPLIT_KEYS = 256 };

// weft_cuda_split_columns of q|k|v rows turning their first `heads` heads, with k and v (each
// kv_width wide) going to the pool as weft_cuda_kv_store puts them rather than to parts of their
// own: q (rows, q_width). A decode step's split and store in one launch.
void weft_cuda_split_store(weft_cuda_stream s, void *fused, void *q, int q_width, int kv_width,
                           int rows, const int32_t *positions, const float *inv_freq, float scale,
                           int heads, int D, void *pool, int layers, int block_size, int layer,
                           const int32_t *slot);
// Rows t of k, v (T, width) bf16 to the pool's slot[t] (block * block_size + offset) of `layer`.
void weft_cuda_kv_store(weft_cuda_stream s, void *pool, int layers, int block_size, int width,
                        int layer, const int32_t *slot, const void *k, const void *v, int T);
// Causal attention of q (Tq, H, D) bf16 over `layer`'s pooled keys and values: out (Tq, H, D)
// bf16, lse (H, Tq) f32. Long sequences are split over several blocks whose partial results
// need weft_cuda_paged_partials_bytes(a) of device scratch (0 when the call does not split);
// the last block of a split sequence combines them where `arrived` (the arrival counters) has a
// counter for each sequence's blocks, else a second kernel does, with the same bits. NULL: the
// second kernel always.
size_t weft_cuda_paged_partials_bytes(const weft_cuda_paged_args *a);
void weft_cuda_paged_attention(weft_cuda_stream s, const weft_cuda_paged_args *a, int layer,
                               const void *q, void *out, float *lse, float *partials,
                               int *arrived);

#ifdef __cplusplus
}
#endif
