// Finite-difference check of the CPU backend's elementwise and normalization backward ops
// (embedding, RMSNorm, bias, RoPE, SwiGLU), in fp32, plus direct checks of the ops that have no
// backward (matmul, adamw, reductions) against naive double-precision code. The method and the
// tolerances: finite_difference.h.
#include "finite_difference.h"

// ---------------------------------------------------------------------------------------------
// embedding: out (T, C) = table[ids]; dtable += scatter(dout).

typedef struct emb_ctx {
    int T, C, V;
    const int32_t *ids_d;
    float *table;
    void *table_d, *out_d;
    const float *R;
} emb_ctx;

static double emb_J(void *p) {
    emb_ctx *c = p;
    upload(c->table_d, c->table, (size_t)c->V * c->C);
    B->embedding_forward(B, c->ids_d, c->table_d, c->out_d, c->T, c->C);
    return dot_dev(c->out_d, c->R, (size_t)c->T * c->C);
}

static void test_embedding(void) {
    enum { T = 9, C = 5, V = 7 };
    // Row 3 is read three times, rows 0 and 1 twice, rows 2 and 4 never: the scatter must add.
    const int32_t ids[T] = {3, 0, 3, 6, 1, 3, 0, 5, 1};
    emb_ctx c = {.T = T, .C = C, .V = V, .ids_d = dev_i32(ids, T), .table = host_normal(V * C, 0, 1),
                 .R = host_normal(T * C, 0, 1)};
    c.table_d = dev_f32(c.table, V * C);
    c.out_d = dev_f32(NULL, T * C);

    float out[T * C];
    B->embedding_forward(B, c.ids_d, c.table_d, c.out_d, T, C);
    download(out, c.out_d, T * C);
    float want[T * C];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < C; j++) want[t * C + j] = c.table[ids[t] * C + j];
    report("embedding_forward vs gather", rel_err(out, want, T * C), 0);

    void *dout_d = dev_f32(c.R, T * C);
    float *dtable_d = dev_f32(NULL, V * C);
    float g[V * C], g_pre[V * C];
    B->embedding_backward(B, c.ids_d, dout_d, dtable_d, T, C);
    download(g, dtable_d, V * C);
    float *prefill = host_normal(V * C, 0, 1);
    upload(dtable_d, prefill, V * C);
    B->embedding_backward(B, c.ids_d, dout_d, dtable_d, T, C);
    download(g_pre, dtable_d, V * C);

    report("embedding_backward dtable (fd)", fd_rel_err(emb_J, &c, c.table, V * C, g, H_LINEAR),
           TOL_FD_LINEAR);
    check_prefilled("embedding_backward dtable accumulates (+=)", g, prefill, g_pre, V * C, true);
}

// ---------------------------------------------------------------------------------------------
// rmsnorm: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); dx +=, dw +=.

typedef struct rms_ctx {
    int T, C;
    float eps;
    float *x, *w;
    void *x_d, *w_d, *out_d;
    float *rstd_d;
    const float *R;
} rms_ctx;

static double rms_J(void *p) {
    rms_ctx *c = p;
    upload(c->x_d, c->x, (size_t)c->T * c->C);
    upload(c->w_d, c->w, c->C);
    B->rmsnorm_forward(B, c->x_d, c->w_d, c->eps, c->out_d, c->rstd_d, c->T, c->C);
    return dot_dev(c->out_d, c->R, (size_t)c->T * c->C);
}

