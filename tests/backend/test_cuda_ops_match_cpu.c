// Every op of the CUDA backend (bf16 storage, fp32 math) against the CPU backend (fp32) on the
// same inputs: the inputs are rounded to bf16 first, so the difference is the CUDA op's own
// rounding. Tolerance: max|cuda - cpu| / max|cpu| <= 2e-2 per output (bf16 keeps 8 bits, 4e-3
// relative per stored value; outputs built from long sums of such values reach about 1e-2).
// fp32 outputs computed in fp32 from bf16-exact inputs (gradients accumulated into f32, rstd,
// reductions, AdamW) get 1e-4 or tighter.
// Needs a GPU: exits 77 (skipped) where none is visible, so a CPU-only CI reports it skipped.
#include "twin_backends.h"

// ---------------------------------------------------------------------------------- tests ----

// With a residual, C = 0.5 A B + R with R another buffer (C holding zeros before).
static void test_matmul(bool ta, bool tb, bool f32_out, bool residual) {
    int m = 37, n = 48, k = 70, lda = ta ? m + 3 : k + 5, ldb = tb ? k + 2 : n + 1, ldc = n + 4;
    twin a = act((size_t)(ta ? k : m) * lda, 1), b = act((size_t)(tb ? n : k) * ldb, 1);
    twin c = residual ? zeros((size_t)m * ldc, WEFT_BF16)
             : f32_out ? f32((size_t)m * ldc, 1) : act((size_t)m * ldc, 1);
    twin r = residual ? act((size_t)m * ldc, 1) : zeros(1, WEFT_BF16);
    float beta = f32_out || residual ? 1.0f : 0.0f;
    weft_matmul_types tc = {WEFT_F32, WEFT_F32, WEFT_F32};
    weft_matmul_types tg = {WEFT_BF16, WEFT_BF16, f32_out ? WEFT_F32 : WEFT_BF16};
    cpu->matmul(cpu, ta, tb, m, n, k, 0.5f, a.c, lda, b.c, ldb, beta, residual ? r.c : NULL, NULL,
                c.c, ldc, tc);
    gpu->matmul(gpu, ta, tb, m, n, k, 0.5f, a.g, lda, b.g, ldb, beta, residual ? r.g : NULL, NULL,
                c.g, ldc, tg);
    char name[96];
    snprintf(name, sizeof name, "matmul ta=%d tb=%d %s", ta, tb,
             residual ? "bf16 C = AB + R" : f32_out ? "f32 C += (dW)" : "bf16 C =");
    compare(name, &c, BF16_TOL);
    release(&a), release(&b), release(&c), release(&r);
}

// The decode step's products (x W^T, bf16) against the CPU: of a few rows (few_rows.cu), each
// row also the same bits as that row multiplied alone, since a sequence's logits must not depend
// on what else the batch holds; of 9 to 64 rows (skinny.cu, mma.sync), the same bits when run
// again: its blocks' sums over ranges of K are added in split order whichever block arrives
// last (the emulator runs a launch's blocks in an order drawn per launch), and its counters
// are left at zero for the next call. Past 64 rows, cuBLASLt's (run again too). With the
// backend's batch_invariant on (`invariant`), every row count on skinny.cu, and every row the
// bits of that row alone.
static bool invariant;
static int skinny_rows = 64; // the backend's WEFT_CUDA_SKINNY_ROWS
static void test_projection(int m, int n, int k, bool residual) {
    int lda = k + 8, ldb = k + 16, ldc = n + 3;
    size_t esz = sizeof(uint16_t);
    twin a = act((size_t)m * lda, 1), b = act((size_t)n * ldb, 1);
    twin c = residual ? zeros((size_t)m * ldc, WEFT_BF16) : act((size_t)m * ldc, 1);
    twin r = residual ? act((size_t)m * ldc, 1) : zeros(1, WEFT_BF16);
    twin alone = zeros((size_t)ldc, WEFT_BF16);
    float beta = residual ? 1.0f : 0.0f;
    weft_matmul_types tc = {WEFT_F32, WEFT_F32, WEFT_F32}, tg = {WEFT_BF16, WEFT_BF16, WEFT_BF16};
    cpu->matmul(cpu, false, true, m, n, k, 0.5f, a.c, lda, b.c, ldb, beta, residual ? r.c : NULL,
                NULL, c.c, ldc, tc);
    gpu->matmul(gpu, false, true, m, n, k, 0.5f, a.g, lda, b.g, ldb, beta, residual ? r.g : NULL,
                NULL, c.g, ldc, tg);
    char name[96];
    const char *kernel = invariant         ? "invariant"
                         : m <= 8          ? "few rows"
                         : m <= skinny_rows ? "skinny"
                                            : "GEMM";
    snprintf(name, sizeof name, "matmul %s m=%d n=%d k=%d%s", kernel, m, n, k,
             residual ? " + R" : "");
    compare(name, &c, BF16_TOL);
    uint16_t *batch = weft_alloc((size_t)m * ldc * esz), *row = weft_alloc((size_t)ldc * esz);
    gpu->to_host(gpu, batch, c.g, (size_t)m * ldc * esz);
    int differ = 0;
    if (m > 8 && !invariant) { // again, into a zeroed C
        twin again = zeros((size_t)m * ldc, WEFT_BF16);
        gpu->matmul(gpu, false, true, m, n, k, 0.5f, a.g, lda, b.g, ldb, beta,
                    residual ? r.g : NULL, NULL, again.g, ldc, tg);
        uint16_t *second = weft_alloc((size_t)m * ldc * esz);
        gpu->to_host(gpu, second, again.g, (size_t)m * ldc * esz);
        for (int i = 0; i < m; i++) {
            size_t at = (size_t)i * ldc;
            differ += memcmp(second + at, batch + at, (size_t)n * esz) != 0;
        }
        printf("%-52s %d of %d rows differ when run again %s\n", name, differ, m,
               differ ? "FAIL" : "ok");
        failures += differ != 0;
        weft_free(batch), weft_free(row), weft_free(second);
        release(&a), release(&b), release(&c), release(&r), release(&alone), release(&again);
        return;
    }
    for (int i = 0; i < m; i++) {
        const void *res = residual ? (const char *)r.g + (size_t)i * ldc * esz : NULL;
        gpu->matmul(gpu, false, true, 1, n, k, 0.5f, (const char *)a.g + (size_t)i * lda * esz,
                    lda, b.g, ldb, beta, res, NULL, alone.g, ldc, tg);
        gpu->to_host(gpu, row, alone.g, (size_t)ldc * esz);
        differ += memcmp(row, batch + (size_t)i * ldc, (size_t)n * esz) != 0;
    }
    printf("%-52s %d of %d rows differ from the row alone %s\n", name, differ, m,
           differ ? "FAIL" : "ok");
    failures += differ != 0;
    weft_free(batch), weft_free(row);
    release(&a), release(&b), release(&c), release(&r), release(&alone);
}

