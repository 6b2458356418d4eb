// The CUDA backend: bf16 parameters and activations, fp32 gradients, optimizer state and master
// weights (DESIGN.md section 9). GEMMs go through cuBLASLt with fp32 accumulation; everything else
// is weft's own kernels (kernels.h). All work is queued on one stream, so ops are ordered exactly
// as the model calls them and the host only waits where it reads a result.
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/internal.h"
#include "backend/cuda/switches.h"

cudaStream_t weft_cuda_op_stream(weft_backend *self) {
    weft_cuda_profile_start(weft_cuda_state(self)->profile);
    return weft_cuda_state(self)->stream;
}

weft_cuda_stream weft_cuda_op_queue(weft_backend *self) {
    weft_cuda_profile_start(weft_cuda_state(self)->profile);
    return &weft_cuda_state(self)->queue;
}

// After an op is queued. A stuck wait names the last op that computes (`computes`): the
// download it waits for says nothing.
static void queued(weft_backend *self, const char *op, bool computes) {
    cudaError_t err = cudaGetLastError();
    WEFT_CHECK(err == cudaSuccess, "cuda: %s kernel failed to launch: %s", op,
               cudaGetErrorString(err));
    weft_cuda_profile_op(weft_cuda_state(self)->profile, op);
    if (computes) weft_cuda_state(self)->watch.last_op = op;
}

void weft_cuda_launched(weft_backend *self, const char *op) { queued(self, op, true); }

// Allocation, transfers and waits cannot be recorded in a graph: one during a capture is weft's
// bug, said plainly rather than as the CUDA error the capture would end with.
static void not_capturing(weft_backend *self, const char *what) {
    WEFT_CHECK(!weft_cuda_state(self)->capturing,
               "internal: %s while a CUDA graph is being captured", what);
}

// ------------------------------------------------------------------------------ memory ----

static void remember(weft_backend *self, void *p, size_t bytes) {
    cuda_state *st = weft_cuda_state(self);
    if (st->n_live == st->live_cap) {
        int cap = st->live_cap;
        st->live = weft_grow(st->live, st->n_live, &cap, sizeof(void *), 256);
        st->live_bytes = weft_grow(st->live_bytes, st->n_live, &st->live_cap, sizeof(size_t), 256);
    }
    st->live[st->n_live] = p, st->live_bytes[st->n_live++] = bytes;
    weft_backend_count_bytes(self, (long long)bytes);
}

static void forget(weft_backend *self, void *p) {
    cuda_state *st = weft_cuda_state(self);
    for (int i = st->n_live - 1; i >= 0; i--)
        if (st->live[i] == p) {
            weft_backend_count_bytes(self, -(long long)st->live_bytes[i]);
            st->live[i] = st->live[--st->n_live], st->live_bytes[i] = st->live_bytes[st->n_live];
            return;
        }
}

static void *cuda_alloc(weft_backend *self, size_t bytes) {
    not_capturing(self, "an allocation");
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        char want[32], have[32];
        weft_format_bytes(want, sizeof want, bytes);
        weft_format_bytes(have, sizeof have, free_b);
        weft_fatal("cuda: out of GPU memory allocating %s (%s free on device %d); lower "
                   "train.max_tokens_per_microbatch, turn on train.recompute, or add ranks",
                   want, have, weft_cuda_state(self)->device);
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, weft_cuda_state(self)->stream));
    remember(self, p, bytes);
    return p;
}

// cudaFree waits for the whole device: it counts as a host wait, and the stream's work is waited
// for first, with the watch's deadline, since cudaFree's own wait has none.
static void cuda_free(weft_backend *self, void *p) {
    not_capturing(self, "a free");
    if (!p) return;
    forget(self, p);
    weft_cuda_watch_host_wait(&weft_cuda_state(self)->watch, NULL, "a free of device memory");
    CUDA_CHECK(cudaFree(p));
}

// Pinned: copies to and from it run at the bus's speed, two to three times pageable memory's.
static void *cuda_host_alloc(weft_backend *self, size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        char want[32];
        weft_format_bytes(want, sizeof want, bytes);
        weft_fatal("cuda: cannot pin %s of host memory (for the optimizer state that "
                   "rl.offload_training_state moves out of the GPU during rollout, or the "
                   "rollout's downloads); free host memory, or turn rl.offload_training_state "
                   "off", want);
    }
    return p;
}

