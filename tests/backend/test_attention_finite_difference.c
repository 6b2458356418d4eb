// Finite-difference check of the CPU backend's attention backward (dq, dk, dv) over packed
// documents, grouped-query heads, tiles and context-parallel query chunks, and its forward against
// double precision. The method and the tolerances: finite_difference.h.
#include "finite_difference.h"

// ---------------------------------------------------------------------------------------------
// attention: causal within packed documents, grouped-query heads.

typedef struct attn_ctx {
    int T, H, KV, D, n_docs;
    const int32_t *cu_d;
    weft_attention_layout layout; // queries and keys are the same rows
    float *q, *k, *v;
    void *q_d, *k_d, *v_d, *out_d;
    float *lse_d;
    const float *R;
} attn_ctx;

static void attn_forward(attn_ctx *c) {
    upload(c->q_d, c->q, (size_t)c->T * c->H * c->D);
    upload(c->k_d, c->k, (size_t)c->T * c->KV * c->D);
    upload(c->v_d, c->v, (size_t)c->T * c->KV * c->D);
    B->attention_forward(B, c->q_d, c->k_d, c->v_d, &c->layout, c->out_d, c->lse_d, c->H, c->KV,
                         c->D);
}

static double attn_J(void *p) {
    attn_ctx *c = p;
    attn_forward(c);
    return dot_dev(c->out_d, c->R, (size_t)c->T * c->H * c->D);
}

// Naive attention in double, softmax scale 1/sqrt(D): out (T, H, D), lse (H, T).
static void attn_reference(const attn_ctx *c, const int32_t *cu, double *out, double *lse) {
    int T = c->T, H = c->H, KV = c->KV, D = c->D;
    double *s = weft_alloc(sizeof(double) * T);
    memset(out, 0, sizeof(double) * T * H * D);
    for (int d = 0; d < c->n_docs; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++)
            for (int h = 0; h < H; h++) {
                int kh = h / (H / KV);
                const float *q = c->q + ((size_t)t * H + h) * D;
                double mx = -INFINITY, sum = 0;
                for (int j = cu[d]; j <= t; j++) {
                    s[j] = 0;
                    for (int i = 0; i < D; i++) s[j] += (double)q[i] * c->k[((size_t)j * KV + kh) * D + i];
                    s[j] /= sqrt((double)D);
                    mx = fmax(mx, s[j]);
                }
                for (int j = cu[d]; j <= t; j++) sum += exp(s[j] - mx);
                lse[(size_t)h * T + t] = mx + log(sum);
                for (int j = cu[d]; j <= t; j++)
                    for (int i = 0; i < D; i++)
                        out[((size_t)t * H + h) * D + i] +=
                            exp(s[j] - lse[(size_t)h * T + t]) * c->v[((size_t)j * KV + kh) * D + i];
            }
    weft_free(s);
}

// No leakage across documents or from the future: perturbing token p (its q, k and v) must leave
// every output row outside p's document, and every row before p in it, bit for bit the same, and
// must change row p. Returns the largest change in a row that must not change; *own_row_changed
// says whether every perturbed row changed.
static double attn_leak(attn_ctx *c, const int32_t *cu, const float *out, bool *own_row_changed) {
    int T = c->T, HD = c->H * c->D, KD = c->KV * c->D;
    float *q0 = host_copy(c->q, (size_t)T * HD), *k0 = host_copy(c->k, (size_t)T * KD),
          *v0 = host_copy(c->v, (size_t)T * KD), *pert = weft_alloc(sizeof(float) * T * HD);
    double leak = 0;
    *own_row_changed = true;
    for (int d = 0; d < c->n_docs; d++) {
        int p = (cu[d] + cu[d + 1]) / 2; // a middle token (the only one of a length-1 document)
        for (int i = 0; i < HD; i++) c->q[(size_t)p * HD + i] += 3.0f;
        for (int i = 0; i < KD; i++) c->k[(size_t)p * KD + i] -= 2.0f, c->v[(size_t)p * KD + i] += 5.0f;
        attn_forward(c);
        download(pert, c->out_d, (size_t)T * HD);
        memcpy(c->q, q0, sizeof(float) * T * HD);
        memcpy(c->k, k0, sizeof(float) * T * KD);
        memcpy(c->v, v0, sizeof(float) * T * KD);
        for (int t = 0; t < T; t++) {
            double row = 0;
            for (int i = 0; i < HD; i++)
                row = fmax(row, fabs((double)pert[(size_t)t * HD + i] - out[(size_t)t * HD + i]));
            if (!(t >= p && t < cu[d + 1])) leak = fmax(leak, row);
            if (t == p && !(row > 0)) *own_row_changed = false;
        }
    }
    weft_free(q0), weft_free(k0), weft_free(v0), weft_free(pert);
    return leak;
}

