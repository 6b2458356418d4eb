// The CUDA op test's attention checks (test_cuda_ops_match_cpu.c): varlen attention forward and
// backward on whole documents and context-parallel chunks, and the paged KV cache's store and
// attention, against the CPU backend on the fixtures of twin_backends.h. One test program
// includes it.
#pragma once
#include "twin_backends.h"

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

// Every attention kernel family the GPU has, each on a backend of its own (hopper: 128-row,
// 128-key tiles, so the longer documents span several; its backward both ways; its forward
// and dQ kernel in 192-row blocks at head_dim 64).
static void test_attention_families(bool emulated) {
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
}