// cudaFreeHost waits for the device too.
static void cuda_host_free(weft_backend *self, void *p) {
    if (!p) return;
    weft_cuda_watch_event(&weft_cuda_state(self)->watch, NULL, "a free of pinned host memory");
    CUDA_CHECK(cudaFreeHost(p));
}

// An upload returns once its bytes are staged, so the caller may reuse its buffer at once, and it
// waits for nothing queued before it: the host keeps queueing the next micro-batch or decode step
// while the GPU runs the last. Small ones go through pinned slots (staging.h); from pageable
// memory the driver stages larger ones itself.
static void cuda_to_device(weft_backend *self, void *dst, const void *src, size_t bytes) {
    not_capturing(self, "an upload");
    if (bytes == 0) return;
    cudaStream_t s = weft_cuda_op_stream(self);
    if (!weft_cuda_staging_upload(weft_cuda_state(self)->staging, dst, src, bytes, s))
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    queued(self, "upload", false);
}

// A download waits for the value: the host reads it next.
static void cuda_to_host(weft_backend *self, void *dst, const void *src, size_t bytes) {
    not_capturing(self, "a download");
    if (bytes == 0) return;
    cudaStream_t s = weft_cuda_op_stream(self);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    queued(self, "download", false);
    weft_cuda_watch_host_wait(&weft_cuda_state(self)->watch, NULL, "a download");
    self->host_bytes_read += bytes;
}

// The ticket is an event recorded behind the copy: waiting on it waits for nothing queued later.
static void *cuda_download_begin(weft_backend *self, void *dst, const void *src, size_t bytes) {
    not_capturing(self, "a download");
    cudaStream_t s = weft_cuda_op_stream(self);
    cudaEvent_t done;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    queued(self, "download", false);
    self->host_bytes_read += bytes;
    CUDA_CHECK(cudaEventRecord(done, s));
    return done;
}

static void cuda_download_wait(weft_backend *self, void *ticket) {
    cudaEvent_t done = ticket;
    weft_cuda_watch_host_wait(&weft_cuda_state(self)->watch, done, "a download");
    CUDA_CHECK(cudaEventDestroy(done));
}

static void cuda_copy(weft_backend *self, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                               weft_cuda_op_stream(self)));
    weft_cuda_launched(self, "copy");
}

static void cuda_zero(weft_backend *self, void *dst, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, weft_cuda_op_stream(self)));
    weft_cuda_launched(self, "zero");
}

static void cuda_synchronize(weft_backend *self) {
    not_capturing(self, "a wait for the device");
    weft_cuda_watch_host_wait(&weft_cuda_state(self)->watch, NULL, "a wait for the device");
}

static size_t cuda_memory_available(weft_backend *self) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
}

float *weft_cuda_scratch(weft_backend *self, size_t bytes) {
    cuda_state *st = weft_cuda_state(self);
    if (bytes > st->scratch_bytes) {
        cuda_synchronize(self);
        cuda_free(self, st->scratch);
        st->scratch = cuda_alloc(self, bytes);
        st->scratch_bytes = bytes;
    }
    return st->scratch;
}

// ------------------------------------------------------------------------- kernel ops ----

#define STREAM(self) weft_cuda_op_queue(self)

static void cuda_embedding_forward(weft_backend *self, const int32_t *ids, const void *table,
                                   void *out, int T, int C) {
    weft_cuda_embedding_forward(STREAM(self), ids, table, out, T, C);
    weft_cuda_launched(self, "embedding_forward");
}

static void cuda_embedding_backward(weft_backend *self, const int32_t *ids, const void *dout,
                                    float *dtable, int T, int C) {
    weft_cuda_embedding_backward(STREAM(self), ids, dout, dtable, T, C);
    weft_cuda_launched(self, "embedding_backward");
}

static void cuda_rmsnorm_forward(weft_backend *self, const void *x, const void *w, float eps,
                                 void *out, float *rstd, int T, int C) {
    weft_cuda_rmsnorm_forward(STREAM(self), x, w, eps, out, rstd, T, C);
    weft_cuda_launched(self, "rmsnorm_forward");
}