// A forward-only pass's MLP input (swiglu_product): the same bits as the product followed by
// swiglu_forward on the GPU, whether a decode step's rows take a fused kernel (few rows, or
// skinny's up to 64) or more rows the two ops; and the CPU's values.
static void test_swiglu_product(int rows, int width, int k) {
    size_t esz = sizeof(uint16_t), n = (size_t)rows * width;
    twin x = act((size_t)rows * k, 1), w = act((size_t)2 * width * k, 1);
    twin gate_up = zeros(2 * n, WEFT_BF16), out = zeros(n, WEFT_BF16);
    twin apart = zeros(n, WEFT_BF16);
    weft_matmul_types tg = {WEFT_BF16, WEFT_BF16, WEFT_BF16};
    cpu->swiglu_product(cpu, x.c, w.c, gate_up.c, out.c, rows, k, width);
    gpu->swiglu_product(gpu, x.g, w.g, gate_up.g, out.g, rows, k, width);
    char name[96];
    snprintf(name, sizeof name, "swiglu_product rows=%d width=%d k=%d", rows, width, k);
    compare(name, &out, BF16_TOL);
    gpu->matmul(gpu, false, true, rows, 2 * width, k, 1.0f, x.g, k, w.g, k, 0.0f, NULL, NULL,
                gate_up.g, 2 * width, tg);
    gpu->swiglu_forward(gpu, gate_up.g, apart.g, rows, width);
    uint16_t *fused = weft_alloc(n * esz), *two = weft_alloc(n * esz);
    gpu->to_host(gpu, fused, out.g, n * esz);
    gpu->to_host(gpu, two, apart.g, n * esz);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += fused[i] != two[i];
    printf("%-52s %zu values differ from matmul + swiglu_forward %s\n", name, differ,
           differ ? "FAIL" : "ok");
    failures += differ != 0;
    weft_free(fused), weft_free(two);
    release(&x), release(&w), release(&gate_up), release(&out), release(&apart);
}

static void test_embedding(void) {
    int V = 50, C = 96, T = 40;
    int32_t id[40];
    for (int t = 0; t < T; t++) id[t] = (int32_t)(weft_rng_next(&rng) % 7) * 7; // repeats
    ints ids = upload_ints(id, T);
    twin table = act((size_t)V * C, 1), out = zeros((size_t)T * C, WEFT_BF16);
    twin dout = act((size_t)T * C, 1), dtable = f32((size_t)V * C, 1);
    cpu->embedding_forward(cpu, ids.c, table.c, out.c, T, C);
    gpu->embedding_forward(gpu, ids.g, table.g, out.g, T, C);
    compare("embedding_forward", &out, 0);
    cpu->embedding_backward(cpu, ids.c, dout.c, dtable.c, T, C);
    gpu->embedding_backward(gpu, ids.g, dout.g, dtable.g, T, C);
    compare("embedding_backward (f32 +=)", &dtable, F32_TOL);
    release(&table), release(&out), release(&dout), release(&dtable), release_ints(&ids);
}

static void test_rmsnorm(void) {
    int T = 45, C = 300; // more rows than one backward block, C not a multiple of the block
    twin x = act((size_t)T * C, 2), w = act(C, 1), out = zeros((size_t)T * C, WEFT_BF16);
    twin rstd = zeros(T, WEFT_F32), dout = act((size_t)T * C, 1), dx = act((size_t)T * C, 1);
    twin dw = f32(C, 1);
    cpu->rmsnorm_forward(cpu, x.c, w.c, 1e-6f, out.c, rstd.c, T, C);
    gpu->rmsnorm_forward(gpu, x.g, w.g, 1e-6f, out.g, rstd.g, T, C);
    compare("rmsnorm_forward out", &out, BF16_TOL);
    compare("rmsnorm_forward rstd", &rstd, F32_TOL);
    cpu->rmsnorm_backward(cpu, x.c, w.c, rstd.c, dout.c, dx.c, dw.c, T, C);
    gpu->rmsnorm_backward(gpu, x.g, w.g, rstd.g, dout.g, dx.g, dw.g, T, C);
    compare("rmsnorm_backward dx (+=)", &dx, BF16_TOL);
    compare("rmsnorm_backward dw (f32 +=)", &dw, F32_TOL);
    release(&x), release(&w), release(&out), release(&rstd), release(&dout), release(&dx),
        release(&dw);
}

// A matmul's bias, on a GEMM's rows (T of them) and on the few-row and skinny kernels' (1, 5
// and 20, where it is added in the same launch): against the CPU, and on the GPU the bits of the
// product rounded to bf16 and then the bias added (a separate add's). Then its backward, the
// column sums.
static void test_bias(void) {
    int C = 40, K = 96;
    const int row_counts[] = {1, 5, 20, 70}; // few rows, few rows, skinny, GEMM
    for (int i_rows = 0; i_rows < 4; i_rows++) {
        int T = row_counts[i_rows];
        twin x = act((size_t)T * K, 1), w = act((size_t)C * K, 1), b = act(C, 1);
        twin y = zeros((size_t)T * C, WEFT_BF16), plain = zeros((size_t)T * C, WEFT_BF16);
        weft_matmul_types tc = {WEFT_F32, WEFT_F32, WEFT_F32};
        weft_matmul_types tg = {WEFT_BF16, WEFT_BF16, WEFT_BF16};
        cpu->matmul(cpu, false, true, T, C, K, 1.0f, x.c, K, w.c, K, 0.0f, NULL, b.c, y.c, C, tc);
        gpu->matmul(gpu, false, true, T, C, K, 1.0f, x.g, K, w.g, K, 0.0f, NULL, b.g, y.g, C, tg);
        gpu->matmul(gpu, false, true, T, C, K, 1.0f, x.g, K, w.g, K, 0.0f, NULL, NULL, plain.g, C,
                    tg);
        char name[64];
        snprintf(name, sizeof name, "matmul + bias, %d rows", T);
        compare(name, &y, BF16_TOL);
        float *with = weft_alloc(sizeof(float) * T * C), *without = weft_alloc(sizeof(float) * T * C);
        gpu->to_f32(gpu, with, y.g, WEFT_BF16, y.n);
        gpu->to_f32(gpu, without, plain.g, WEFT_BF16, plain.n);
        int differ = 0;
        for (int i = 0; i < T * C; i++)
            differ += with[i] != bf16_round(without[i] + b.host[i % C]);
        printf("%-52s %d values not the rounded product's + bias %s\n", name, differ,
               differ ? "FAIL" : "ok");
        failures += differ != 0;
        weft_free(with), weft_free(without);
        release(&x), release(&w), release(&b), release(&y), release(&plain);
    }
    int T = 70;
    twin dout = act((size_t)T * C, 1), db = f32(C, 1);
    // From bf16-exact gradients on both sides: the column sums themselves are fp32.
    cpu->bias_backward(cpu, dout.c, db.c, T, C);
    gpu->bias_backward(gpu, dout.g, db.g, T, C);
    compare("bias_backward (f32 +=)", &db, F32_TOL);
    release(&dout), release(&db);
}