// Forward against double: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
static void check_rmsnorm_forward(const char *what, rms_ctx *c) {
    int T = c->T, C = c->C;
    rms_J(c); // runs the forward on c->x
    float *out = weft_alloc(sizeof(float) * T * C), *rstd = weft_alloc(sizeof(float) * T);
    double *want_out = weft_alloc(sizeof(double) * T * C), *want_rstd = weft_alloc(sizeof(double) * T);
    download(out, c->out_d, (size_t)T * C);
    download(rstd, c->rstd_d, T);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int j = 0; j < C; j++) ss += (double)c->x[t * C + j] * c->x[t * C + j];
        want_rstd[t] = 1 / sqrt(ss / C + c->eps);
        for (int j = 0; j < C; j++) want_out[t * C + j] = c->x[t * C + j] * want_rstd[t] * c->w[j];
    }
    char line[128];
    snprintf(line, sizeof line, "%s out vs double", what);
    report(line, rel_err_d(out, want_out, (size_t)T * C), 1e-5);
    snprintf(line, sizeof line, "%s rstd vs double", what);
    report(line, rel_err_d(rstd, want_rstd, T), 1e-5);
    weft_free(out), weft_free(rstd), weft_free(want_out), weft_free(want_rstd);
}

static void test_rmsnorm(void) {
    enum { T = 4, C = 8 };
    rms_ctx c = {.T = T, .C = C, .eps = 1e-5f, .x = host_normal(T * C, 0, 1),
                 .w = host_normal(C, 1, 0.3), .R = host_normal(T * C, 0, 1)};
    c.x_d = dev_f32(c.x, T * C);
    c.w_d = dev_f32(c.w, C);
    c.out_d = dev_f32(NULL, T * C);
    c.rstd_d = dev_f32(NULL, T);

    check_rmsnorm_forward("rmsnorm_forward", &c);
    // Rows with mean(x^2) ~ eps, where eps must sit inside the square root: 1/sqrt(ms + eps).
    float *x_small = host_normal(T * C, 0, 3e-3);
    rms_ctx small = c;
    small.x = x_small;
    check_rmsnorm_forward("rmsnorm_forward, mean(x^2) ~ eps,", &small);
    rms_J(&c); // the forward on x again: backward reads its rstd

    void *dout_d = dev_f32(c.R, T * C), *dx_d = dev_f32(NULL, T * C);
    float *dw_d = dev_f32(NULL, C);
    float gx[T * C], gw[C], gx_pre[T * C], gw_pre[C];
    B->rmsnorm_backward(B, c.x_d, c.w_d, c.rstd_d, dout_d, dx_d, dw_d, T, C);
    download(gx, dx_d, T * C);
    download(gw, dw_d, C);
    float *px = host_normal(T * C, 0, 1), *pw = host_normal(C, 0, 1);
    upload(dx_d, px, T * C);
    upload(dw_d, pw, C);
    B->rmsnorm_backward(B, c.x_d, c.w_d, c.rstd_d, dout_d, dx_d, dw_d, T, C);
    download(gx_pre, dx_d, T * C);
    download(gw_pre, dw_d, C);

    report("rmsnorm_backward dx (fd)", fd_rel_err(rms_J, &c, c.x, T * C, gx, H_NONLINEAR),
           TOL_FD_NONLINEAR);
    report("rmsnorm_backward dw (fd)", fd_rel_err(rms_J, &c, c.w, C, gw, H_LINEAR), TOL_FD_LINEAR);
    check_prefilled("rmsnorm_backward dx accumulates (+=)", gx, px, gx_pre, T * C, true);
    check_prefilled("rmsnorm_backward dw accumulates (+=)", gw, pw, gw_pre, C, true);
}

// ---------------------------------------------------------------------------------------------
// bias: y (T, C) = x W^T + bias (C), matmul's bias; dbias += column sums of dout.

typedef struct bias_ctx {
    int T, C, K;
    float *bias;
    void *x_d, *w_d, *y_d, *bias_d;
    const float *R;
} bias_ctx;

static double bias_J(void *p) {
    bias_ctx *c = p;
    const weft_matmul_types f32 = {WEFT_F32, WEFT_F32, WEFT_F32};
    upload(c->bias_d, c->bias, c->C);
    B->matmul(B, false, true, c->T, c->C, c->K, 1.0f, c->x_d, c->K, c->w_d, c->K, 0.0f, NULL,
              c->bias_d, c->y_d, c->C, f32);
    return dot_dev(c->y_d, c->R, (size_t)c->T * c->C);
}