static void cuda_rmsnorm_backward(weft_backend *self, const void *x, const void *w,
                                  const float *rstd, const void *dout, void *dx, float *dw, int T,
                                  int C) {
    float *partials = weft_cuda_scratch(self, weft_cuda_column_partials_bytes(T, C));
    weft_cuda_rmsnorm_backward(STREAM(self), x, w, rstd, dout, dx, dw, T, C, partials);
    weft_cuda_launched(self, "rmsnorm_backward");
}

static void cuda_bias_backward(weft_backend *self, const void *dout, float *dbias, int T, int C) {
    float *partials = weft_cuda_scratch(self, weft_cuda_column_partials_bytes(T, C));
    weft_cuda_bias_backward(STREAM(self), dout, dbias, T, C, partials);
    weft_cuda_launched(self, "bias_backward");
}

static void cuda_rope_forward(weft_backend *self, void *x, int ld, const int32_t *positions,
                              const float *inv_freq, float scale, int T, int H, int D) {
    weft_cuda_rope(STREAM(self), x, ld, positions, inv_freq, scale, T, H, D, 1.0f);
    weft_cuda_launched(self, "rope_forward");
}

static void cuda_rope_backward(weft_backend *self, void *dx, int ld, const int32_t *positions,
                               const float *inv_freq, float scale, int T, int H, int D) {
    weft_cuda_rope(STREAM(self), dx, ld, positions, inv_freq, scale, T, H, D, -1.0f);
    weft_cuda_launched(self, "rope_backward");
}

static void check_head_dim(int D) {
    WEFT_CHECK(D <= WEFT_CUDA_MAX_HEAD_DIM,
               "model: head_dim %d is over the cuda attention kernel's limit of %d", D,
               WEFT_CUDA_MAX_HEAD_DIM);
}

static weft_cuda_attention_args attention_args(const weft_attention_layout *l, int H, int KV,
                                               int D) {
    check_head_dim(D);
    return (weft_cuda_attention_args){.n_docs = l->n_docs, .Tq = l->Tq, .Tkv = l->Tkv, .H = H,
                                      .KV = KV, .D = D, .cu_q = l->cu_q, .cu_kv = l->cu_kv,
                                      .q_pos = l->q_pos};
}

// The tensor-core kernels need head_dim in 16s and 16-byte aligned tensors (they move rows in
// 16-byte chunks); the fp32 ones take anything up to the limit.
static bool attention_on_tensor_cores(weft_backend *self, int D, const void *const *tensors,
                                      int n) {
    if (!weft_cuda_state(self)->attention_mma || D % 16 != 0) return false;
    for (int i = 0; i < n; i++)
        if ((uintptr_t)tensors[i] % 16 != 0) return false;
    return true;
}

// Whether the hopper kernels ran (ok: the driver took their TMA descriptors). Asked for by name, a
// refusal is an error, not a quiet fall-back that benchmarks the mma kernels under the hopper
// label; as the default, the job says so once and goes on with the mma kernels.
static bool hopper_launched(weft_backend *self, bool ok, bool backward,
                            const weft_cuda_attention_args *a) {
    cuda_state *st = weft_cuda_state(self);
    WEFT_CHECK(ok || !st->attention_hopper_named,
               "WEFT_CUDA_ATTENTION=hopper: the CUDA driver refused the TMA descriptors of the "
               "attention %s (heads %d, kv heads %d, head_dim %d); update the driver (CUDA 12 or "
               "newer) or use WEFT_CUDA_ATTENTION=mma",
               backward ? "backward" : "forward", a->H, a->KV, a->D);
    if (!ok) {
        fprintf(stderr, "weft: warning: the CUDA driver refused the Hopper attention kernels' TMA "
                        "descriptors; attention runs on the mma.sync kernels (update the driver "
                        "to CUDA 12 or newer for the faster ones)\n");
        st->attention_hopper = false;
        return false;
    }
    weft_cuda_launched(self,
                       backward ? "attention_backward (hopper)" : "attention_forward (hopper)");
    return true;
}

