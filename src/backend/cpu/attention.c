// The CPU backend's attention: causal attention over packed documents (or their context-parallel
// chunks) and over a paged KV cache, through one per-document routine, so a row decoded against
// the cache gets the bits it gets in a training forward.
#include <cblas.h>
#ifdef __AVX__
#include <immintrin.h>
#endif
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/internal.h"

// -------------------------------------------------------------------------------- attention ----
//
// Per (document, kv head), the keys packed transposed once; then per query head of the group,
// queries in tiles of ATTN_TILE rows: S = scale Q K^T against only the keys up to the tile's last
// visible one, the causal mask by each query's position, softmax, O = P V. Scratch is
// (ATTN_TILE, L) and (D, L) for a document of L keys, so memory stays linear.
//
// S and P V are weft's own kernels rather than BLAS calls: each element is one FMA chain in a
// fixed order (over the head dimension for S, over the keys for P V) whatever the number of rows
// in the call. OpenBLAS picks other kernels, with other summation orders, for small products
// (rows * keys <= 1200 with D >= 32, and more), so a decoded row (one query) would otherwise get
// other bits than the same row in a training tile of 64.

// LANES is the vector unit's width: GCC spills a vector type wider than the registers to the
// stack on every operation, which made these loops 4x slower on AVX2 CPUs. The bits do not depend
// on it (every element is the same FMA chain), only the speed.
#ifdef __AVX512F__
enum { LANES = 16, VALUE_ROWS = 4 };
#else
enum { LANES = 8, VALUE_ROWS = 2 }; // 16 vector registers: 2 rows x 4 chunks of accumulators
#endif
enum { ATTN_TILE = 64, KEY_STEP = 2 * LANES, ROW_BLOCK = 4 };

typedef float vlanes __attribute__((vector_size(LANES * sizeof(float))));
static inline vlanes load_lanes(const float *p) {
    vlanes v;
    memcpy(&v, p, sizeof v);
    return v;
}

// acc + x * y with one rounding, said explicitly: GCC contracts `acc += x * y` into an FMA in some
// inlined copies of a loop and not in others, which gave a row other bits when it shared a call.
static inline vlanes fma_lanes(float x, vlanes y, vlanes acc) {
#if defined(__AVX512F__)
    return (vlanes)_mm512_fmadd_ps(_mm512_set1_ps(x), (__m512)y, (__m512)acc);
#elif defined(__FMA__)
    return (vlanes)_mm256_fmadd_ps(_mm256_set1_ps(x), (__m256)y, (__m256)acc);
#else
    for (int l = 0; l < LANES; l++) acc[l] = fmaf(x, y[l], acc[l]);
    return acc;
#endif
}

typedef struct attn_shape {
    int H, KV, D;
    float scale;
} attn_shape;

// Rows of keys or values of one kv head: contiguous (a document) or in the blocks of a paged
// pool. Row j of block b starts at base + block(b) * block_stride + (j % block_size) * ld.
//
// Keys are read as columns: key j's element d at base + block(j / block_size) * block_stride +
// d * block_size + j % block_size (ld unused). The packed Kt of a document is such, with
// KEY_STEP keys per block, and so are the CPU pool's keys (each block's keys of a kv head are
// stored transposed, (D, block_size)): a decode step reads them as LANES-key vectors in place.
typedef struct kv_rows {
    const float *base;
    size_t ld, block_stride;
    const int32_t *table; // the blocks, or NULL: block b is b
    int block_size;
} kv_rows;

static kv_rows contiguous_rows(const float *base, size_t ld) {
    return (kv_rows){.base = base, .ld = ld, .block_size = INT_MAX};
}

static const float *block_start(const kv_rows *r, int b) {
    return r->base + (size_t)(r->table ? r->table[b] : b) * r->block_stride;
}

// Keys j .. j + LANES of columns c (j a multiple of LANES, block_size too): element d at
// the result + d * block_size.
static const float *key_lanes(const kv_rows *c, int j) {
    return block_start(c, j / c->block_size) + j % c->block_size;
}