// RoPE from a frequency table: plain RoPE's (theta 1e6) and an irregular one with a YaRN-style
// attention factor, as any rope scaling makes.
static void test_rope(void) {
    enum { T = 20, H = 3, D = 16 };
    int32_t p[T];
    for (int t = 0; t < T; t++) p[t] = t * 997; // large positions: the double-precision angle
    ints pos = upload_ints(p, T);
    float plain[D / 2], irregular[D / 2];
    for (int i = 0; i < D / 2; i++) {
        plain[i] = (float)pow(1e6, -2.0 * i / D);
        irregular[i] = plain[i] / (i % 3 == 0 ? 8.0f : 1.0f + 0.37f * i);
    }
    const float *tables[] = {plain, irregular}, scales[] = {1.0f, 1.2079f};
    const char *names[] = {"rope_forward", "rope_backward (inverse rotation)",
                           "rope_forward (irregular table, scaled)",
                           "rope_backward (irregular table, scaled)"};
    for (int k = 0; k < 2; k++) {
        twin freq = make(D / 2, WEFT_F32, 0, false);
        cpu->to_device(cpu, freq.c, tables[k], sizeof plain);
        gpu->to_device(gpu, freq.g, tables[k], sizeof plain);
        twin x = act((size_t)T * H * D, 1);
        cpu->rope_forward(cpu, x.c, H * D, pos.c, freq.c, scales[k], T, H, D);
        gpu->rope_forward(gpu, x.g, H * D, pos.g, freq.g, scales[k], T, H, D);
        compare(names[2 * k], &x, BF16_TOL);
        cpu->rope_backward(cpu, x.c, H * D, pos.c, freq.c, scales[k], T, H, D);
        gpu->rope_backward(gpu, x.g, H * D, pos.g, freq.g, scales[k], T, H, D);
        compare(names[2 * k + 1], &x, BF16_TOL);
        release(&x), release(&freq);
    }
    release_ints(&pos);
}

// q|k|v rows of a fused product into their three matrices and back (copies: the same values),
// then with the q and k heads turned on the way, as the model splits them (four heads of q, one
// of k, of 16).
static void test_split_columns(void) {
    enum { ROWS = 6, PARTS = 3, D = 16, TURNED = 5 };
    const int widths[PARTS] = {64, 16, 16};
    int32_t p[ROWS];
    float table[D / 2];
    for (int t = 0; t < ROWS; t++) p[t] = 5 + t * 1999;
    for (int i = 0; i < D / 2; i++) table[i] = (float)pow(1e4, -2.0 * i / D);
    ints pos = upload_ints(p, ROWS);
    twin freq = make(D / 2, WEFT_F32, 0, false);
    cpu->to_device(cpu, freq.c, table, sizeof table);
    gpu->to_device(gpu, freq.g, table, sizeof table);
    for (int turning = 0; turning < 2; turning++) {
        twin fused = act(ROWS * 96, 1), back = zeros(ROWS * 96, WEFT_BF16), parts[PARTS];
        weft_column_parts on_cpu = {.n = PARTS}, on_gpu = {.n = PARTS};
        for (int i = 0; i < PARTS; i++) {
            parts[i] = zeros((size_t)ROWS * widths[i], WEFT_BF16);
            on_cpu.part[i] = parts[i].c, on_gpu.part[i] = parts[i].g;
            on_cpu.width[i] = on_gpu.width[i] = widths[i];
        }
        weft_rope_rows rc = {pos.c, freq.c, 1.1f, TURNED, D}, rg = {pos.g, freq.g, 1.1f, TURNED, D};
        cpu->split_columns(cpu, fused.c, &on_cpu, ROWS, false, turning ? &rc : NULL);
        gpu->split_columns(gpu, fused.g, &on_gpu, ROWS, false, turning ? &rg : NULL);
        const char *names[2][PARTS + 2] = {
            {"split_columns q", "split_columns k", "split_columns v", "split_columns fused",
             "split_columns join"},
            {"split_columns turning q", "split_columns turning k", "split_columns v (unturned)",
             "split_columns turning fused", "split_columns join, turning back"}};
        for (int i = 0; i < PARTS; i++) compare(names[turning][i], &parts[i], BF16_TOL);
        compare(names[turning][PARTS], &fused, BF16_TOL);
        cpu->split_columns(cpu, back.c, &on_cpu, ROWS, true, turning ? &rc : NULL);
        gpu->split_columns(gpu, back.g, &on_gpu, ROWS, true, turning ? &rg : NULL);
        compare(names[turning][PARTS + 1], &back, BF16_TOL);
        for (int i = 0; i < PARTS; i++) release(&parts[i]);
        release(&fused), release(&back);
    }
    release(&freq), release_ints(&pos);
}

static void test_swiglu_add_scale_sums(void) {
    enum { ROWS = 5, WIDTH = 200 };
    size_t N = (size_t)ROWS * WIDTH;
    twin gu = act(2 * N, 2), u = act(N, 1), out = zeros(N, WEFT_BF16), dout = act(N, 1);
    twin dgu = zeros(2 * N, WEFT_BF16), g = act(N, 2);
    cpu->swiglu_forward(cpu, gu.c, out.c, ROWS, WIDTH);
    gpu->swiglu_forward(gpu, gu.g, out.g, ROWS, WIDTH);
    compare("swiglu_forward", &out, BF16_TOL);
    cpu->swiglu_backward(cpu, gu.c, dout.c, dgu.c, ROWS, WIDTH);
    gpu->swiglu_backward(gpu, gu.g, dout.g, dgu.g, ROWS, WIDTH);
    // The gates' and ups' gradients apart (split_columns: exact copies), as their scales differ.
    twin dg = zeros(N, WEFT_BF16), du = zeros(N, WEFT_BF16);
    weft_column_parts on_cpu = {.part = {dg.c, du.c}, .width = {WIDTH, WIDTH}, .n = 2};
    weft_column_parts on_gpu = {.part = {dg.g, du.g}, .width = {WIDTH, WIDTH}, .n = 2};
    cpu->split_columns(cpu, dgu.c, &on_cpu, ROWS, false, NULL);
    gpu->split_columns(gpu, dgu.g, &on_gpu, ROWS, false, NULL);
    compare("swiglu_backward dgate", &dg, BF16_TOL);
    compare("swiglu_backward dup", &du, BF16_TOL);
    cpu->add_inplace(cpu, u.c, g.c, N);
    gpu->add_inplace(gpu, u.g, g.g, N);
    compare("add_inplace", &u, BF16_TOL);

    twin x = f32(100003, 1);
    double sc = cpu->sum_f32(cpu, x.c, x.n), sg = gpu->sum_f32(gpu, x.g, x.n);
    double qc = cpu->sumsq_f32(cpu, x.c, x.n), qg = gpu->sumsq_f32(gpu, x.g, x.n);
    // Both accumulate in double: only the summation order differs.
    bool ok = fabs(sc - sg) <= 1e-9 * qc && fabs(qc - qg) <= 1e-9 * qc;
    printf("%-52s |d sum| %.2e |d sumsq| %.2e %s\n", "sum_f32 / sumsq_f32", fabs(sc - sg),
           fabs(qc - qg), ok ? "ok" : "FAIL");
    failures += !ok;
    cpu->scale_f32(cpu, x.c, 0.3f, x.n);
    gpu->scale_f32(gpu, x.g, 0.3f, x.n);
    compare("scale_f32", &x, 1e-7);
    release(&g), release(&u), release(&out), release(&dout), release(&gu), release(&dgu);
    release(&dg), release(&du), release(&x);
}