static void cuda_attention_forward(weft_backend *self, const void *q, const void *k, const void *v,
                                   const weft_attention_layout *layout, void *out, float *lse,
                                   int H, int KV, int D) {
    if (layout->n_docs == 0) return;
    weft_cuda_attention_args a = attention_args(layout, H, KV, D);
    const void *tensors[] = {q, k, v, out};
    bool mma = attention_on_tensor_cores(self, D, tensors, 4);
    cuda_state *st = weft_cuda_state(self);
    if (mma && st->attention_hopper && weft_cuda_attention_hopper_covers(&a) &&
        hopper_launched(self,
                        weft_cuda_attention_forward_hopper(STREAM(self), &a, q, k, v, out, lse,
                                                           st->attention_rows_at_64),
                        false, &a))
        return;
    if (mma)
        weft_cuda_attention_forward_mma(STREAM(self), &a, q, k, v, out, lse);
    else
        weft_cuda_attention_forward_simt(STREAM(self), &a, q, k, v, out, lse);
    weft_cuda_launched(self, mma ? "attention_forward (mma)" : "attention_forward (simt)");
}

static void cuda_attention_backward(weft_backend *self, const void *q, const void *k,
                                    const void *v, const weft_attention_layout *layout,
                                    const void *out, const float *lse, const void *dout, void *dq,
                                    void *dk, void *dv, int H, int KV, int D) {
    if (layout->n_docs == 0) return;
    weft_cuda_attention_args a = attention_args(layout, H, KV, D);
    const void *tensors[] = {q, k, v, dout, dq, dk, dv};
    bool mma = attention_on_tensor_cores(self, D, tensors, 7);
    // Scratch: delta (H, Tq), then the kernels' own: per-head dK/dV partials, dQ sums.
    cuda_state *st = weft_cuda_state(self);
    bool hopper = mma && st->attention_hopper && weft_cuda_attention_hopper_covers(&a);
    size_t delta_floats = ((size_t)H * layout->Tq + 63) / 64 * 64; // partials 256-byte aligned
    bool ordered = st->attention_ordered_dq;
    size_t own_bytes = hopper ? weft_cuda_attention_hopper_scratch_bytes(&a, ordered)
                       : mma  ? weft_cuda_attention_partials_bytes(&a)
                              : 0;
    float *delta = weft_cuda_scratch(self, sizeof(float) * delta_floats + own_bytes);
    weft_cuda_attention_delta(STREAM(self), out, dout, delta, layout->Tq, H, D);
    if (hopper && hopper_launched(self,
                                  weft_cuda_attention_backward_hopper(
                                      STREAM(self), &a, q, k, v, lse, dout, delta, dq, dk, dv,
                                      delta + delta_floats, st->attention_ordered_dq,
                                      st->attention_rows_at_64),
                                  true, &a))
        return;
    if (mma)
        weft_cuda_attention_backward_mma(STREAM(self), &a, q, k, v, lse, dout, delta, dq, dk, dv,
                                         delta + delta_floats);
    else
        weft_cuda_attention_backward_simt(STREAM(self), &a, q, k, v, lse, dout, delta, dq, dk,
                                          dv);
    weft_cuda_launched(self, mma ? "attention_backward (mma)" : "attention_backward (simt)");
}

static void cuda_split_columns(weft_backend *self, void *fused, const weft_column_parts *parts,
                               int rows, bool join, const weft_rope_rows *rotate) {
    weft_rope_rows none = {0};
    const weft_rope_rows *r = rotate ? rotate : &none;
    weft_cuda_split_columns(STREAM(self), fused, parts->part, parts->width, parts->n, rows, join,
                            r->positions, r->inv_freq, r->scale, r->heads, r->head_dim);
    weft_cuda_launched(self, join ? "join_columns" : "split_columns");
}

static void cuda_swiglu_forward(weft_backend *self, const void *gate_up, void *out, int rows,
                                int width) {
    weft_cuda_swiglu_forward(STREAM(self), gate_up, out, rows, width);
    weft_cuda_launched(self, "swiglu_forward");
}