static void test_attention(const char *label, int H, int KV, int D, const int32_t *cu, int n_docs) {
    int T = cu[n_docs];
    size_t NQ = (size_t)T * H * D, NK = (size_t)T * KV * D, NL = (size_t)H * T;
    attn_ctx c = {.T = T, .H = H, .KV = KV, .D = D, .n_docs = n_docs, .cu_d = dev_i32(cu, n_docs + 1),
                  .q = host_normal(NQ, 0, 1), .k = host_normal(NK, 0, 1), .v = host_normal(NK, 0, 1),
                  .R = host_normal(NQ, 0, 1)};
    int32_t *pos = weft_alloc(sizeof(int32_t) * (T > 0 ? T : 1));
    for (int d = 0; d < n_docs; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++) pos[t] = t - cu[d];
    c.layout = (weft_attention_layout){.n_docs = n_docs, .Tq = T, .Tkv = T, .cu_q = c.cu_d,
                                       .cu_kv = c.cu_d, .q_pos = dev_i32(pos, T)};
    weft_free(pos);
    c.q_d = dev_f32(c.q, NQ);
    c.k_d = dev_f32(c.k, NK);
    c.v_d = dev_f32(c.v, NK);
    c.out_d = dev_f32(NULL, NQ);
    c.lse_d = dev_f32(NULL, NL);
    char what[160];
#define ATTN_REPORT(fmt, err, tol) (snprintf(what, sizeof what, "attention %s " fmt, label), report(what, err, tol))

    attn_forward(&c);
    float *out = weft_alloc(sizeof(float) * NQ), *lse = weft_alloc(sizeof(float) * NL);
    download(out, c.out_d, NQ);
    download(lse, c.lse_d, NL);
    double *want_out = weft_alloc(sizeof(double) * NQ), *want_lse = weft_alloc(sizeof(double) * NL);
    attn_reference(&c, cu, want_out, want_lse);
    ATTN_REPORT("forward out vs naive double", rel_err_d(out, want_out, NQ), 1e-5);
    ATTN_REPORT("forward lse vs naive double", rel_err_d(lse, want_lse, NL), 1e-5);

    bool own_row_changed;
    ATTN_REPORT("forward cross-document/future leakage (max abs change)", attn_leak(&c, cu, out, &own_row_changed), 0);
    ATTN_REPORT("forward perturbed token's own row changes (0 = yes)", own_row_changed ? 0 : 1, 0);

    // Backward with dout = R, onto zeros and then onto garbage: dq, dk, dv are overwritten.
    attn_forward(&c);
    void *dout_d = dev_f32(c.R, NQ), *dq_d = dev_f32(NULL, NQ), *dk_d = dev_f32(NULL, NK),
         *dv_d = dev_f32(NULL, NK);
    float *g = weft_alloc(sizeof(float) * 2 * (NQ + 2 * NK));
    float *gq = g, *gk = gq + NQ, *gv = gk + NK, *gq2 = gv + NK, *gk2 = gq2 + NQ, *gv2 = gk2 + NK;
    B->attention_backward(B, c.q_d, c.k_d, c.v_d, &c.layout, c.out_d, c.lse_d, dout_d, dq_d,
                          dk_d, dv_d, H, KV, D);
    download(gq, dq_d, NQ);
    download(gk, dk_d, NK);
    download(gv, dv_d, NK);
    float *garbage = host_fill(NQ, 777.0f);
    upload(dq_d, garbage, NQ);
    upload(dk_d, garbage, NK);
    upload(dv_d, garbage, NK);
    B->attention_backward(B, c.q_d, c.k_d, c.v_d, &c.layout, c.out_d, c.lse_d, dout_d, dq_d,
                          dk_d, dv_d, H, KV, D);
    download(gq2, dq_d, NQ);
    download(gk2, dk_d, NK);
    download(gv2, dv_d, NK);
    snprintf(what, sizeof what, "attention %s backward dq overwrites", label);
    check_prefilled(what, gq, garbage, gq2, NQ, false);
    snprintf(what, sizeof what, "attention %s backward dk overwrites", label);
    check_prefilled(what, gk, garbage, gk2, NK, false);
    snprintf(what, sizeof what, "attention %s backward dv overwrites", label);
    check_prefilled(what, gv, garbage, gv2, NK, false);

    ATTN_REPORT("backward dq (fd)", fd_rel_err(attn_J, &c, c.q, NQ, gq, H_NONLINEAR), TOL_FD_NONLINEAR);
    ATTN_REPORT("backward dk (fd)", fd_rel_err(attn_J, &c, c.k, NK, gk, H_NONLINEAR), TOL_FD_NONLINEAR);
    ATTN_REPORT("backward dv (fd)", fd_rel_err(attn_J, &c, c.v, NK, gv, H_LINEAR), TOL_FD_LINEAR);
#undef ATTN_REPORT
}