static void test_cross_entropy(void) {
    int T = 9, V = 5000;
    int32_t y[9] = {3, -1, 4999, 0, 17, -1, 2500, 1, 4000};
    ints targets = upload_ints(y, T);
    twin logits = act((size_t)T * V, 3), loss = zeros(T, WEFT_F32), correct = zeros(T, WEFT_F32);
    cpu->cross_entropy(cpu, logits.c, targets.c, 0.25f, loss.c, correct.c, T, V);
    gpu->cross_entropy(gpu, logits.g, targets.g, 0.25f, loss.g, correct.g, T, V);
    compare("cross_entropy gradient (in place)", &logits, BF16_TOL);
    compare("cross_entropy row loss", &loss, 1e-5);
    compare("cross_entropy correct", &correct, 0);
    release(&logits), release(&loss), release(&correct), release_ints(&targets);
}

// logprobs (logits unchanged), logits_backward with log-prob and entropy weights, and the device
// accumulation of a sum.
static void test_head_ops(void) {
    int T = 9, V = 5000;
    int32_t y[9] = {3, -1, 4999, 0, 17, -1, 2500, 1, 4000};
    ints targets = upload_ints(y, T);
    twin logits = act((size_t)T * V, 3), logp = zeros(T, WEFT_F32), H = zeros(T, WEFT_F32);
    twin correct = zeros(T, WEFT_F32), w = f32(T, 1), u = f32(T, 1);
    cpu->logprobs(cpu, logits.c, targets.c, logp.c, H.c, correct.c, T, V);
    gpu->logprobs(gpu, logits.g, targets.g, logp.g, H.g, correct.g, T, V);
    compare("logprobs logp", &logp, 1e-5);
    compare("logprobs entropy", &H, 1e-5);
    compare("logprobs correct", &correct, 0);
    compare("logprobs leaves the logits", &logits, BF16_TOL);
    cpu->logits_backward(cpu, logits.c, targets.c, w.c, u.c, T, V);
    gpu->logits_backward(gpu, logits.g, targets.g, w.g, u.g, T, V);
    compare("logits_backward gradient (in place)", &logits, BF16_TOL);
    double acc[2] = {0.5, 0.5};
    double *acc_g = gpu->alloc(gpu, sizeof(double));
    gpu->to_device(gpu, acc_g, &acc[1], sizeof(double));
    cpu->accumulate_f32(cpu, logp.c, T, true, -2.0, &acc[0]);
    gpu->accumulate_f32(gpu, logp.g, T, true, -2.0, acc_g);
    gpu->to_host(gpu, &acc[1], acc_g, sizeof(double));
    bool ok = fabs(acc[0] - acc[1]) <= 1e-5 * fabs(acc[0]);
    printf("%-52s |d| %.2e %s\n", "accumulate_f32", fabs(acc[0] - acc[1]), ok ? "ok" : "FAIL");
    failures += !ok;
    gpu->free(gpu, acc_g);
    release(&logits), release(&logp), release(&H), release(&correct), release(&w), release(&u);
    release_ints(&targets);
}

static void test_adamw(void) {
    size_t N = 777;
    twin master = f32(N, 1), grad = f32(N, 1), m = f32(N, 0.1), v = make(N, WEFT_F32, 0, false);
    for (size_t i = 0; i < N; i++) v.host[i] = 0.01f * (float)(i % 13);
    cpu->from_f32(cpu, v.c, WEFT_F32, v.host, N);
    gpu->from_f32(gpu, v.g, WEFT_F32, v.host, N);
    twin param = zeros(N, WEFT_BF16);
    for (int step = 1; step <= 3; step++) {
        cpu->adamw(cpu, master.c, NULL, grad.c, m.c, v.c, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        gpu->adamw(gpu, param.g, master.g, grad.g, m.g, v.g, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                   step);
    }
    compare("adamw master (3 steps)", &master, 1e-5);
    compare("adamw exp_avg_sq", &v, 1e-5);
    cpu->copy(cpu, param.c, master.c, N * sizeof(float)); // the bf16 params round the master
    compare("adamw bf16 params = rounded master", &param, 4e-3); // 2^-9 rounding, with margin
    release(&master), release(&grad), release(&m), release(&v), release(&param);
}

// Which attention kernels the GPU backend under test runs (WEFT_CUDA_ATTENTION).
static const char *family = "";

// Attention on a layout: n_docs documents with query rows cu_q, key rows cu_kv, positions q_pos.
static void check_attention(const char *label, int H, int KV, int D, int n_docs,
                            const int32_t *cu_q, const int32_t *cu_kv, const int32_t *q_pos) {
    int Tq = cu_q[n_docs], Tkv = cu_kv[n_docs];
    ints cq = upload_ints(cu_q, n_docs + 1), ck = upload_ints(cu_kv, n_docs + 1);
    ints pos = upload_ints(q_pos, Tq);
    weft_attention_layout lc = {n_docs, Tq, Tkv, cq.c, ck.c, pos.c};
    weft_attention_layout lg = {n_docs, Tq, Tkv, cq.g, ck.g, pos.g};
    twin q = act((size_t)Tq * H * D, 1), k = act((size_t)Tkv * KV * D, 1);
    twin v = act((size_t)Tkv * KV * D, 1), out = zeros((size_t)Tq * H * D, WEFT_BF16);
    twin lse = zeros((size_t)H * Tq, WEFT_F32), dout = act((size_t)Tq * H * D, 1);
    twin dq = zeros(q.n, WEFT_BF16), dk = zeros(k.n, WEFT_BF16), dv = zeros(v.n, WEFT_BF16);
    cpu->attention_forward(cpu, q.c, k.c, v.c, &lc, out.c, lse.c, H, KV, D);
    gpu->attention_forward(gpu, q.g, k.g, v.g, &lg, out.g, lse.g, H, KV, D);
    char name[128];
    snprintf(name, sizeof name, "attention/%s %s out", family, label);
    compare(name, &out, BF16_TOL);
    snprintf(name, sizeof name, "attention/%s %s lse", family, label);
    compare(name, &lse, 1e-5); // fp32 on bf16-exact inputs on both sides
    // Backward from the same (bf16) forward output on both sides.
    float *o = weft_alloc(out.n * sizeof(float));
    gpu->to_f32(gpu, o, out.g, WEFT_BF16, out.n);
    cpu->from_f32(cpu, out.c, WEFT_F32, o, out.n);
    weft_free(o);
    cpu->attention_backward(cpu, q.c, k.c, v.c, &lc, out.c, lse.c, dout.c, dq.c, dk.c, dv.c, H,
                            KV, D);
    gpu->attention_backward(gpu, q.g, k.g, v.g, &lg, out.g, lse.g, dout.g, dq.g, dk.g, dv.g, H,
                            KV, D);
    const char *names[3] = {"dq", "dk", "dv"};
    const twin *grads[3] = {&dq, &dk, &dv};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "attention/%s %s %s", family, label, names[i]);
        compare(name, grads[i], BF16_TOL);
    }
    // Run again: every gradient bit the same (no float atomics adding in a varying order).
    twin dq2 = zeros(q.n, WEFT_BF16), dk2 = zeros(k.n, WEFT_BF16), dv2 = zeros(v.n, WEFT_BF16);
    gpu->attention_backward(gpu, q.g, k.g, v.g, &lg, out.g, lse.g, dout.g, dq2.g, dk2.g, dv2.g,
                            H, KV, D);
    bool repeats = same_bits(&dq, &dq2) && same_bits(&dk, &dk2) && same_bits(&dv, &dv2);
    printf("attention/%s %s backward repeats bit for bit: %s\n", family, label,
           repeats ? "ok" : "FAIL");
    failures += !repeats;
    release(&q), release(&k), release(&v), release(&out), release(&lse), release(&dout);
    release(&dq), release(&dk), release(&dv), release(&dq2), release(&dk2), release(&dv2);
    release_ints(&cq), release_ints(&ck), release_ints(&pos);
}