static void test_bias(void) {
    enum { T = 5, C = 6, K = 3 };
    float *x = host_normal(T * K, 0, 1), *w = host_normal(C * K, 0, 1);
    bias_ctx c = {.T = T, .C = C, .K = K, .bias = host_normal(C, 0, 1),
                  .R = host_normal(T * C, 0, 1)};
    c.x_d = dev_f32(x, T * K), c.w_d = dev_f32(w, C * K), c.y_d = dev_f32(NULL, T * C);
    c.bias_d = dev_f32(c.bias, C);

    bias_J(&c);
    float out[T * C], want[T * C];
    download(out, c.y_d, T * C);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < C; j++) {
            double acc = c.bias[j];
            for (int p = 0; p < K; p++) acc += (double)x[t * K + p] * w[j * K + p];
            want[t * C + j] = (float)acc;
        }
    report("matmul + bias vs x W^T + bias", rel_err(out, want, T * C), 1e-6);

    void *dout_d = dev_f32(c.R, T * C);
    float *db_d = dev_f32(NULL, C);
    float g[C], g_pre[C];
    B->bias_backward(B, dout_d, db_d, T, C);
    download(g, db_d, C);
    float *prefill = host_normal(C, 0, 1);
    upload(db_d, prefill, C);
    B->bias_backward(B, dout_d, db_d, T, C);
    download(g_pre, db_d, C);

    report("bias_backward dbias (fd)", fd_rel_err(bias_J, &c, c.bias, C, g, H_LINEAR),
           TOL_FD_LINEAR);
    check_prefilled("bias_backward dbias accumulates (+=)", g, prefill, g_pre, C, true);
}

// ---------------------------------------------------------------------------------------------
// rope: in place on x (T, H, D), rotate-half convention, angles from a table of inverse
// frequencies, cos and sin scaled by a factor; backward is the adjoint (the inverse rotation,
// scaled).

typedef struct rope_ctx {
    int T, H, D;
    float scale;
    const float *freq_d; // (D/2) on the device
    const int32_t *pos_d;
    float *x;
    void *x_d;
    const float *R;
} rope_ctx;

static double rope_J(void *p) {
    rope_ctx *c = p;
    size_t n = (size_t)c->T * c->H * c->D;
    upload(c->x_d, c->x, n);
    B->rope_forward(B, c->x_d, c->H * c->D, c->pos_d, c->freq_d, c->scale, c->T, c->H, c->D);
    return dot_dev(c->x_d, c->R, n);
}

