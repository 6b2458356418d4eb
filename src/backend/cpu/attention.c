// The CPU backend's attention: causal attention over packed documents (or their context-parallel
// chunks) and over a paged KV cache, through one per-document routine, so a row decoded against
// the cache gets the bits it gets in a training forward.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/internal.h"

// -------------------------------------------------------------------------------- attention ----
//
// Per (document, head), queries in tiles of ATTN_TILE rows: S = Q K^T through BLAS against only
// the keys up to the tile's last visible one, the causal mask by each query's position, softmax,
// O = P V. The scratch tile is (ATTN_TILE, L) for a document of L keys, so memory stays linear.

enum { ATTN_TILE = 64 };

typedef struct attn_shape {
    int H, KV, D;
    float scale;
} attn_shape;

static int max_doc_len(const int32_t *cu, int n_docs) {
    int m = 0;
    for (int d = 0; d < n_docs; d++)
        if (cu[d + 1] - cu[d] > m) m = cu[d + 1] - cu[d];
    return m;
}

// Keys a tile of queries needs: up to the furthest position among them.
static int tile_keys(const int32_t *pos, int rows) {
    int m = 0;
    for (int i = 0; i < rows; i++) m = pos[i] + 1 > m ? pos[i] + 1 : m;
    return m;
}

// S (rows, keys) = scale * Q_tile K^T with the causal mask of the queries' positions applied, then
// P = exp(S - lse) when lse_in is given (backward), or a row softmax whose lse is stored (forward).
static void attn_probs(const float *q_tile, const float *k, const int32_t *pos, int rows, int keys,
                       int h, int kvh, const attn_shape *s, float *P, float *lse_out,
                       const float *lse_in) {
    int ldq = s->H * s->D, ldk = s->KV * s->D;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, s->D, s->scale,
                q_tile + (size_t)h * s->D, ldq, k + (size_t)kvh * s->D, ldk, 0.0f, P, keys);
    for (int i = 0; i < rows; i++) {
        float *row = P + (size_t)i * keys;
        int visible = pos[i] + 1; // keys 0..pos of this document
        if (lse_in) {
            float l = lse_in[i];
            for (int j = 0; j < visible; j++) row[j] = expf(row[j] - l);
        } else {
            float mx = -INFINITY;
            for (int j = 0; j < visible; j++) mx = row[j] > mx ? row[j] : mx;
            double sum = 0;
            for (int j = 0; j < visible; j++) sum += (row[j] = expf(row[j] - mx));
            float inv = (float)(1.0 / sum);
            for (int j = 0; j < visible; j++) row[j] *= inv;
            lse_out[i] = mx + (float)log(sum);
        }
        for (int j = visible; j < keys; j++) row[j] = 0.0f;
    }
}

// One head's attention for n query rows of one document, in tiles of ATTN_TILE rows: q rows are
// H*D apart from q0 on, their positions pos, keys and values of the document (kv heads
// contiguous, KV*D apart) from kd / vd, outputs from out0 (H*D apart) and lse0 (one per row).
// The decode path (paged attention) runs exactly this on a gathered copy of the same keys.
static void attend_rows(float *P, const float *q0, const int32_t *pos, int n, const float *kd,
                        const float *vd, int h, const attn_shape *s, float *out0, float *lse0) {
    int group = s->H / s->KV, ldq = s->H * s->D;
    for (int r0 = 0; r0 < n; r0 += ATTN_TILE) {
        int rows = n - r0 < ATTN_TILE ? n - r0 : ATTN_TILE, keys = tile_keys(pos + r0, rows);
        attn_probs(q0 + (size_t)r0 * ldq, kd, pos + r0, rows, keys, h, h / group, s, P,
                   lse0 + r0, NULL);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, s->D, keys, 1.0f, P, keys,
                    vd + (size_t)(h / group) * s->D, s->KV * s->D, 0.0f,
                    out0 + (size_t)r0 * ldq + (size_t)h * s->D, ldq);
    }
}