static void cuda_swiglu_backward(weft_backend *self, const void *gate_up, const void *dout,
                                 void *d_gate_up, int rows, int width) {
    weft_cuda_swiglu_backward(STREAM(self), gate_up, dout, d_gate_up, rows, width);
    weft_cuda_launched(self, "swiglu_backward");
}

static void cuda_kv_store(weft_backend *self, const weft_kv_pool *pool, int layer,
                          const int32_t *slot, const void *k, const void *v, int T) {
    weft_cuda_kv_store(STREAM(self), pool->data, pool->layers, pool->block_size, pool->width,
                       layer, slot, k, v, T);
    weft_cuda_launched(self, "kv_store");
}

static void cuda_split_store(weft_backend *self, void *fused, const weft_column_parts *parts,
                             int T, const weft_rope_rows *r, const weft_kv_pool *pool, int layer,
                             const int32_t *slot) {
    WEFT_CHECK(parts->n == 3 && parts->width[1] == pool->width && parts->width[2] == pool->width,
               "internal: split_store takes q|k|v rows whose k and v fit the pool");
    weft_cuda_split_store(STREAM(self), fused, parts->part[0], parts->width[0], pool->width, T,
                          r->positions, r->inv_freq, r->scale, r->heads, r->head_dim, pool->data,
                          pool->layers, pool->block_size, layer, slot);
    weft_cuda_launched(self, "split_store");
}

static void cuda_paged_attention(weft_backend *self, const void *q, const weft_kv_pool *pool,
                                 int layer, const weft_paged_layout *l, void *out, float *lse,
                                 int H, int KV, int D) {
    check_head_dim(D);
    weft_cuda_paged_args a = {.pool = pool->data, .layers = pool->layers,
                              .block_size = pool->block_size, .width = pool->width,
                              .n_seqs = l->n_seqs, .Tq = l->Tq, .max_blocks = l->max_blocks,
                              .H = H, .KV = KV, .D = D, .cu_q = l->cu_q, .q_pos = l->q_pos,
                              .block_tables = l->block_tables,
                              .split_keys = weft_cuda_state(self)->batch_invariant
                                                ? WEFT_CUDA_INVARIANT_SPLIT_KEYS
                                                : 0,
                              .tensor_cores = weft_cuda_state(self)->attention_mma};
    float *partials = weft_cuda_scratch(self, weft_cuda_paged_partials_bytes(&a));
    weft_cuda_paged_attention(STREAM(self), &a, layer, q, out, lse, partials,
                              weft_cuda_state(self)->arrived);
    weft_cuda_launched(self, "paged_attention");
}

static void cuda_add_inplace(weft_backend *self, void *y, const void *x, size_t N) {
    weft_cuda_add_bf16(STREAM(self), y, x, N);
    weft_cuda_launched(self, "add_inplace");
}

static void cuda_cross_entropy(weft_backend *self, void *logits, const int32_t *targets,
                               float scale, float *row_loss, float *correct, int T, int V) {
    weft_cuda_cross_entropy(STREAM(self), logits, targets, scale, row_loss, correct, T, V);
    weft_cuda_launched(self, "cross_entropy");
}

static void cuda_log_normalizers(weft_backend *self, const void *logits, float *lse, int T,
                                 int V) {
    weft_cuda_log_normalizers(STREAM(self), logits, lse, T, V);
    weft_cuda_launched(self, "log_normalizers");
}

static void cuda_sample_tokens(weft_backend *self, const void *logits, const int32_t *rows,
                               const double *u, int n, int V, float temperature,
                               const weft_draw_filters *f, int32_t *tokens, float *logprob,
                               float *processed) {
    weft_draw_filters none = {.top_p = 1.0};
    if (!f) f = &none;
    weft_cuda_sample_tokens(STREAM(self), logits, rows, u, n, V, temperature, f->top_k, f->top_p,
                            f->min_p, tokens, logprob, processed);
    weft_cuda_launched(self, "sample_tokens");
}

static void cuda_verify_drafts(weft_backend *self, const void *logits, const void *draft_logits,
                               const int32_t *draft_tokens, const int32_t *index, const double *u,
                               int n, int k, int V, float temperature, const weft_draw_filters *f,
                               int32_t *tokens, float *logprob, float *processed,
                               int32_t *count) {
    weft_draw_filters none = {.top_p = 1.0};
    if (!f) f = &none;
    weft_cuda_verify_drafts(STREAM(self), logits, draft_logits, draft_tokens, index, u, n, k, V,
                            temperature, f->top_k, f->top_p, f->min_p, tokens, logprob, processed,
                            count);
    weft_cuda_launched(self, "verify_drafts");
}