// One table: plain RoPE's (theta 1e4, scale 1: backward inverts forward) or an irregular one
// with a YaRN-style factor, as scaled RoPE makes.
static void test_rope_table(bool irregular) {
    enum { T = 10, H = 2, D = 8, N = T * H * D };
    // Positions restart per packed document, as the trainer passes them, plus one far position.
    const int32_t pos[T] = {0, 1, 2, 3, 4, 0, 1, 2, 0, 57};
    float freq[D / 2];
    for (int i = 0; i < D / 2; i++)
        freq[i] = (float)pow(10000.0, -2.0 * i / D) / (irregular ? 1.0f + 2.5f * (i % 2) : 1.0f);
    rope_ctx c = {.T = T, .H = H, .D = D, .scale = irregular ? 1.2079f : 1.0f,
                  .freq_d = dev_f32(freq, D / 2), .pos_d = dev_i32(pos, T),
                  .x = host_normal(N, 0, 1), .R = host_normal(N, 0, 1)};
    c.x_d = dev_f32(c.x, N);
    char what[96];
    const char *tag = irregular ? " (irregular table, scaled)" : "";

    // Forward against the Hugging Face formula: for i < D/2, angle = pos * inv_freq[i],
    // out[i] = s (x[i] cos - x[i + D/2] sin), out[i + D/2] = s (x[i + D/2] cos + x[i] sin).
    B->rope_forward(B, c.x_d, H * D, c.pos_d, c.freq_d, c.scale, T, H, D);
    float out[N];
    double want[N];
    download(out, c.x_d, N);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                double a = pos[t] * (double)freq[i];
                const float *x = c.x + ((size_t)t * H + h) * D;
                double *o = want + ((size_t)t * H + h) * D;
                o[i] = c.scale * (x[i] * cos(a) - x[i + D / 2] * sin(a));
                o[i + D / 2] = c.scale * (x[i + D / 2] * cos(a) + x[i] * sin(a));
            }
    snprintf(what, sizeof what, "rope_forward vs rotate-half formula%s", tag);
    report(what, rel_err_d(out, want, N), 1e-4);

    if (!irregular) { // Inverse: backward(forward(x)) == x, a rotation's adjoint is its inverse.
        B->rope_backward(B, c.x_d, H * D, c.pos_d, c.freq_d, c.scale, T, H, D);
        float back[N];
        download(back, c.x_d, N);
        report("rope_backward(rope_forward(x)) == x", rel_err(back, c.x, N), 1e-6);
    }

    // Vector-Jacobian product: g = rope_backward(R); <rope(x), R> must equal <x, g>.
    float g[N];
    void *g_d = dev_f32(c.R, N);
    B->rope_backward(B, g_d, H * D, c.pos_d, c.freq_d, c.scale, T, H, D);
    download(g, g_d, N);
    double lhs = rope_J(&c), rhs = 0, scale = 0;
    for (int i = 0; i < N; i++) {
        rhs += (double)c.x[i] * g[i];
        scale += fabs((double)c.x[i] * g[i]);
    }
    snprintf(what, sizeof what, "rope <rope(x), R> == <x, rope_backward(R)>%s", tag);
    report(what, fabs(lhs - rhs) / scale, 1e-6);
    snprintf(what, sizeof what, "rope_backward dx (fd)%s", tag);
    report(what, fd_rel_err(rope_J, &c, c.x, N, g, H_LINEAR), TOL_FD_LINEAR);
}

static void test_rope(void) {
    test_rope_table(false);
    test_rope_table(true);
}

// ---------------------------------------------------------------------------------------------
// swiglu: out (rows, width) = silu(gate) * up, each row of gate_up (rows, 2 width) its gates then
// its ups; d_gate_up overwritten.

typedef struct swiglu_ctx {
    int rows, width;
    float *gate_up;
    void *gate_up_d, *out_d;
    const float *R;
} swiglu_ctx;

static double swiglu_J(void *p) {
    swiglu_ctx *c = p;
    upload(c->gate_up_d, c->gate_up, (size_t)c->rows * 2 * c->width);
    B->swiglu_forward(B, c->gate_up_d, c->out_d, c->rows, c->width);
    return dot_dev(c->out_d, c->R, (size_t)c->rows * c->width);
}