// Whole documents: queries and keys are the same rows, positions restart per document.
static void attention_whole(const char *label, int H, int KV, int D, const int *lens, int n) {
    static int32_t pos[4200];
    int32_t cu[16] = {0};
    for (int d = 0; d < n; d++) {
        for (int i = 0; i < lens[d]; i++) pos[cu[d] + i] = i;
        cu[d + 1] = cu[d] + lens[d];
    }
    check_attention(label, H, KV, D, n, cu, cu, pos);
}

// Context parallelism, rank 1 of 2: each document of length L (padded to 4s) contributes its
// chunks 1 and 2 of 4 as queries; the keys are the whole padded document.
static void attention_cp_chunks(void) {
    const int lens[2] = {40, 72}, H = 4, KV = 2, D = 32;
    int32_t cu_q[3] = {0}, cu_kv[3] = {0}, pos[128];
    for (int d = 0; d < 2; d++) {
        int s = lens[d] / 4;
        for (int i = 0; i < s; i++) {
            pos[cu_q[d] + i] = s + i;         // chunk 1
            pos[cu_q[d] + s + i] = 2 * s + i; // chunk 2
        }
        cu_q[d + 1] = cu_q[d] + 2 * s;
        cu_kv[d + 1] = cu_kv[d] + lens[d];
    }
    check_attention("CP rank 1/2 [40,72] H4 KV2 D32", H, KV, D, 2, cu_q, cu_kv, pos);
}

// A copy of the CPU pool with every block's keys back in rows, (block_size, width) per layer: the
// CPU backend stores them transposed (src/backend/cpu/attention.c), the GPU as rows.
static float *cpu_pool_as_rows(const float *pool, size_t n_blocks, int layers, int bs, int width) {
    size_t per_layer = (size_t)2 * bs * width, n = n_blocks * layers * per_layer;
    float *rows = weft_alloc(n * sizeof(float) + 4);
    memcpy(rows, pool, n * sizeof(float));
    for (size_t bl = 0; bl < n_blocks * layers; bl++)
        for (int o = 0; o < bs; o++)
            for (int c = 0; c < width; c++)
                rows[bl * per_layer + (size_t)o * width + c] = pool[bl * per_layer + (size_t)c * bs + o];
    return rows;
}

// The paged KV cache through the op table: kv_store writes every position of four sequences into
// blocks handed out of order in layer 1, then paged_attention runs the last rows of each: 3 of A
// (a prefill continuation), 1 of B and C (decoding), 2 of D, whose 300 positions span more
// than one split of the CUDA kernel (so its partials, in the backend's scratch, are combined). A
// and B share the blocks of their first 32 positions, as two samples of one prompt do. The pool
// itself must match too (bf16-exact values on both sides), and three padding rows (slot -1)
// must store nothing: layer 0 of the pool stays zero.
static void test_paged(int H, int KV, int D, int bs) {
    enum { N_SEQS = 4, N_BLOCKS = 48, LAYERS = 2, MAX_BLOCKS = 20, PADDING = 3, T = 358, TQ = 7 };
    const int lens[N_SEQS] = {45, 37, 5, 300}, rows[N_SEQS] = {3, 1, 1, 2}, shared = 32 / bs;
    int32_t tables[N_SEQS * MAX_BLOCKS] = {0}, slot[T], cu_q[N_SEQS + 1] = {0}, q_pos[TQ];
    int t = 0, next = 0;
    for (int s = 0; s < N_SEQS; s++) {
        int first_own = s == 1 ? shared : 0; // B's first blocks are A's
        for (int j = 0; j < (lens[s] + bs - 1) / bs; j++)
            tables[s * MAX_BLOCKS + j] = j < first_own ? tables[j] : (next++ * 29 + 7) % N_BLOCKS;
        for (int p = first_own * bs; p < lens[s]; p++)
            slot[t++] = tables[s * MAX_BLOCKS + p / bs] * bs + p % bs;
        cu_q[s + 1] = cu_q[s] + rows[s];
        for (int r = 0; r < rows[s]; r++) q_pos[cu_q[s] + r] = lens[s] - rows[s] + r;
    }
    while (t < T) slot[t++] = -1;
    WEFT_CHECK(t - PADDING == 355 && cu_q[N_SEQS] == TQ, "test_paged: %d rows stored", t);
    int width = KV * D;
    ints slots = upload_ints(slot, T), cq = upload_ints(cu_q, N_SEQS + 1);
    ints pos = upload_ints(q_pos, TQ), tab = upload_ints(tables, N_SEQS * MAX_BLOCKS);
    twin pool = zeros((size_t)N_BLOCKS * LAYERS * 2 * bs * width, WEFT_BF16);
    twin k = act((size_t)T * width, 1), v = act((size_t)T * width, 1);
    twin q = act((size_t)TQ * H * D, 1), out = zeros((size_t)TQ * H * D, WEFT_BF16);
    twin lse = zeros((size_t)H * TQ, WEFT_F32);
    weft_kv_pool pc = {pool.c, N_BLOCKS, LAYERS, bs, width}, pg = pc;
    pg.data = pool.g;
    cpu->kv_store(cpu, &pc, 1, slots.c, k.c, v.c, T);
    gpu->kv_store(gpu, &pg, 1, slots.g, k.g, v.g, T);
    char name[96];
    snprintf(name, sizeof name, "kv_store H%d KV%d D%d bs%d", H, KV, D, bs);
    twin as_rows = pool;
    as_rows.c = cpu_pool_as_rows(pool.c, N_BLOCKS, LAYERS, bs, width);
    compare(name, &as_rows, 0);
    weft_free(as_rows.c);
    size_t per_block = (size_t)LAYERS * 2 * bs * width, layer_size = (size_t)2 * bs * width;
    int stray = 0;
    for (int b = 0; b < N_BLOCKS; b++)
        for (size_t i = 0; i < layer_size; i++)
            stray += ((const float *)pool.c)[b * per_block + i] != 0;
    printf("%-52s %d values stored in layer 0 %s\n", "kv_store padding rows (slot -1)", stray,
           stray ? "FAIL" : "ok");
    failures += stray > 0;
    weft_paged_layout lc = {N_SEQS, TQ, MAX_BLOCKS, cq.c, pos.c, tab.c};
    weft_paged_layout lg = {N_SEQS, TQ, MAX_BLOCKS, cq.g, pos.g, tab.g};
    cpu->paged_attention(cpu, q.c, &pc, 1, &lc, out.c, lse.c, H, KV, D);
    gpu->paged_attention(gpu, q.g, &pg, 1, &lg, out.g, lse.g, H, KV, D);
    snprintf(name, sizeof name, "paged_attention H%d KV%d D%d bs%d out", H, KV, D, bs);
    compare(name, &out, BF16_TOL);
    snprintf(name, sizeof name, "paged_attention H%d KV%d D%d bs%d lse", H, KV, D, bs);
    compare(name, &lse, 1e-5); // fp32 on bf16-exact inputs on both sides
    release(&pool), release(&k), release(&v), release(&q), release(&out), release(&lse);
    release_ints(&slots), release_ints(&cq), release_ints(&pos), release_ints(&tab);
}