static void cuda_take_tokens(weft_backend *self, int32_t *tokens, const int32_t *drawn,
                             const int32_t *from, int n) {
    weft_cuda_take_tokens(STREAM(self), tokens, drawn, from, n);
    weft_cuda_launched(self, "take_tokens");
}

static void cuda_logprobs(weft_backend *self, const void *logits, const int32_t *targets,
                          float *logprob, float *entropy, float *correct, int T, int V) {
    weft_cuda_logprobs(STREAM(self), logits, targets, logprob, entropy, correct, T, V);
    weft_cuda_launched(self, "logprobs");
}

static void cuda_logits_backward(weft_backend *self, void *logits, const int32_t *targets,
                                 const float *d_logprob, const float *d_entropy, int T, int V) {
    weft_cuda_logits_backward(STREAM(self), logits, targets, d_logprob, d_entropy, T, V);
    weft_cuda_launched(self, "logits_backward");
}

static void cuda_accumulate_f32(weft_backend *self, const float *x, size_t N, bool squares,
                                double scale, double *acc) {
    weft_cuda_sum_f32(STREAM(self), x, N, squares, scale, true, acc,
                      weft_cuda_state(self)->sum_partials);
    weft_cuda_launched(self, "accumulate_f32");
}

static double reduce_f32(weft_backend *self, const float *x, size_t N, bool squares) {
    cuda_state *st = weft_cuda_state(self);
    weft_cuda_sum_f32(STREAM(self), x, N, squares, 1.0, false, st->sum_result, st->sum_partials);
    weft_cuda_launched(self, "sum_f32");
    double result;
    cuda_to_host(self, &result, st->sum_result, sizeof result);
    return result;
}

static double cuda_sum_f32(weft_backend *self, const float *x, size_t N) {
    return reduce_f32(self, x, N, false);
}

static double cuda_sumsq_f32(weft_backend *self, const float *x, size_t N) {
    return reduce_f32(self, x, N, true);
}

static void cuda_scale_f32(weft_backend *self, float *x, float s, size_t N) {
    weft_cuda_scale_f32(STREAM(self), x, s, N);
    weft_cuda_launched(self, "scale_f32");
}

static void cuda_adamw(weft_backend *self, void *param, float *master, const float *grad, float *m,
                       float *v, size_t N, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int step) {
    weft_cuda_adamw(STREAM(self), param, master, grad, m, v, N, lr, beta1, beta2, eps,
                    weight_decay, step);
    weft_cuda_launched(self, "adamw");
}

// ------------------------------------------------------------------------- conversions ----

static void cuda_from_f32(weft_backend *self, void *dst, weft_dtype dst_type, const float *src,
                          size_t N) {
    if (dst_type == WEFT_F32) {
        cuda_to_device(self, dst, src, N * sizeof(float));
        return;
    }
    uint16_t *h = weft_alloc(N * sizeof(uint16_t) + 1);
    for (size_t i = 0; i < N; i++) h[i] = weft_bf16_from_f32(src[i]);
    cuda_to_device(self, dst, h, N * sizeof(uint16_t));
    weft_free(h);
}

static void cuda_to_f32(weft_backend *self, float *dst, const void *src, weft_dtype src_type,
                        size_t N) {
    if (src_type == WEFT_F32) {
        cuda_to_host(self, dst, src, N * sizeof(float));
        return;
    }
    uint16_t *h = weft_alloc(N * sizeof(uint16_t) + 1);
    cuda_to_host(self, h, src, N * sizeof(uint16_t));
    for (size_t i = 0; i < N; i++) dst[i] = weft_f32_from_bf16(h[i]);
    weft_free(h);
}

// ------------------------------------------------------------------------------ graphs ----