static int max_doc_len(const int32_t *cu, int n_docs) {
    int m = 0;
    for (int d = 0; d < n_docs; d++)
        if (cu[d + 1] - cu[d] > m) m = cu[d + 1] - cu[d];
    return m;
}

static int round_up(int n, int to) { return (n + to - 1) / to * to; }

// Keys a tile of queries needs: up to the furthest position among them.
static int tile_keys(const int32_t *pos, int rows) {
    int m = 0;
    for (int i = 0; i < rows; i++) m = pos[i] + 1 > m ? pos[i] + 1 : m;
    return m;
}

// Kt as columns: KEY_STEP keys per block.
static kv_rows packed_columns(const float *Kt, int D) {
    return (kv_rows){.base = Kt, .block_stride = (size_t)D * KEY_STEP, .block_size = KEY_STEP};
}

// Key j (D floats at row, `stride` apart) into its panel column.
static void pack_one_key(const float *row, size_t stride, int j, int D, float *Kt) {
    float *col = Kt + (size_t)(j / KEY_STEP) * D * KEY_STEP + j % KEY_STEP;
    for (int d = 0; d < D; d++) col[(size_t)d * KEY_STEP] = row ? row[d * stride] : 0.0f;
}

// Kt = the first n keys of columns c repacked KEY_STEP to a block: for a pool whose block size
// is not a multiple of LANES.
static void pack_key_columns(const kv_rows *c, int n, int D, float *Kt) {
    for (int j = 0; j < round_up(n, KEY_STEP); j++)
        pack_one_key(j < n ? block_start(c, j / c->block_size) + j % c->block_size : NULL,
                     (size_t)c->block_size, j, D, Kt);
}

// Kt = the first n keys transposed in panels of KEY_STEP keys: panel c holds (D, KEY_STEP), key
// c * KEY_STEP + l's element d at d * KEY_STEP + l, zero past key n. A panel (D * 128 bytes) stays
// in L1 while it is written. Copies only, so how they are made (8 x 8 tiles where the vector
// unit has them) does not touch the bits.
static void pack_keys(const kv_rows *k, int n, int D, float *Kt) {
    for (int j0 = 0; j0 < n; j0 += k->block_size) {
        const float *row = block_start(k, j0 / k->block_size);
        int rows = n - j0 < k->block_size ? n - j0 : k->block_size, o = 0;
#ifdef __AVX__
        for (; D % 8 == 0 && o + 8 <= rows && (j0 + o) % 8 == 0; o += 8) {
            const float *r[8];
            for (int i = 0; i < 8; i++) r[i] = row + (size_t)(o + i) * k->ld;
            int j = j0 + o;
            float *col = Kt + (size_t)(j / KEY_STEP) * D * KEY_STEP + j % KEY_STEP;
            for (int d = 0; d < D; d += 8) {
                weft_cpu_transpose8(r, col + (size_t)d * KEY_STEP, KEY_STEP);
                for (int i = 0; i < 8; i++) r[i] += 8;
            }
        }
#endif
        for (; o < rows; o++) pack_one_key(row + (size_t)o * k->ld, 1, j0 + o, D, Kt);
    }
    for (int j = n; j < round_up(n, KEY_STEP); j++) pack_one_key(NULL, 1, j, D, Kt);
}

// S rows [0, R) x NK * LANES keys, lane vector v's element d at k[v] + d * kstride: scale *
// sum_d q_d K_d, an FMA chain over d in order. Each chain waits on its last FMA: R * NK chains
// keep the pipes busy from 8 on, so one or two rows (a decode step's heads) take 4 vectors.
static inline __attribute__((always_inline)) void score_block(const float *q, int ldq, int R,
                                                              int NK, const float *const *k,
                                                              size_t kstride, int D, float scale,
                                                              float *S, int lds, int n) {
    vlanes acc[ROW_BLOCK][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NK; v++) acc[r][v] = (vlanes){0};
    for (int d = 0; d < D; d++) {
        vlanes x[4];
        for (int v = 0; v < NK; v++) x[v] = load_lanes(k[v] + (size_t)d * kstride);
        for (int r = 0; r < R; r++) {
            float qd = q[(size_t)r * ldq + d];
            for (int v = 0; v < NK; v++) acc[r][v] = fma_lanes(qd, x[v], acc[r][v]);
        }
    }
    for (int r = 0; r < R; r++) {
        float out[4 * LANES];
        for (int v = 0; v < NK; v++) {
            vlanes a = acc[r][v] * scale;
            memcpy(out + v * LANES, &a, sizeof a);
        }
        memcpy(S + (size_t)r * lds, out, sizeof(float) * n);
    }
}