// Rows of sequence s of a decode batch's paged attention (out `batch`, lse `batch_lse` (H, n))
// against s alone, on the GPU: how many of its outputs and log-sum-exps differ in any bit.
static int paged_rows_alone(const twin *q, const weft_kv_pool *pool, const int32_t *tables,
                            const int *lens, int s, int n, int max_blocks, const uint16_t *batch,
                            const float *batch_lse, int H, int KV, int D) {
    int32_t cu[2] = {0, 1}, pos = lens[s] - 1;
    ints cq = upload_ints(cu, 2), qp = upload_ints(&pos, 1);
    ints tab = upload_ints(tables + (size_t)s * max_blocks, max_blocks);
    twin out = zeros((size_t)H * D, WEFT_BF16), lse = zeros(H, WEFT_F32);
    weft_paged_layout alone = {1, 1, max_blocks, cq.g, qp.g, tab.g};
    size_t row = (size_t)H * D * sizeof(uint16_t);
    gpu->paged_attention(gpu, (const char *)q->g + s * row, pool, 0, &alone, out.g, lse.g, H, KV,
                         D);
    uint16_t *got = weft_alloc(row);
    float *got_lse = weft_alloc(sizeof(float) * H);
    gpu->to_host(gpu, got, out.g, row);
    gpu->to_host(gpu, got_lse, lse.g, sizeof(float) * H);
    int differ = 0;
    for (int i = 0; i < H * D; i++) differ += got[i] != batch[(size_t)s * H * D + i];
    for (int h = 0; h < H; h++) differ += memcmp(&got_lse[h], &batch_lse[h * n + s], 4) != 0;
    weft_free(got), weft_free(got_lse);
    release(&out), release(&lse), release_ints(&cq), release_ints(&qp), release_ints(&tab);
    return differ;
}

// With batch_invariant on, a decode batch's paged attention gives each sequence's rows the bits
// it gets alone, where the launcher's own splits differ: block tables 4,096 keys wide, so 24
// sequences would split a 300-key one once and alone it would take 3 splits of 128; the mode
// splits at 256 both ways. The default kernels' count is printed beside it, not checked.
static void test_paged_rows_alone(int H, int KV, int D) {
    enum { N_SEQS = 24, BS = 16, MAX_BLOCKS = 256 };
    int lens[N_SEQS], n_blocks = 0, width = KV * D;
    static int32_t tables[N_SEQS * MAX_BLOCKS];
    int32_t cu_q[N_SEQS + 1] = {0}, q_pos[N_SEQS];
    for (int s = 0; s < N_SEQS; s++) {
        lens[s] = 20 + 13 * s; // up to 319 keys
        for (int j = 0; j < MAX_BLOCKS; j++)
            tables[s * MAX_BLOCKS + j] = j < (lens[s] + BS - 1) / BS ? n_blocks++ : 0;
        cu_q[s + 1] = s + 1, q_pos[s] = lens[s] - 1;
    }
    twin pool = act((size_t)n_blocks * 2 * BS * width, 1), q = act((size_t)N_SEQS * H * D, 1);
    twin out = zeros((size_t)N_SEQS * H * D, WEFT_BF16), lse = zeros((size_t)N_SEQS * H, WEFT_F32);
    ints cq = upload_ints(cu_q, N_SEQS + 1), qp = upload_ints(q_pos, N_SEQS);
    ints tab = upload_ints(tables, N_SEQS * MAX_BLOCKS);
    weft_kv_pool pg = {pool.g, n_blocks, 1, BS, width};
    weft_paged_layout all = {N_SEQS, N_SEQS, MAX_BLOCKS, cq.g, qp.g, tab.g};
    size_t bytes = (size_t)N_SEQS * H * D * sizeof(uint16_t);
    uint16_t *batch = weft_alloc(bytes);
    float *batch_lse = weft_alloc(sizeof(float) * N_SEQS * H);
    int differ[2] = {0, 0};
    for (int on = 0; on < 2; on++) {
        gpu->batch_invariant(gpu, on);
        gpu->paged_attention(gpu, q.g, &pg, 0, &all, out.g, lse.g, H, KV, D);
        gpu->to_host(gpu, batch, out.g, bytes);
        gpu->to_host(gpu, batch_lse, lse.g, sizeof(float) * N_SEQS * H);
        for (int s = 0; s < N_SEQS; s += 5)
            differ[on] += paged_rows_alone(&q, &pg, tables, lens, s, N_SEQS, MAX_BLOCKS, batch,
                                           batch_lse, H, KV, D);
    }
    gpu->batch_invariant(gpu, false);
    char name[96];
    snprintf(name, sizeof name, "paged_attention invariant H%d KV%d D%d", H, KV, D);
    printf("%-52s %d values differ from the sequence alone (default kernels: %d) %s\n", name,
           differ[1], differ[0], differ[1] ? "FAIL" : "ok");
    failures += differ[1] != 0;
    weft_free(batch), weft_free(batch_lse);
    release(&pool), release(&q), release(&out), release(&lse);
    release_ints(&cq), release_ints(&qp), release_ints(&tab);
}

// GPU copies of two tensors alike, printed as a check: the fused op's bits against the ops apart.
static void expect_same_bits(const char *what, const twin *a, const twin *b) {
    bool same = same_bits(a, b);
    printf("%-52s %s\n", what, same ? "ok" : "FAIL");
    failures += !same;
}

// The device draws (sample_tokens, the GPU's alone: the CPU draws on the host) greedy and at a
// temperature from rows of logits: each drawn token's log-prob in the bits the logprobs op gives
// its row, gathered, and greedy's token the first largest logit. Run on hardware by the device
// session's ops step, where the two kernels' codegen could differ as the emulator's cannot.
static void test_device_draws(float temperature) {
    enum { T = 6, V = 5000, N = 4 };
    twin logits = act((size_t)T * V, 3), gathered = zeros((size_t)N * V, WEFT_BF16);
    twin logp = zeros(N, WEFT_F32), want = zeros(N, WEFT_F32), processed = zeros(N, WEFT_F32);
    int32_t rows[N] = {5, 0, 3, 5};
    double u[N] = {0.0, 0.3, 0.7, 0.999};
    ints r = upload_ints(rows, N), tokens = upload_ints(rows, N);
    double *u_g = gpu->alloc(gpu, sizeof u);
    gpu->to_device(gpu, u_g, u, sizeof u);
    gpu->sample_tokens(gpu, logits.g, r.g, u_g, N, V, temperature, tokens.g, logp.g,
                       processed.g);
    gpu->embedding_forward(gpu, r.g, logits.g, gathered.g, N, V); // a row gather
    gpu->logprobs(gpu, gathered.g, tokens.g, want.g, NULL, NULL, N, V);
    char what[64];
    snprintf(what, sizeof what, "sample_tokens T %.1f log-probs = logprobs op's", temperature);
    expect_same_bits(what, &logp, &want);
    int32_t drawn[N];
    gpu->to_host(gpu, drawn, tokens.g, sizeof drawn);
    int wrong = 0;
    for (int d = 0; d < N && temperature == 0; d++) {
        const float *row = logits.host + (size_t)rows[d] * V;
        int arg = 0;
        for (int j = 1; j < V; j++) arg = row[j] > row[arg] ? j : arg;
        wrong += drawn[d] != arg;
    }
    if (temperature == 0) {
        printf("%-52s %d of %d differ %s\n", "sample_tokens greedy: the first largest logit",
               wrong, N, wrong ? "FAIL" : "ok");
        failures += wrong > 0;
    }
    gpu->free(gpu, u_g);
    release(&logits), release(&gathered), release(&logp), release(&want), release(&processed);
    release_ints(&r), release_ints(&tokens);
}