void weft_cpu_attention_forward(weft_backend *self, const void *qv, const void *kv,
                                const void *vv, const weft_attention_layout *lay, void *outv,
                                float *lse, int H, int KV, int D) {
    attn_shape s = {H, KV, D, 1.0f / sqrtf((float)D)};
    const float *q = qv, *k = kv, *v = vv;
    float *out = outv;
    const int32_t *cq = lay->cu_q, *ck = lay->cu_kv;
    int maxL = max_doc_len(ck, lay->n_docs), Tq = lay->Tq;
#pragma omp parallel
    {
        float *P = weft_cpu_scratch(self, 0, (size_t)ATTN_TILE * (maxL > 0 ? maxL : 1));
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int d = 0; d < lay->n_docs; d++)
            for (int h = 0; h < H; h++)
                attend_rows(P, q + (size_t)cq[d] * H * D, lay->q_pos + cq[d], cq[d + 1] - cq[d],
                            k + (size_t)ck[d] * KV * D, v + (size_t)ck[d] * KV * D, h, &s,
                            out + (size_t)cq[d] * H * D, lse + (size_t)h * Tq + cq[d]);
    }
}

void weft_cpu_attention_backward(weft_backend *self, const void *qv, const void *kv,
                                 const void *vv, const weft_attention_layout *lay,
                                 const void *outv, const float *lse, const void *doutv,
                                 void *dqv, void *dkv, void *dvv, int H, int KV, int D) {
    attn_shape s = {H, KV, D, 1.0f / sqrtf((float)D)};
    const float *q = qv, *k = kv, *v = vv, *out = outv, *dout = doutv;
    float *dq = dqv, *dk = dkv, *dv = dvv;
    const int32_t *cq = lay->cu_q, *ck = lay->cu_kv;
    int maxL = max_doc_len(ck, lay->n_docs), group = H / KV, ldq = H * D, ldk = KV * D;
    size_t tile = (size_t)ATTN_TILE * (maxL > 0 ? maxL : 1);
    // One task per (document, kv head): the query heads that share a kv head accumulate dK and dV
    // in the same task, so no two threads write the same rows.
#pragma omp parallel
    {
        float *P = weft_cpu_scratch(self, 0, tile), *dP = weft_cpu_scratch(self, 1, tile);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int d = 0; d < lay->n_docs; d++)
            for (int g = 0; g < KV; g++) {
                const float *kd = k + (size_t)ck[d] * ldk + (size_t)g * D;
                const float *vd = v + (size_t)ck[d] * ldk + (size_t)g * D;
                float *dkd = dk + (size_t)ck[d] * ldk + (size_t)g * D;
                float *dvd = dv + (size_t)ck[d] * ldk + (size_t)g * D;
                for (int i = 0; i < ck[d + 1] - ck[d]; i++) {
                    memset(dkd + (size_t)i * ldk, 0, sizeof(float) * D);
                    memset(dvd + (size_t)i * ldk, 0, sizeof(float) * D);
                }
                for (int h = g * group; h < (g + 1) * group; h++)
                    for (int r0 = cq[d]; r0 < cq[d + 1]; r0 += ATTN_TILE) {
                        int rows = cq[d + 1] - r0 < ATTN_TILE ? cq[d + 1] - r0 : ATTN_TILE;
                        const int32_t *pos = lay->q_pos + r0;
                        int keys = tile_keys(pos, rows);
                        const float *qt = q + (size_t)r0 * ldq + (size_t)h * D;
                        const float *ot = out + (size_t)r0 * ldq + (size_t)h * D;
                        const float *dot = dout + (size_t)r0 * ldq + (size_t)h * D;
                        float *dqt = dq + (size_t)r0 * ldq + (size_t)h * D;
                        attn_probs(q + (size_t)r0 * ldq, k + (size_t)ck[d] * ldk, pos, rows, keys,
                                   h, g, &s, P, NULL, lse + (size_t)h * lay->Tq + r0);
                        // dV += P^T dO
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, D, rows, 1.0f,
                                    P, keys, dot, ldq, 1.0f, dvd, ldk);
                        // dP = dO V^T
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, D, 1.0f,
                                    dot, ldq, vd, ldk, 0.0f, dP, keys);
                        for (int i = 0; i < rows; i++) {
                            double di = 0; // D_i = dO_i . O_i = sum_j P_ij dP_ij
                            for (int c = 0; c < D; c++)
                                di += (double)dot[(size_t)i * ldq + c] * ot[(size_t)i * ldq + c];
                            float *pr = P + (size_t)i * keys, *dpr = dP + (size_t)i * keys;
                            for (int j = 0; j < keys; j++) pr[j] = pr[j] * (dpr[j] - (float)di);
                        }
                        // P now holds dS. dQ = scale dS K ; dK += scale dS^T Q
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, keys,
                                    s.scale, P, keys, kd, ldk, 0.0f, dqt, ldq);
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, D, rows,
                                    s.scale, P, keys, qt, ldq, 1.0f, dkd, ldk);
                    }
            }
    }
}