// S (rows, keys) = scale Q K^T, the keys read as columns c. Lanes past the last key are computed
// on whatever the block holds there and dropped; a vector wholly past it is not read.
static void scores(const float *q, int ldq, int rows, const kv_rows *c, int keys, int D,
                   float scale, float *S) {
    int NK = rows <= 2 ? 4 : 2; // lane vectors a step
    for (int j0 = 0; j0 < keys; j0 += NK * LANES) {
        int n = keys - j0 < NK * LANES ? keys - j0 : NK * LANES, i = 0;
        const float *k[4] = {NULL};
        for (int l = 0; l < NK; l++)
            k[l] = j0 + l * LANES < keys ? key_lanes(c, j0 + l * LANES) : k[0];
        size_t ks = (size_t)c->block_size;
        float *Sj = S + j0;
        if (rows == 2) {
            score_block(q, ldq, 2, 4, k, ks, D, scale, Sj, keys, n);
            continue;
        }
        if (rows == 1) {
            score_block(q, ldq, 1, 4, k, ks, D, scale, Sj, keys, n);
            continue;
        }
        for (; i + ROW_BLOCK <= rows; i += ROW_BLOCK)
            score_block(q + (size_t)i * ldq, ldq, ROW_BLOCK, 2, k, ks, D, scale,
                        Sj + (size_t)i * keys, keys, n);
        for (; i < rows; i++)
            score_block(q + (size_t)i * ldq, ldq, 1, 2, k, ks, D, scale, Sj + (size_t)i * keys,
                        keys, n);
    }
}

enum { VALUE_CHUNKS = 4 }; // LANES-wide column chunks a value block holds

// out rows [0, R), columns [c, c + CH * LANES) = sum_j P_j V_j, an FMA chain over the keys in
// order. Each value row's CH chunks are read together, whole cache lines at a time.
static inline __attribute__((always_inline)) void value_block(const float *P, int ldp, int R,
                                                              int CH, int keys, const kv_rows *v,
                                                              int c, int D, float *out, int ldo) {
    vlanes acc[VALUE_ROWS][VALUE_CHUNKS];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < CH; h++) acc[r][h] = (vlanes){0};
    for (int j0 = 0; j0 < keys; j0 += v->block_size) {
        const float *row = block_start(v, j0 / v->block_size) + c;
        int n = keys - j0 < v->block_size ? keys - j0 : v->block_size;
        for (int o = 0; o < n; o++, row += v->ld)
            for (int h = 0; h < CH; h++) {
                vlanes x = load_lanes(row + h * LANES);
                for (int r = 0; r < R; r++)
                    acc[r][h] = fma_lanes(P[(size_t)r * ldp + j0 + o], x, acc[r][h]);
            }
    }
    for (int r = 0; r < R; r++)
        memcpy(out + (size_t)r * ldo + c, acc[r], sizeof(vlanes) * CH);
}