// A forward-only pass's products of normalized rows: norm_product (q|k|v with a bias, and the
// MLP's SwiGLU) and a decode step's q|k|v that stores its rows (norm_product_store, RoPE on the q
// and k heads, keys and values to the pool, a padding row storing nothing). Against the CPU's
// separate ops, and on the GPU the bits of its own separate ops (rmsnorm_forward, then matmul,
// swiglu_product or split_store), which is what lets a decode step fold them.
static void test_norm_products(int rows, int H, int KV, int D, int C) {
    enum { BLOCKS = 8, LAYERS = 2, BS = 16, WIDTH = 40 };
    int qd = H * D, kvd = KV * D, N = qd + 2 * kvd;
    float eps = 1e-6f, table[64];
    int32_t slot[8], p[8];
    for (int t = 0; t < rows; t++)
        slot[t] = t == 2 ? -1 : (t * 11 + 5) % (BLOCKS * BS);
    for (int t = 0; t < rows; t++)
        p[t] = 17 + 131 * t;
    for (int i = 0; i < D / 2; i++)
        table[i] = (float)pow(1e4, -2.0 * i / D);
    ints slots = upload_ints(slot, rows), pos = upload_ints(p, rows);
    twin freq = make(D / 2, WEFT_F32, 0, false);
    cpu->to_device(cpu, freq.c, table, sizeof(float) * (D / 2));
    gpu->to_device(gpu, freq.g, table, sizeof(float) * (D / 2));
    twin x = act((size_t)rows * C, 2), g = act(C, 1), w = act((size_t)N * C, 1), b = act(N, 1);
    twin wg = act((size_t)2 * WIDTH * C, 1), normed = zeros((size_t)rows * C, WEFT_BF16);
    twin rstd = zeros(rows, WEFT_F32), fused = zeros((size_t)rows * N, WEFT_BF16);
    twin folded = zeros((size_t)rows * N, WEFT_BF16),
         act_out = zeros((size_t)rows * WIDTH, WEFT_BF16);
    twin act_folded = zeros((size_t)rows * WIDTH, WEFT_BF16),
         gate_up = zeros((size_t)rows * 2 * WIDTH, WEFT_BF16);
    weft_matmul_types tc = {WEFT_F32, WEFT_F32, WEFT_F32}, tg = {WEFT_BF16, WEFT_BF16, WEFT_BF16};
    char name[96];
    // The ops apart, on both backends.
    cpu->rmsnorm_forward(cpu, x.c, g.c, eps, normed.c, rstd.c, rows, C);
    gpu->rmsnorm_forward(gpu, x.g, g.g, eps, normed.g, rstd.g, rows, C);
    cpu->matmul(cpu, false, true, rows, N, C, 1.0f, normed.c, C, w.c, C, 0.0f, NULL, b.c, fused.c,
                N, tc);
    gpu->matmul(gpu, false, true, rows, N, C, 1.0f, normed.g, C, w.g, C, 0.0f, NULL, b.g, fused.g,
                N, tg);
    cpu->swiglu_product(cpu, normed.c, wg.c, gate_up.c, act_out.c, rows, C, WIDTH);
    gpu->swiglu_product(gpu, normed.g, wg.g, gate_up.g, act_out.g, rows, C, WIDTH);
    // Folded: norm_product, against the CPU's ops apart and the GPU's bits apart.
    weft_norm_product np = {
        .x = x.g, .norm_w = g.g, .w = w.g, .bias = b.g, .eps = eps, .rows = rows, .C = C};
    weft_norm_product np_mlp = {
        .x = x.g, .norm_w = g.g, .w = wg.g, .bias = NULL, .eps = eps, .rows = rows, .C = C};
    bool took = gpu->norm_product(gpu, &np, folded.g, N, false) &&
                gpu->norm_product(gpu, &np_mlp, act_folded.g, WIDTH, true);
    cpu->copy(cpu, folded.c, fused.c, sizeof(float) * rows * N);
    cpu->copy(cpu, act_folded.c, act_out.c, sizeof(float) * rows * WIDTH);
    snprintf(name, sizeof name, "norm_product rows=%d N=%d C=%d", rows, N, C);
    compare(name, &folded, BF16_TOL);
    expect_same_bits("  the bits of rmsnorm_forward, then matmul", &folded, &fused);
    snprintf(name, sizeof name, "norm_product swiglu rows=%d width=%d C=%d", rows, WIDTH, C);
    compare(name, &act_folded, BF16_TOL);
    expect_same_bits("  the bits of rmsnorm_forward, then swiglu_product", &act_folded, &act_out);
    // Stored: norm_product_store against split_store of the product, on both backends.
    twin q_apart = zeros((size_t)rows * qd, WEFT_BF16), q = zeros((size_t)rows * qd, WEFT_BF16);
    twin k = zeros((size_t)rows * kvd, WEFT_BF16), v = zeros((size_t)rows * kvd, WEFT_BF16);
    size_t pool_n = (size_t)BLOCKS * LAYERS * 2 * BS * kvd;
    twin pool_apart = zeros(pool_n, WEFT_BF16), pool = zeros(pool_n, WEFT_BF16);
    weft_column_parts pc = {{q.c, k.c, v.c}, {qd, kvd, kvd}, 3},
                      pg = {{q_apart.g, k.g, v.g}, {qd, kvd, kvd}, 3};
    weft_rope_rows rc = {pos.c, freq.c, 0.9f, H + KV, D}, rg = {pos.g, freq.g, 0.9f, H + KV, D};
    weft_kv_pool kc = {pool.c, BLOCKS, LAYERS, BS, kvd},
                 kg = {pool_apart.g, BLOCKS, LAYERS, BS, kvd};
    cpu->split_store(cpu, fused.c, &pc, rows, &rc, &kc, 1, slots.c);
    gpu->split_store(gpu, fused.g, &pg, rows, &rg, &kg, 1, slots.g);
    pg.part[0] = q.g, kg.data = pool.g;
    took = took && gpu->norm_product_store(gpu, &np, folded.g, &pg, &rg, &kg, 1, slots.g);
    printf("%-52s %s\n", "norm_product(_store) taken at these rows", took ? "ok" : "FAIL");
    failures += !took;
    snprintf(name, sizeof name, "norm_product_store rows=%d H%d KV%d D%d q", rows, H, KV, D);
    compare(name, &q, BF16_TOL);
    twin as_rows = pool;
    as_rows.c = cpu_pool_as_rows(pool.c, BLOCKS, LAYERS, BS, kvd);
    snprintf(name, sizeof name, "norm_product_store rows=%d H%d KV%d D%d pool", rows, H, KV, D);
    compare(name, &as_rows, BF16_TOL);
    weft_free(as_rows.c);
    expect_same_bits("  q: the bits of the product, then split_store", &q, &q_apart);
    expect_same_bits("  pool: the bits of the product, then split_store", &pool, &pool_apart);
    twin *all[] = {&freq, &x,     &g,      &w,          &b,          &wg,      &normed,
                   &rstd, &fused, &folded, &act_out,    &act_folded, &gate_up, &q_apart,
                   &q,    &k,     &v,      &pool_apart, &pool};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        release(all[i]);
    release_ints(&slots), release_ints(&pos);
}