static void test_swiglu(void) {
    enum { ROWS = 4, W = 10, N = ROWS * W };
    swiglu_ctx c = {.rows = ROWS, .width = W, .gate_up = host_normal(2 * N, 0, 1),
                    .R = host_normal(N, 0, 1)};
    for (int r = 0; r < ROWS; r++) // gates spread wider than ups, into both tails of the sigmoid
        for (int j = 0; j < W; j++) c.gate_up[r * 2 * W + j] *= 2.0f;
    c.gate_up_d = dev_f32(c.gate_up, 2 * N);
    c.out_d = dev_f32(NULL, N);

    B->swiglu_forward(B, c.gate_up_d, c.out_d, ROWS, W);
    float out[N];
    double want[N];
    download(out, c.out_d, N);
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < W; j++) {
            double g = c.gate_up[r * 2 * W + j], u = c.gate_up[r * 2 * W + W + j];
            want[r * W + j] = g / (1 + exp(-g)) * u;
        }
    report("swiglu_forward vs double", rel_err_d(out, want, N), 1e-5);

    void *dout_d = dev_f32(c.R, N), *dgu_d = dev_f32(NULL, 2 * N);
    float dgu[2 * N], dgu2[2 * N];
    B->swiglu_backward(B, c.gate_up_d, dout_d, dgu_d, ROWS, W);
    download(dgu, dgu_d, 2 * N);
    float *garbage = host_fill(2 * N, 777.0f);
    upload(dgu_d, garbage, 2 * N);
    B->swiglu_backward(B, c.gate_up_d, dout_d, dgu_d, ROWS, W);
    download(dgu2, dgu_d, 2 * N);
    check_prefilled("swiglu_backward d_gate_up overwrites", dgu, garbage, dgu2, 2 * N, false);

    // Per row: the gates (nonlinear in out) and the ups (linear: the tight tolerance) apart.
    double gate_err = 0, up_err = 0;
    for (int r = 0; r < ROWS; r++) {
        float *gates = c.gate_up + r * 2 * W, *d_gates = dgu + r * 2 * W;
        double g = fd_rel_err(swiglu_J, &c, gates, W, d_gates, H_NONLINEAR);
        double u = fd_rel_err(swiglu_J, &c, gates + W, W, d_gates + W, H_LINEAR);
        gate_err = g > gate_err ? g : gate_err, up_err = u > up_err ? u : up_err;
    }
    report("swiglu_backward d_gate (fd)", gate_err, TOL_FD_NONLINEAR);
    report("swiglu_backward d_up (fd)", up_err, TOL_FD_LINEAR);
}

// ---------------------------------------------------------------------------------------------
// matmul: C = alpha op(A) op(B) + beta C against a naive triple loop in double, every transpose
// combination, padded row strides (padding holds huge values that must never be read, and C's
// padding must not be written). The fourth (alpha, beta) reads C_in from another buffer (a
// residual) into a C that held other values.

static void test_matmul(void) {
    enum { M = 3, N = 4, K = 5, PAD = 2, SETTINGS = 4 };
    const float alphas[SETTINGS] = {1.0f, 0.5f, -1.5f, 1.0f};
    const float betas[SETTINGS] = {0.0f, 1.0f, 0.25f, 1.0f};
    const weft_matmul_types f32 = {WEFT_F32, WEFT_F32, WEFT_F32};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + PAD;
            int b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + PAD;
            int ldc = N + PAD;
            float *a = host_fill((size_t)a_rows * lda, 1e30f), *b = host_fill((size_t)b_rows * ldb, 1e30f);
            for (int r = 0; r < a_rows; r++)
                for (int j = 0; j < a_cols; j++) a[r * lda + j] = (float)weft_rng_normal(&rng);
            for (int r = 0; r < b_rows; r++)
                for (int j = 0; j < b_cols; j++) b[r * ldb + j] = (float)weft_rng_normal(&rng);
            void *a_d = dev_f32(a, (size_t)a_rows * lda), *b_d = dev_f32(b, (size_t)b_rows * ldb);
            err_acc e = {0};
            double pad_written = 0;
            for (int s = 0; s < SETTINGS; s++) {
                float *c0 = host_normal((size_t)M * ldc, 0, 1);
                float cout[M * (N + PAD)];
                for (int i = 0; i < M; i++)
                    for (int j = N; j < ldc; j++) c0[i * ldc + j] = -7.0f;
                void *c_in = s == 3 ? dev_f32(c0, (size_t)M * ldc) : NULL;
                if (c_in)
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++) c0[i * ldc + j] += 100.0f; // not C_in's
                void *c_d = dev_f32(c0, (size_t)M * ldc);
                if (c_in)
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++) c0[i * ldc + j] -= 100.0f;
                B->matmul(B, ta, tb, M, N, K, alphas[s], a_d, lda, b_d, ldb, betas[s], c_in, NULL,
                          c_d, ldc, f32);
                download(cout, c_d, (size_t)M * ldc);
                for (int i = 0; i < M; i++) {
                    for (int j = 0; j < N; j++) {
                        double acc = 0;
                        for (int p = 0; p < K; p++) {
                            double av = ta ? a[p * lda + i] : a[i * lda + p];
                            double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                            acc += av * bv;
                        }
                        acc_add(&e, cout[i * ldc + j], alphas[s] * acc + betas[s] * c0[i * ldc + j]);
                    }
                    for (int j = N; j < ldc; j++) pad_written = fmax(pad_written, fabs(cout[i * ldc + j] + 7.0f));
                }
                B->free(B, c_d);
                if (c_in) B->free(B, c_in);
                weft_free(c0);
            }
            char what[96];
            snprintf(what, sizeof what, "matmul trans_a=%d trans_b=%d, %d (alpha, beta) vs naive", ta,
                     tb, SETTINGS);
            report(what, pad_written > 0 ? INFINITY : acc_rel(&e), 1e-5);
            B->free(B, a_d), B->free(B, b_d);
            weft_free(a), weft_free(b);
        }
}