// Context parallelism's use of the op: rank r of c passes as queries only its chunks r and
// 2c-1-r of each (padded) document, with their global positions, against the whole document's
// keys. Its output rows must equal the whole-document call's rows, its dq those rows' dq, and the
// dk, dv of the c ranks must sum to the whole call's dk, dv. Documents are padded to a multiple
// of 2c, as the CP split does.
static void test_attention_query_chunks(int H, int KV, int D, const int32_t *cu, int n_docs,
                                        int c) {
    int T = cu[n_docs], parts = 2 * c, HD = H * D, KD = KV * D;
    float *q = host_normal((size_t)T * HD, 0, 1), *k = host_normal((size_t)T * KD, 0, 1),
          *v = host_normal((size_t)T * KD, 0, 1), *dout = host_normal((size_t)T * HD, 0, 1);
    int32_t *pos = weft_alloc(sizeof(int32_t) * T);
    for (int d = 0; d < n_docs; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++) pos[t] = t - cu[d];
    void *q_d = dev_f32(q, (size_t)T * HD), *k_d = dev_f32(k, (size_t)T * KD),
         *v_d = dev_f32(v, (size_t)T * KD), *dout_d = dev_f32(dout, (size_t)T * HD);
    int32_t *cu_d = dev_i32(cu, n_docs + 1);
    weft_attention_layout whole = {n_docs, T, T, cu_d, cu_d, dev_i32(pos, T)};
    void *out_d = dev_f32(NULL, (size_t)T * HD), *dq_d = dev_f32(NULL, (size_t)T * HD),
         *dk_d = dev_f32(NULL, (size_t)T * KD), *dv_d = dev_f32(NULL, (size_t)T * KD);
    float *lse_d = dev_f32(NULL, (size_t)H * T);
    B->attention_forward(B, q_d, k_d, v_d, &whole, out_d, lse_d, H, KV, D);
    B->attention_backward(B, q_d, k_d, v_d, &whole, out_d, lse_d, dout_d, dq_d, dk_d, dv_d, H, KV, D);
    float *want_out = weft_alloc(sizeof(float) * T * HD), *want_dq = weft_alloc(sizeof(float) * T * HD),
          *want_dk = weft_alloc(sizeof(float) * T * KD), *want_dv = weft_alloc(sizeof(float) * T * KD);
    download(want_out, out_d, (size_t)T * HD);
    download(want_dq, dq_d, (size_t)T * HD);
    download(want_dk, dk_d, (size_t)T * KD);
    download(want_dv, dv_d, (size_t)T * KD);

    int Tq = T / c;
    int32_t *rows = weft_alloc(sizeof(int32_t) * Tq), *cu_q = weft_alloc(sizeof(int32_t) * (n_docs + 1)),
            *qpos = weft_alloc(sizeof(int32_t) * Tq);
    float *qr = weft_alloc(sizeof(float) * Tq * HD), *dor = weft_alloc(sizeof(float) * Tq * HD),
          *got = weft_alloc(sizeof(float) * Tq * HD), *want = weft_alloc(sizeof(float) * Tq * HD),
          *sum_dk = weft_alloc(sizeof(float) * T * KD), *sum_dv = weft_alloc(sizeof(float) * T * KD),
          *part = weft_alloc(sizeof(float) * T * KD);
    double err_out = 0, err_dq = 0;
    for (int r = 0; r < c; r++) {
        int n = 0;
        cu_q[0] = 0;
        for (int d = 0; d < n_docs; d++) {
            int s = (cu[d + 1] - cu[d]) / parts;
            for (int j = 0; j < 2; j++)
                for (int i = 0; i < s; i++) rows[n++] = cu[d] + (j ? parts - 1 - r : r) * s + i;
            cu_q[d + 1] = n;
        }
        for (int i = 0; i < Tq; i++) {
            qpos[i] = pos[rows[i]];
            memcpy(qr + (size_t)i * HD, q + (size_t)rows[i] * HD, sizeof(float) * HD);
            memcpy(dor + (size_t)i * HD, dout + (size_t)rows[i] * HD, sizeof(float) * HD);
        }
        weft_attention_layout chunks = {n_docs, Tq, T, dev_i32(cu_q, n_docs + 1), cu_d,
                                        dev_i32(qpos, Tq)};
        void *qr_d = dev_f32(qr, (size_t)Tq * HD), *dor_d = dev_f32(dor, (size_t)Tq * HD);
        void *or_d = dev_f32(NULL, (size_t)Tq * HD), *dqr_d = dev_f32(NULL, (size_t)Tq * HD);
        float *lser_d = dev_f32(NULL, (size_t)H * Tq);
        B->attention_forward(B, qr_d, k_d, v_d, &chunks, or_d, lser_d, H, KV, D);
        B->attention_backward(B, qr_d, k_d, v_d, &chunks, or_d, lser_d, dor_d, dqr_d, dk_d, dv_d,
                              H, KV, D);
        for (int pass = 0; pass < 2; pass++) {
            download(got, pass ? dqr_d : or_d, (size_t)Tq * HD);
            const float *src = pass ? want_dq : want_out;
            for (int i = 0; i < Tq; i++)
                memcpy(want + (size_t)i * HD, src + (size_t)rows[i] * HD, sizeof(float) * HD);
            double e = rel_err(got, want, (size_t)Tq * HD);
            if (pass) err_dq = fmax(err_dq, e);
            else err_out = fmax(err_out, e);
        }
        download(part, dk_d, (size_t)T * KD);
        for (size_t i = 0; i < (size_t)T * KD; i++) sum_dk[i] += part[i];
        download(part, dv_d, (size_t)T * KD);
        for (size_t i = 0; i < (size_t)T * KD; i++) sum_dv[i] += part[i];
        B->free(B, qr_d), B->free(B, dor_d), B->free(B, or_d), B->free(B, dqr_d), B->free(B, lser_d);
        B->free(B, (void *)chunks.cu_q), B->free(B, (void *)chunks.q_pos);
    }
    char what[160];
    snprintf(what, sizeof what, "attention on cp=%d query chunks: out rows == whole call's", c);
    report(what, err_out, 1e-6);
    snprintf(what, sizeof what, "attention on cp=%d query chunks: dq rows == whole call's", c);
    report(what, err_dq, 1e-6);
    snprintf(what, sizeof what, "attention on cp=%d query chunks: sum of ranks' dk == whole dk", c);
    report(what, rel_err(sum_dk, want_dk, (size_t)T * KD), 1e-6);
    snprintf(what, sizeof what, "attention on cp=%d query chunks: sum of ranks' dv == whole dv", c);
    report(what, rel_err(sum_dv, want_dv, (size_t)T * KD), 1e-6);
    weft_free(q), weft_free(k), weft_free(v), weft_free(dout), weft_free(pos), weft_free(rows);
    weft_free(cu_q), weft_free(qpos), weft_free(qr), weft_free(dor), weft_free(got), weft_free(want);
    weft_free(sum_dk), weft_free(sum_dv), weft_free(part), weft_free(want_out), weft_free(want_dq);
    weft_free(want_dk), weft_free(want_dv);
}

int main(void) {
    fd_begin();
    double t0 = weft_now_seconds();
    // Documents of lengths 4, 1, 6, 3 packed back to back, grouped-query heads H = 4, KV = 2.
    const int32_t cu_small[] = {0, 4, 5, 11, 14};
    test_attention("[4,1,6,3] H4 KV2 D8", 4, 2, 8, cu_small, 4);
    // A document longer than 64 rows, so implementations that tile queries (the CPU one does, by
    // 64) are checked across a tile boundary; fewer heads keep the finite differences cheap.
    const int32_t cu_long[] = {0, 1, 68, 71};
    test_attention("[1,67,3] H2 KV1 D4", 2, 1, 4, cu_long, 3);
    // Padded documents of 8, 16 and 136 tokens: chunks of 1 to 17 rows, and tiles across chunks.
    const int32_t cu_padded[] = {0, 8, 24, 160};
    test_attention_query_chunks(4, 2, 8, cu_padded, 3, 4);
    test_attention_query_chunks(4, 2, 8, cu_padded, 3, 2);
    return fd_end(t0);
}