// out (rows, D; ldo apart) = P (rows, keys) V. Columns past the last whole LANES run one chain
// each in the same order.
static void weighted_values(const float *P, int rows, int keys, const kv_rows *v, int D,
                            float *out, int ldo) {
    int whole = D / LANES * LANES;
    for (int c = 0; c < whole;) {
        int wide = whole - c >= VALUE_CHUNKS * LANES, i = 0;
        for (; i + VALUE_ROWS <= rows; i += VALUE_ROWS)
            if (wide)
                value_block(P + (size_t)i * keys, keys, VALUE_ROWS, VALUE_CHUNKS, keys, v, c, D,
                            out + (size_t)i * ldo, ldo);
            else
                value_block(P + (size_t)i * keys, keys, VALUE_ROWS, 1, keys, v, c, D,
                            out + (size_t)i * ldo, ldo);
        for (; i < rows; i++)
            if (wide)
                value_block(P + (size_t)i * keys, keys, 1, VALUE_CHUNKS, keys, v, c, D,
                            out + (size_t)i * ldo, ldo);
            else
                value_block(P + (size_t)i * keys, keys, 1, 1, keys, v, c, D,
                            out + (size_t)i * ldo, ldo);
        c += wide ? VALUE_CHUNKS * LANES : LANES;
    }
    for (int i = 0; i < rows; i++)
        for (int c = whole; c < D; c++) {
            float acc = 0.0f;
            for (int j0 = 0; j0 < keys; j0 += v->block_size) {
                const float *row = block_start(v, j0 / v->block_size) + c;
                int n = keys - j0 < v->block_size ? keys - j0 : v->block_size;
                for (int o = 0; o < n; o++) acc = fmaf(P[(size_t)i * keys + j0 + o], row[o * v->ld], acc);
            }
            out[(size_t)i * ldo + c] = acc;
        }
}

// P (rows, keys) = S with the causal mask applied: exp(S - lse) when lse_in is given (backward),
// or a row softmax whose lse is stored (forward).
static void softmax_rows(float *P, const int32_t *pos, int rows, int keys, float *lse_out,
                         const float *lse_in) {
    for (int i = 0; i < rows; i++) {
        float *row = P + (size_t)i * keys;
        int visible = pos[i] + 1; // keys 0..pos of this document
        if (lse_in) {
            weft_cpu_exp_sum(row, 1.0f, lse_in[i], row, visible);
        } else {
            float mx = weft_cpu_row_max(row, visible);
            double sum = weft_cpu_exp_sum(row, 1.0f, mx, row, visible);
            float inv = (float)(1.0 / sum);
            for (int j = 0; j < visible; j++) row[j] *= inv;
            lse_out[i] = mx + (float)log(sum);
        }
        for (int j = visible; j < keys; j++) row[j] = 0.0f;
    }
}

// The query heads of kv head g over n query rows of one document or sequence (q rows H*D apart
// from q0, positions pos; outputs likewise from out0; lse0 one per row, Tq apart per head),
// keys read as columns kc, values from v (the kv head's columns). The decode path runs exactly
// this on keys and values in the cache's blocks, so a row's bits do not depend on where its keys
// are or who shares its call.
//
// A sequence's few query rows (a decode step, a verification) go one row at a time with the
// group's heads as the tile's rows: the heads then share every key and value read, and each has
// twice the independent chains. The bits stay each element's chain.
enum { HEADS_AS_ROWS_BELOW = 8 }; // query rows

static void attend_heads_as_rows(float *P, const kv_rows *kc, const float *q0, const int32_t *pos,
                                 int n, const kv_rows *v, int g, const attn_shape *s, float *out0,
                                 float *lse0, int Tq) {
    int group = s->H / s->KV, ldq = s->H * s->D;
    int32_t at[ATTN_TILE];
    float lse[ATTN_TILE];
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < group; h++) at[h] = pos[i];
        size_t head0 = (size_t)i * ldq + (size_t)g * group * s->D;
        scores(q0 + head0, s->D, group, kc, pos[i] + 1, s->D, s->scale, P);
        softmax_rows(P, at, group, pos[i] + 1, lse, NULL);
        weighted_values(P, group, pos[i] + 1, v, s->D, out0 + head0, s->D);
        for (int h = 0; h < group; h++) lse0[(size_t)(g * group + h) * Tq + i] = lse[h];
    }
}

static void attend_group(float *P, const kv_rows *kc, const float *q0, const int32_t *pos, int n,
                         const kv_rows *v, int g, const attn_shape *s, float *out0, float *lse0,
                         int Tq) {
    int group = s->H / s->KV, ldq = s->H * s->D;
    if (n < HEADS_AS_ROWS_BELOW && group > 1 && group <= ATTN_TILE) {
        attend_heads_as_rows(P, kc, q0, pos, n, v, g, s, out0, lse0, Tq);
        return;
    }
    for (int h = g * group; h < (g + 1) * group; h++)
        for (int r0 = 0; r0 < n; r0 += ATTN_TILE) {
            int rows = n - r0 < ATTN_TILE ? n - r0 : ATTN_TILE, tk = tile_keys(pos + r0, rows);
            scores(q0 + (size_t)r0 * ldq + (size_t)h * s->D, ldq, rows, kc, tk, s->D, s->scale,
                   P);
            softmax_rows(P, pos + r0, rows, tk, lse0 + (size_t)h * Tq + r0, NULL);
            weighted_values(P, rows, tk, v, s->D, out0 + (size_t)r0 * ldq + (size_t)h * s->D,
                            ldq);
        }
}