// ---------------------------------------------------------------------------------------------
// matmul rows are the same bits in any call (the CPU contract of DESIGN.md section 11, which
// micro-batches, prefill in pieces and decode batches rely on): every row of X W^T and X W,
// computed in calls of 2-40 rows at several offsets, equals the row computed alone, on the model
// shapes of the tests (widths 64-384, a vocabulary of 257) and the small benchmark model's MLP
// (K = 688). BLAS kernels that sum a row by its place in the call (OpenBLAS's Haswell kernel, its
// SkylakeX small-matrix path) fail it, and so does OpenBLAS's own threading with 2+ threads: a
// threaded call splits K = 688 as 344 + 344, a single-threaded one as 352 + 336.

static void test_matmul_rows_are_call_independent(void) {
    enum { ROWS = 40, SHAPES = 6 };
    const int shapes[SHAPES][2] = {{64, 128}, {128, 128}, {257, 128}, {384, 128}, {128, 384},
                                   {256, 688}};
    const int counts[] = {2, 3, 5, 7, 12, 13, 24, 40};
    const weft_matmul_types f32 = {WEFT_F32, WEFT_F32, WEFT_F32};
    for (int s = 0; s < SHAPES; s++)
        for (int tb = 0; tb < 2; tb++) {
            int N = shapes[s][0], K = shapes[s][1], ldb = tb ? K : N;
            float *x = host_normal((size_t)ROWS * K, 0, 1), *w = host_normal((size_t)N * K, 0, 1);
            float *alone = weft_alloc(sizeof(float) * ROWS * N), *got = weft_alloc(sizeof(float) * ROWS * N);
            void *x_d = dev_f32(x, (size_t)ROWS * K), *w_d = dev_f32(w, (size_t)N * K);
            void *c_d = dev_f32(NULL, (size_t)ROWS * N);
            for (int r = 0; r < ROWS; r++) {
                B->matmul(B, false, tb, 1, N, K, 1.0f, (float *)x_d + (size_t)r * K, K, w_d, ldb, 0.0f,
                          NULL, NULL, c_d, N, f32);
                download(alone + (size_t)r * N, c_d, N);
            }
            double worst = 0;
            for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
                for (int off = 0; off + counts[i] <= ROWS; off += 9) {
                    B->matmul(B, false, tb, counts[i], N, K, 1.0f, (float *)x_d + (size_t)off * K, K,
                              w_d, ldb, 0.0f, NULL, NULL, c_d, N, f32);
                    download(got, c_d, (size_t)counts[i] * N);
                    worst = fmax(worst, rel_err(got, alone + (size_t)off * N, (size_t)counts[i] * N));
                }
            char what[96];
            snprintf(what, sizeof what, "matmul rows in calls of 2-40 vs alone, N=%d K=%d trans_b=%d",
                     N, K, tb);
            report(what, worst, 0);
            B->free(B, x_d), B->free(B, w_d), B->free(B, c_d);
            weft_free(x), weft_free(w), weft_free(alone), weft_free(got);
        }
}

// ---------------------------------------------------------------------------------------------
// adamw: 3 steps against torch.optim.AdamW's update written out in double.