int main(void) {
#if defined(WEFT_TEST_EMULATED) // the emulated backend (CMakeLists.txt): the long shapes take minutes
    const bool emulated = true;
#else
    const bool emulated = false;
#endif
    if (weft_cuda_device_count() == 0) {
        printf("no CUDA GPU visible: skipped\n");
        return 77;
    }
    cpu = weft_backend_cpu_create();
    gpu = weft_backend_cuda_create(0);
    weft_rng_seed(&rng, 20261121);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) test_matmul(ta, tb, false, false);
    test_matmul(true, false, true, false); // the dW product
    test_matmul(false, true, false, true); // a projection onto the residual stream
    test_projection(1, 1030, 136, false);     // 4 columns a block
    test_projection(3, 48, 72, false);        // one column a block, rows rounded up to 4
    test_projection(2, 64, 4104, true);       // several chunks per thread; onto a residual
    test_projection(5, 1100, 64, true);       // rows rounded up to 8, 2 columns a block
    test_projection(8, 40, 264, false);
    test_swiglu_product(1, 1030, 136); // the fused kernel: 4 columns (and 4 ups) a block
    test_swiglu_product(6, 40, 264);   // rows rounded up to 8, one column a block
    test_swiglu_product(11, 72, 64);   // skinny: 32 gates and their ups a block
    test_swiglu_product(40, 1024, 1024); // skinny, K in 8 splits
    test_swiglu_product(70, 72, 64);   // more rows than either kernel takes: the two ops
    test_projection(4, 2048, 1024, false);    // the 1B model's q projection, 4 sequences
    test_projection(9, 40, 64, false);        // skinny: one row tile, a partial block of columns
    test_projection(16, 48, 96, true);        // onto a residual, 3 chunks (one warp in 8 has work)
    test_projection(33, 1030, 544, false);    // 3 row tiles, K in 4 splits, a partial block
    test_projection(64, 2048, 1024, true);    // the 1B model's output projection at batch 64: 8
                                            // splits of K
    gpu->batch_invariant(gpu, invariant = true);
    test_projection(3, 1030, 544, false);    // few rows' range, on skinny.cu
    test_projection(150, 136, 96, true);     // 3 blocks of 64 rows, the last partial
    test_projection(200, 2048, 1024, false); // 8 splits of K: launches of 16 row blocks at most
    test_swiglu_product(150, 72, 64);        // and the two ops, alike
    gpu->batch_invariant(gpu, invariant = false);
    test_embedding();
    test_rmsnorm();
    test_bias();
    test_rope();
    test_split_columns();
    test_swiglu_add_scale_sums();
    test_cross_entropy();
    test_head_ops();
    test_device_draws(0.0f);
    test_device_draws(0.8f);
    test_adamw();
    test_paged(4, 2, 32, 16);
    test_paged_rows_alone(4, 2, 64);  // the tensor-core kernel
    test_paged_rows_alone(4, 2, 32);  // the lane-per-key one
    test_paged(8, 2, 128, 32);
    test_paged(4, 4, 40, 16);
    test_norm_products(1, 4, 2, 32, 136); // two RoPE pairs a block
    test_norm_products(5, 4, 2, 20, 64);  // rows rounded up to 8: one pair a block
    test_norm_products(3, 2, 1, 6, 64);   // D % 4 == 2: one pair a block
    weft_backend_destroy(gpu);
    // cuBLASLt splitting K where the tiles leave SMs idle (WEFT_CUDA_GEMM_SPLIT_K=1, off by
    // default): a decode step's product past skinny.cu's rows, onto the residual, and a wide one.
    setenv("WEFT_CUDA_GEMM_SPLIT_K", "1", 1);
    gpu = weft_backend_cuda_create(0);
    test_projection(100, 256, 2048, true);
    test_projection(256, 640, 1024, false);
    unsetenv("WEFT_CUDA_GEMM_SPLIT_K");
    weft_backend_destroy(gpu);
    // skinny.cu past 64 rows (WEFT_CUDA_SKINNY_ROWS=256): a batch-256 decode step's products.
    setenv("WEFT_CUDA_SKINNY_ROWS", "256", 1);
    gpu = weft_backend_cuda_create(0);
    skinny_rows = 256;
    test_projection(256, 640, 1024, true);
    test_swiglu_product(200, 72, 256);
    skinny_rows = 64;
    unsetenv("WEFT_CUDA_SKINNY_ROWS");
    weft_backend_destroy(gpu);
    // Every attention kernel family the GPU has, each on a backend of its own (hopper: 128-row,
    // 128-key tiles, so the longer documents span several; its backward both ways; its forward
    // and dQ kernel in 192-row blocks at head_dim 64).
    const struct {
        const char *name, *kernels, *dq, *rows;
    } families[] = {{"mma", "mma", "recompute", "128"},
                    {"simt", "simt", "recompute", "128"},
                    {"hopper", "hopper", "recompute", "128"},
                    {"hopper-ordered", "hopper", "ordered", "128"},
                    {"hopper-192", "hopper", "recompute", "192"}};
    bool hopper_gpu = weft_cuda_compute_capability(0) / 10 == 9;
    int n_families = hopper_gpu ? 5 : 2;
    const int mixed[] = {1, 33, 5, 70, 2}, single[] = {100}, long_docs[] = {150, 7, 90};
    const int tiles[] = {300, 7, 190}, long_ones[] = {3000, 1100};
    for (int f = 0; f < n_families; f++) {
        family = families[f].name;
        setenv("WEFT_CUDA_ATTENTION", families[f].kernels, 1);
        setenv("WEFT_CUDA_ATTENTION_DQ", families[f].dq, 1);
        setenv("WEFT_CUDA_ATTENTION_ROWS", families[f].rows, 1);
        gpu = weft_backend_cuda_create(0);
        if (f >= 2 && !emulated) { // blocks in many waves, taking turns at the same dQ rows
            attention_whole("[3000,1100] H16 KV4 D128", 16, 4, 128, long_ones, 2);
            attention_whole("[3000,1100] H16 KV4 D64", 16, 4, 64, long_ones, 2);
        }
        attention_whole("[1,33,5,70,2] H4 KV2 D16", 4, 2, 16, mixed, 5);
        attention_whole("[1,33,5,70,2] H6 KV2 D64", 6, 2, 64, mixed, 5);
        attention_whole("[100] H2 KV1 D128", 2, 1, 128, single, 1);
        attention_whole("[1,33,5,70,2] H2 KV2 D80", 2, 2, 80, mixed, 5);
        attention_whole("[150,7,90] H2 KV1 D32", 2, 1, 32, long_docs, 3);
        attention_whole("[300,7,190] H2 KV1 D64", 2, 1, 64, tiles, 3);
        attention_cp_chunks();
        weft_backend_destroy(gpu);
    }
    weft_backend_destroy(cpu);
    printf("%d op comparison%s over tolerance\n", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