// --------------------------------------------------------------------------- paged cache ----

// Where position p of a sequence (block table `table`) sits in the pool for `layer`: keys at the
// returned float offset, values block_size * width floats after.
static size_t pooled_row(const weft_kv_pool *pool, int layer, int block, int offset) {
    size_t per_block = (size_t)pool->layers * 2 * pool->block_size * pool->width;
    return (size_t)block * per_block + ((size_t)layer * 2 * pool->block_size + offset) * pool->width;
}

void weft_cpu_kv_store(weft_backend *self, const weft_kv_pool *pool, int layer,
                       const int32_t *slot, const void *kv, const void *vv, int T) {
    const float *k = kv, *v = vv;
    float *data = pool->data;
    size_t w = (size_t)pool->width, half = (size_t)pool->block_size * w;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        size_t at = pooled_row(pool, layer, slot[t] / pool->block_size, slot[t] % pool->block_size);
        memcpy(data + at, k + (size_t)t * w, sizeof(float) * w);
        memcpy(data + at + half, v + (size_t)t * w, sizeof(float) * w);
    }
}

// Copies positions [0, n) of a sequence's keys and values for `layer` out of the pool into k, v
// (n, width) each.
static void gather_sequence(const weft_kv_pool *pool, int layer, const int32_t *table, int n,
                            float *k, float *v) {
    const float *data = pool->data;
    size_t w = (size_t)pool->width, half = (size_t)pool->block_size * w;
    for (int p = 0; p < n; p++) {
        size_t at = pooled_row(pool, layer, table[p / pool->block_size], p % pool->block_size);
        memcpy(k + (size_t)p * w, data + at, sizeof(float) * w);
        memcpy(v + (size_t)p * w, data + at + half, sizeof(float) * w);
    }
}

void weft_cpu_paged_attention(weft_backend *self, const void *qv, const weft_kv_pool *pool,
                              int layer, const weft_paged_layout *lay, void *outv, float *lse,
                              int H, int KV, int D) {
    attn_shape s = {H, KV, D, 1.0f / sqrtf((float)D)};
    const float *q = qv;
    float *out = outv;
    const int32_t *cq = lay->cu_q;
    int keys_max = 0;
    for (int r = 0; r < lay->Tq; r++) keys_max = lay->q_pos[r] + 1 > keys_max ? lay->q_pos[r] + 1 : keys_max;
    size_t kv_floats = (size_t)(keys_max > 0 ? keys_max : 1) * pool->width;
#pragma omp parallel
    {
        float *P = weft_cpu_scratch(self, 0, (size_t)ATTN_TILE * (keys_max > 0 ? keys_max : 1));
        float *k = weft_cpu_scratch(self, 2, kv_floats), *v = weft_cpu_scratch(self, 3, kv_floats);
#pragma omp for schedule(dynamic, 1)
        for (int sq = 0; sq < lay->n_seqs; sq++) {
            int n = cq[sq + 1] - cq[sq];
            if (n == 0) continue;
            gather_sequence(pool, layer, lay->block_tables + (size_t)sq * lay->max_blocks,
                            tile_keys(lay->q_pos + cq[sq], n), k, v);
            for (int h = 0; h < H; h++)
                attend_rows(P, q + (size_t)cq[sq] * H * D, lay->q_pos + cq[sq], n, k, v, h, &s,
                            out + (size_t)cq[sq] * H * D, lse + (size_t)h * lay->Tq + cq[sq]);
        }
    }
}
