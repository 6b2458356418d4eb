// Every op of the CUDA backend (bf16 storage, fp32 math) against the CPU backend (fp32) on the
// same inputs: the inputs are rounded to bf16 first, so the difference is the CUDA op's own
// rounding. Tolerance: max|cuda - cpu| / max|cpu| <= 2e-2 per output (bf16 keeps 8 bits, 4e-3
// relative per stored value; outputs built from long sums of such values reach about 1e-2).
// fp32 outputs computed in fp32 from bf16-exact inputs (gradients accumulated into f32, rstd,
// reductions, AdamW) get 1e-4 or tighter.
// Needs a GPU: exits 77 (skipped) where none is visible, so a CPU-only CI reports it skipped.
#include "rollout/sampling.h"
#include "twin_attention_checks.h"

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


// The host's draws (weft_sample_token) of rows[d] of logits (., V) at u[d] against the device's.
static void host_draws_agree(const float *logits, const int32_t *rows, const double *u,
                             const int32_t *drawn, int n, int V, float temperature,
                             const weft_draw_filters *f) {
    weft_sampling_config c = {.temperature = temperature, .top_k = f->top_k, .top_p = f->top_p,
                              .min_p = f->min_p};
    void *scratch = weft_alloc(weft_sampling_scratch_bytes(V));
    int wrong = 0;
    for (int d = 0; d < n; d++)
        wrong += weft_sample_token(&c, logits + (size_t)rows[d] * V, V, u[d], NULL, scratch) !=
                 drawn[d];
    weft_free(scratch);
    char what[64];
    snprintf(what, sizeof what, "sample_tokens top_k %d top_p %.2f min_p %.2f = host's", f->top_k,
             f->top_p, f->min_p);
    printf("%-52s %d of %d differ %s\n", what, wrong, n, wrong ? "FAIL" : "ok");
    failures += wrong > 0;
}

// The device draws (sample_tokens, the GPU's alone: the CPU draws on the host) greedy and at a
// temperature from rows of logits: each drawn token's log-prob in the bits the logprobs op gives
// its row, gathered, and greedy's token the first largest logit; with filters, the token the
// host's sampling (rollout/sampling.c, the CPU's path) draws at the same u. Run on hardware by the device
// session's ops step, where the two kernels' codegen could differ as the emulator's cannot.
static void test_device_draws(float temperature, const weft_draw_filters *filters) {
    enum { T = 6, V = 5000, N = 4 };
    twin logits = act((size_t)T * V, 3), gathered = zeros((size_t)N * V, WEFT_BF16);
    twin logp = zeros(N, WEFT_F32), want = zeros(N, WEFT_F32), processed = zeros(N, WEFT_F32);
    int32_t rows[N] = {5, 0, 3, 5};
    double u[N] = {0.0, 0.3, 0.7, 0.999};
    ints r = upload_ints(rows, N), tokens = upload_ints(rows, N);
    double *u_g = gpu->alloc(gpu, sizeof u);
    gpu->to_device(gpu, u_g, u, sizeof u);
    gpu->sample_tokens(gpu, logits.g, r.g, u_g, N, V, temperature, filters, tokens.g, logp.g,
                       processed.g);
    gpu->embedding_forward(gpu, r.g, logits.g, gathered.g, N, V); // a row gather
    gpu->logprobs(gpu, gathered.g, tokens.g, want.g, NULL, NULL, N, V);
    char what[64];
    snprintf(what, sizeof what, "sample_tokens T %.1f log-probs = logprobs op's", temperature);
    expect_same_bits(what, &logp, &want);
    int32_t drawn[N];
    gpu->to_host(gpu, drawn, tokens.g, sizeof drawn);
    // What the rollout does for draws on the host: the drawn rows' normalizers, then one f32
    // subtraction a token.
    float lse[N], finished[N], got[N];
    gpu->log_normalizers(gpu, gathered.g, want.g, N, V); // want's logprobs no longer needed
    gpu->to_host(gpu, lse, want.g, sizeof lse);
    gpu->to_host(gpu, got, logp.g, sizeof got);
    for (int d = 0; d < N; d++)
        finished[d] = -(lse[d] - logits.host[(size_t)rows[d] * V + drawn[d]]);
    bool same = !memcmp(finished, got, sizeof got);
    printf("%-52s %s\n", temperature == 0 ? "log_normalizers finish logprobs' bits"
                                          : "log_normalizers finish logprobs' bits (T > 0)",
           same ? "ok" : "FAIL");
    failures += !same;
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
    if (filters) host_draws_agree(logits.host, rows, u, drawn, N, V, temperature, filters);
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
    test_device_draws(0.0f, NULL);
    test_device_draws(0.8f, NULL);
    test_device_draws(0.8f, &(weft_draw_filters){.top_k = 40, .top_p = 0.9, .min_p = 0.01});
    test_device_draws(1.2f, &(weft_draw_filters){.top_p = 0.5});
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
    test_attention_families(emulated);
    weft_backend_destroy(cpu);
    printf("%d op comparison%s over tolerance\n", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