// Thread-local capture: another thread's CUDA calls (an MPI progress thread, NCCL) are not
// caught up in it. The profile's per-op events would be recorded too, so it captures nothing.
static bool cuda_capture_begin(weft_backend *self) {
    cuda_state *st = weft_cuda_state(self);
    if (st->profile) return false;
    not_capturing(self, "a capture");
    CUDA_CHECK(cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal));
    st->capturing = true;
    return true;
}

static void *cuda_capture_end(weft_backend *self) {
    cuda_state *st = weft_cuda_state(self);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    WEFT_CHECK(st->capturing, "internal: a CUDA graph capture ends that never began");
    st->capturing = false;
    CUDA_CHECK(cudaStreamEndCapture(st->stream, &graph));
    CUDA_CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
}

static void cuda_graph_launch(weft_backend *self, void *graph) {
    not_capturing(self, "a graph launch");
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, weft_cuda_state(self)->stream));
    weft_cuda_launched(self, "graph");
}

static void cuda_graph_free(weft_backend *self, void *graph) {
    if (graph) CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

// ------------------------------------------------------------------------------- table ----

static void cuda_destroy(weft_backend *self) {
    cuda_state *st = weft_cuda_state(self);
    weft_cuda_watch_event(&st->watch, NULL, "the backend's end");
    weft_cuda_profile_finish(st->profile, self->host_waits);
    weft_cuda_staging_free(st->staging);
    cudaFree(st->scratch);
    cudaFree(st->arrived);
    cudaFree(st->sum_result);
    cudaFree(st->sum_partials);
    weft_cuda_gemms_free(st->gemms);
    weft_cuda_watch_free(&st->watch);
    cudaStreamDestroy(st->stream);
    weft_free(st->live), weft_free(st->live_bytes);
}

int weft_cuda_device_count(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

int weft_cuda_compute_capability(int device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        return 0;
    return 10 * major + minor;
}

// A switch of the environment that is on unless set to 0 (`off`: what 0 does).
static bool env_switch(const char *name, const char *off) {
    return weft_cuda_env_switch(name, true, off);
}

// The device's stream, libraries, scratch and the kernels' switches (WEFT_CUDA_* settings).
static cuda_state *create_state(int local_rank) {
    int n = weft_cuda_device_count();
    WEFT_CHECK(n > 0, "device=cuda: no CUDA GPU is visible to this process (check the driver "
                      "with nvidia-smi and CUDA_VISIBLE_DEVICES), or run with device=cpu");
    cuda_state *st = weft_alloc(sizeof *st);
    st->device = local_rank % n; // one GPU per rank on a node, in local rank order
    CUDA_CHECK(cudaSetDevice(st->device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
    st->gemms = weft_cuda_gemms_create(weft_cuda_gemm_split_k(st->device));
    CUDA_CHECK(cudaMalloc((void **)&st->sum_result, sizeof(double)));
    CUDA_CHECK(cudaMalloc((void **)&st->sum_partials, sizeof(double) * WEFT_CUDA_SUM_PARTIALS));
    weft_cuda_attention_choice(st->device, &st->attention_mma, &st->attention_hopper,
                               &st->attention_hopper_named);
    st->profile = weft_cuda_profile_create(st->stream, &st->watch);
    st->staging = weft_cuda_staging_create(&st->watch);
    // WEFT_CUDA_FEW_ROWS=0 sends the few-row and skinny products to cuBLASLt too, to time one
    // against the other.
    st->few_rows = env_switch("WEFT_CUDA_FEW_ROWS", "cuBLASLt for every matmul");
    st->skinny = st->few_rows && weft_cuda_compute_capability(st->device) >= 80;
    st->skinny_rows = weft_cuda_skinny_rows();
    st->fold_norm = env_switch("WEFT_CUDA_FOLD_NORM", "each RMSNorm its own launch");
    size_t counter_bytes = sizeof(int) * WEFT_CUDA_ARRIVAL_COUNTERS;
    CUDA_CHECK(cudaMalloc((void **)&st->arrived, counter_bytes));
    CUDA_CHECK(cudaMemsetAsync(st->arrived, 0, counter_bytes, st->stream));
    // Programmatic dependent launch (kernels.h's early_launch) where the GPU has it, sm_90 and
    // newer; WEFT_CUDA_EARLY_LAUNCH=0 starts each kernel after the one before it ends, to time one
    // against the other.
    st->queue = (weft_cuda_queue){
        .stream = st->stream,
        .early_launch = env_switch("WEFT_CUDA_EARLY_LAUNCH", "each kernel after the last ends") &&
                        weft_cuda_compute_capability(st->device) >= 90,
        // WEFT_CUDA_PREFETCH_WEIGHTS=0: products read their weights only after the wait.
        .prefetch_weights = env_switch("WEFT_CUDA_PREFETCH_WEIGHTS", "no weights asked for "
                                       "before a product waits for the kernel before it"),
        // WEFT_CUDA_SKINNY_SHARED_X=0: skinny.cu's column groups read x from L2 up to 64 rows.
        .skinny_shared_x = env_switch("WEFT_CUDA_SKINNY_SHARED_X", "x read from L2 by each "
                                      "column group of a skinny product up to 64 rows")};
    st->attention_ordered_dq = weft_cuda_attention_ordered_dq();
    st->attention_rows_at_64 = weft_cuda_attention_forward_rows();
    return st;
}

weft_backend *weft_backend_cuda_create(int local_rank) {
    cuda_state *st = create_state(local_rank);
    weft_backend *b = weft_alloc(sizeof *b);
    *b = (weft_backend){
        .name = "cuda",
        .act_dtype = WEFT_BF16,
        .param_dtype = WEFT_BF16,
        .device_memory = true,
        .stream = st->stream,
        .alloc = cuda_alloc,
        .free = cuda_free,
        .to_device = cuda_to_device,
        .to_host = cuda_to_host,
        .host_alloc = cuda_host_alloc,
        .host_free = cuda_host_free,
        .download_begin = cuda_download_begin,
        .download_wait = cuda_download_wait,
        .copy = cuda_copy,
        .zero = cuda_zero,
        .synchronize = cuda_synchronize,
        .memory_available = cuda_memory_available,
        .matmul = weft_cuda_op_matmul,
        .embedding_forward = cuda_embedding_forward,
        .embedding_backward = cuda_embedding_backward,
        .rmsnorm_forward = cuda_rmsnorm_forward,
        .rmsnorm_backward = cuda_rmsnorm_backward,
        .bias_backward = cuda_bias_backward,
        .rope_forward = cuda_rope_forward,
        .rope_backward = cuda_rope_backward,
        .attention_forward = cuda_attention_forward,
        .attention_backward = cuda_attention_backward,
        .kv_store = cuda_kv_store,
        .split_store = cuda_split_store,
        .paged_attention = cuda_paged_attention,
        .split_columns = cuda_split_columns,
        .swiglu_forward = cuda_swiglu_forward,
        .swiglu_backward = cuda_swiglu_backward,
        .swiglu_product = weft_cuda_op_swiglu_product,
        .norm_product = weft_cuda_op_norm_product,
        .norm_product_store = weft_cuda_op_norm_product_store,
        .batch_invariant = weft_cuda_op_batch_invariant,
        .add_inplace = cuda_add_inplace,
        .cross_entropy = cuda_cross_entropy,
        .logprobs = cuda_logprobs,
        .log_normalizers = cuda_log_normalizers,
        .sample_tokens = cuda_sample_tokens,
        .verify_drafts = cuda_verify_drafts,
        .take_tokens = cuda_take_tokens,
        .logits_backward = cuda_logits_backward,
        .sum_f32 = cuda_sum_f32,
        .sumsq_f32 = cuda_sumsq_f32,
        .accumulate_f32 = cuda_accumulate_f32,
        .scale_f32 = cuda_scale_f32,
        .adamw = cuda_adamw,
        .from_f32 = cuda_from_f32,
        .to_f32 = cuda_to_f32,
        .capture_begin = cuda_capture_begin,
        .capture_end = cuda_capture_end,
        .graph_launch = cuda_graph_launch,
        .graph_free = cuda_graph_free,
        .destroy = cuda_destroy,
        .impl = st,
        .wait_timeout = WEFT_DEVICE_TIMEOUT, // until a job sets its device_timeout
    };
    weft_cuda_watch_init(&st->watch, b, local_rank, st->stream);
    return b;
}