void weft_cpu_attention_forward(weft_backend *self, const void *qv, const void *kv,
                                const void *vv, const weft_attention_layout *lay, void *outv,
                                float *lse, int H, int KV, int D) {
    attn_shape s = {H, KV, D, 1.0f / sqrtf((float)D)};
    const float *q = qv, *k = kv, *v = vv;
    float *out = outv;
    const int32_t *cq = lay->cu_q, *ck = lay->cu_kv;
    int L = round_up(max_doc_len(ck, lay->n_docs) + 1, KEY_STEP);
#pragma omp parallel
    {
        float *P = weft_cpu_scratch(self, 0, (size_t)ATTN_TILE * L);
        float *Kt = weft_cpu_scratch(self, 2, (size_t)D * L);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int d = 0; d < lay->n_docs; d++)
            for (int g = 0; g < KV; g++) {
                kv_rows kd = contiguous_rows(k + (size_t)ck[d] * KV * D + (size_t)g * D, (size_t)KV * D);
                kv_rows vd = contiguous_rows(v + (size_t)ck[d] * KV * D + (size_t)g * D, (size_t)KV * D);
                if (cq[d + 1] == cq[d]) continue;
                kv_rows kc = packed_columns(Kt, D);
                pack_keys(&kd, tile_keys(lay->q_pos + cq[d], cq[d + 1] - cq[d]), D, Kt);
                attend_group(P, &kc, q + (size_t)cq[d] * H * D, lay->q_pos + cq[d],
                             cq[d + 1] - cq[d], &vd, g, &s, out + (size_t)cq[d] * H * D,
                             lse + cq[d], lay->Tq);
            }
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
    int group = H / KV, ldq = H * D, ldk = KV * D;
    int L = round_up(max_doc_len(ck, lay->n_docs) + 1, KEY_STEP);
    // One task per (document, kv head): the query heads that share a kv head accumulate dK and dV
    // in the same task, so no two threads write the same rows.
#pragma omp parallel
    {
        float *P = weft_cpu_scratch(self, 0, (size_t)ATTN_TILE * L);
        float *dP = weft_cpu_scratch(self, 1, (size_t)ATTN_TILE * L);
        float *Kt = weft_cpu_scratch(self, 2, (size_t)D * L);
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
                if (cq[d + 1] == cq[d]) continue;
                int all_keys = tile_keys(lay->q_pos + cq[d], cq[d + 1] - cq[d]);
                pack_keys(&(kv_rows){.base = kd, .ld = ldk, .block_size = INT_MAX}, all_keys, D,
                          Kt);
                kv_rows kc = packed_columns(Kt, D);
                for (int h = g * group; h < (g + 1) * group; h++)
                    for (int r0 = cq[d]; r0 < cq[d + 1]; r0 += ATTN_TILE) {
                        int rows = cq[d + 1] - r0 < ATTN_TILE ? cq[d + 1] - r0 : ATTN_TILE;
                        const int32_t *pos = lay->q_pos + r0;
                        int keys = tile_keys(pos, rows);
                        const float *qt = q + (size_t)r0 * ldq + (size_t)h * D;
                        const float *ot = out + (size_t)r0 * ldq + (size_t)h * D;
                        const float *dot = dout + (size_t)r0 * ldq + (size_t)h * D;
                        float *dqt = dq + (size_t)r0 * ldq + (size_t)h * D;
                        scores(qt, ldq, rows, &kc, keys, D, s.scale, P);
                        softmax_rows(P, pos, rows, keys, NULL, lse + (size_t)h * lay->Tq + r0);
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

// The CPU pool's block: per layer, the keys of its block_size positions transposed, (width,
// block_size) (kv head g's columns at g * D * block_size: see kv_rows), then their values as
// rows, (block_size, width). The float offset of `layer`'s keys in `block`:
static size_t pooled_keys(const weft_kv_pool *pool, int layer, int block) {
    size_t per_layer = (size_t)2 * pool->block_size * pool->width;
    return ((size_t)block * pool->layers + layer) * per_layer;
}

static void store_rows(const weft_kv_pool *pool, int layer, const int32_t *slot, const float *k,
                       const float *v, int T) {
    float *data = pool->data;
    size_t w = (size_t)pool->width, bs = (size_t)pool->block_size;
#pragma omp for schedule(static) nowait
    for (int t = 0; t < T; t++) {
        if (slot[t] < 0) continue;
        size_t o = (size_t)slot[t] % bs;
        float *keys = data + pooled_keys(pool, layer, slot[t] / pool->block_size);
        for (size_t c = 0; c < w; c++) keys[c * bs + o] = k[(size_t)t * w + c];
        memcpy(keys + bs * w + o * w, v + (size_t)t * w, sizeof(float) * w);
    }
}

void weft_cpu_kv_store(weft_backend *self, const weft_kv_pool *pool, int layer,
                       const int32_t *slot, const void *k, const void *v, int T) {
    WEFT_CPU_PARALLEL((size_t)T * pool->width, store_rows(pool, layer, slot, k, v, T));
}

// The longest key span any query row of the layout attends over, rounded to whole key steps.
static int paged_key_span(const weft_paged_layout *lay) {
    return round_up(tile_keys(lay->q_pos, lay->Tq) + 1, KEY_STEP);
}

// Every sequence of the layout; L is paged_key_span(lay), the scratch's key length.
static void attend_sequences(weft_backend *self, const float *q, const weft_kv_pool *pool,
                             int layer, const weft_paged_layout *lay, float *out, float *lse,
                             attn_shape s, int L) {
    const float *data = pool->data;
    const int32_t *cq = lay->cu_q;
    int bs = pool->block_size, D = s.D;
    size_t w = (size_t)pool->width, keys_at = pooled_keys(pool, layer, 0);
    size_t block_stride = pooled_keys(pool, layer, 1) - keys_at;
    bool in_place = bs % LANES == 0; // else the columns are repacked KEY_STEP to a block
    float *P = weft_cpu_scratch(self, 0, (size_t)ATTN_TILE * L);
    float *Kt = in_place ? NULL : weft_cpu_scratch(self, 2, (size_t)D * L);
#pragma omp for schedule(dynamic, 1) nowait
    for (int sq = 0; sq < lay->n_seqs; sq++)
        for (int g = 0; g < s.KV; g++) {
            int n = cq[sq + 1] - cq[sq];
            if (n == 0) continue;
            const int32_t *table = lay->block_tables + (size_t)sq * lay->max_blocks;
            kv_rows kc = {.base = data + keys_at + (size_t)g * D * bs,
                          .block_stride = block_stride, .block_size = bs, .table = table};
            kv_rows v = {.base = data + keys_at + bs * w + (size_t)g * D, .ld = w,
                         .block_stride = block_stride, .block_size = bs, .table = table};
            if (!in_place) {
                pack_key_columns(&kc, tile_keys(lay->q_pos + cq[sq], n), D, Kt);
                kc = packed_columns(Kt, D);
            }
            attend_group(P, &kc, q + (size_t)cq[sq] * s.H * D, lay->q_pos + cq[sq], n, &v, g,
                         &s, out + (size_t)cq[sq] * s.H * D, lse + cq[sq], lay->Tq);
        }
}

void weft_cpu_paged_attention(weft_backend *self, const void *q, const weft_kv_pool *pool,
                              int layer, const weft_paged_layout *lay, void *out, float *lse,
                              int H, int KV, int D) {
    attn_shape s = {H, KV, D, 1.0f / sqrtf((float)D)};
    int L = paged_key_span(lay);
    WEFT_CPU_PARALLEL((size_t)lay->Tq * L * H * D,
                      attend_sequences(self, q, pool, layer, lay, out, lse, s, L));
}