static void test_adamw(void) {
    enum { N = 24, STEPS = 3 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p0 = host_normal(N, 0, 1);
    double p[N], m[N] = {0}, v[N] = {0};
    for (int i = 0; i < N; i++) p[i] = p0[i];
    void *p_d = dev_f32(p0, N);
    float *g_d = dev_f32(NULL, N), *m_d = dev_f32(NULL, N), *v_d = dev_f32(NULL, N);
    for (int t = 1; t <= STEPS; t++) {
        float *g = host_normal(N, 0, 1);
        g[0] = 0;                                    // only weight decay moves it
        for (int i = 1; i < 5; i++) g[i] *= 1e-8f;   // sqrt(v_hat) ~ eps: eps placement matters
        upload(g_d, g, N);
        B->adamw(B, p_d, NULL, g_d, m_d, v_d, N, lr, b1, b2, eps, wd, t);
        double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
        for (int i = 0; i < N; i++) {
            p[i] -= (double)lr * wd * p[i];
            m[i] = b1 * m[i] + (1 - (double)b1) * g[i];
            v[i] = b2 * v[i] + (1 - (double)b2) * (double)g[i] * g[i];
            p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
        }
        weft_free(g);
    }
    float got_p[N], got_m[N], got_v[N];
    download(got_p, p_d, N);
    download(got_m, m_d, N);
    download(got_v, v_d, N);
    // Parameters are compared by their change over the 3 steps (about lr per step), which fp32
    // storage of p ~ 1 resolves to ~1e-7 / 3e-2: tolerance 1e-4.
    err_acc e = {0};
    for (int i = 0; i < N; i++) acc_add(&e, (double)got_p[i] - p0[i], p[i] - p0[i]);
    report("adamw param change after 3 steps vs double", acc_rel(&e), 1e-4);
    report("adamw m after 3 steps vs double", rel_err_d(got_m, m, N), 1e-5);
    report("adamw v after 3 steps vs double", rel_err_d(got_v, v, N), 1e-5);
}

// ---------------------------------------------------------------------------------------------
// sum_f32, sumsq_f32 (accumulated in double: with 1e5 positive terms an fp32 accumulator is off
// by 1e-7 to 1e-4, a double one by ~1e-14, hence tol 1e-9), scale_f32 and add_inplace (single
// correctly rounded fp32 operations: exact).

static void test_reductions(void) {
    enum { N = 100003 };
    float *x = weft_alloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = (float)weft_rng_uniform(&rng);
    float *x_d = dev_f32(x, N);
    double sum = 0, sumsq = 0;
    for (int i = 0; i < N; i++) sum += x[i], sumsq += (double)x[i] * x[i];
    report("sum_f32 vs double", fabs(B->sum_f32(B, x_d, N) - sum) / sum, 1e-9);
    report("sumsq_f32 vs double", fabs(B->sumsq_f32(B, x_d, N) - sumsq) / sumsq, 1e-9);

    float *got = weft_alloc(N * sizeof(float)), *want = weft_alloc(N * sizeof(float));
    B->scale_f32(B, x_d, -0.37f, N);
    download(got, x_d, N);
    for (int i = 0; i < N; i++) want[i] = x[i] * -0.37f;
    report("scale_f32 vs x * s", rel_err(got, want, N), 0);

    float *y = host_normal(N, 0, 1);
    void *y_d = dev_f32(y, N);
    upload(x_d, x, N);
    B->add_inplace(B, y_d, x_d, N);
    download(got, y_d, N);
    for (int i = 0; i < N; i++) want[i] = y[i] + x[i];
    report("add_inplace vs y + x", rel_err(got, want, N), 0);
}

int main(void) {
    fd_begin();
    double t0 = weft_now_seconds();
    test_embedding();
    test_rmsnorm();
    test_bias();
    test_rope();
    test_swiglu();
    test_matmul();
    test_matmul_rows_are_call_independent();
    test_adamw();
    test_reductions();
    return fd_end(t0);
}
