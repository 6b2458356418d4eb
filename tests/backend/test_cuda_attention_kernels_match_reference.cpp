// The attention kernels of the CUDA backend, launchers included, run unchanged on the CPU through
// cuda_emulation.h, match a float64 reference: both training families and the Hopper one (fp32,
// mma.sync, TMA/wgmma with either dQ) on whole documents, documents spanning several tiles and
// blocks, and context-parallel chunks, forward and backward; and the paged KV cache's store and
// attention (shuffled and shared blocks, decoding and prefill continuations, grouped-query heads,
// split keys). Each case runs with asynchronous copies landing as late and as early as the
// hardware allows. The other kernels: test_cuda_kernels_match_reference.cpp.
#include "kernel_reference.h"

namespace {

// ---------------------------------------------------------------------------- attention ----

struct layout {
    std::string label;
    int H, KV, D;
    std::vector<int32_t> cu_q, cu_kv, q_pos;
    int n_docs() const { return (int)cu_q.size() - 1; }
    int Tq() const { return cu_q.back(); }
    int Tkv() const { return cu_kv.back(); }
};

// Whole documents: queries and keys are the same rows.
layout whole(const char *label, int H, int KV, int D, std::vector<int> lens) {
    layout l{label, H, KV, D, {0}, {0}, {}};
    for (int len : lens) {
        for (int i = 0; i < len; i++) l.q_pos.push_back(i);
        l.cu_q.push_back(l.cu_q.back() + len);
    }
    l.cu_kv = l.cu_q;
    return l;
}

// Context parallelism: this rank's queries are chunks rank and 2·world-1-rank of each document
// (lengths divisible by 2·world); the keys are the whole document.
layout cp_chunks(const char *label, int H, int KV, int D, std::vector<int> lens, int rank,
                 int world) {
    layout l{label, H, KV, D, {0}, {0}, {}};
    for (int len : lens) {
        int chunk = len / (2 * world);
        for (int c : {rank, 2 * world - 1 - rank})
            for (int i = 0; i < chunk; i++) l.q_pos.push_back(c * chunk + i);
        l.cu_q.push_back(l.cu_q.back() + 2 * chunk);
        l.cu_kv.push_back(l.cu_kv.back() + len);
    }
    return l;
}

struct attention_ref {
    std::vector<double> out, lse, dq, dk, dv;
};

// float64 attention: out (Tq, H, D), lse (H, Tq); from dout, dq (Tq, H, D), dk and dv (Tkv, KV, D).
attention_ref attend(const layout &l, const std::vector<double> &q, const std::vector<double> &k,
                     const std::vector<double> &v, const std::vector<double> &dout) {
    int H = l.H, KV = l.KV, D = l.D, Tq = l.Tq(), Tkv = l.Tkv();
    double scale = 1.0 / sqrt((double)D);
    attention_ref r{std::vector<double>((size_t)Tq * H * D), std::vector<double>((size_t)H * Tq),
                    std::vector<double>((size_t)Tq * H * D),
                    std::vector<double>((size_t)Tkv * KV * D),
                    std::vector<double>((size_t)Tkv * KV * D)};
    for (int d = 0; d < l.n_docs(); d++)
        for (int i = l.cu_q[d]; i < l.cu_q[d + 1]; i++)
            for (int h = 0; h < H; h++) {
                int g = h / (H / KV), j0 = l.cu_kv[d], n = l.q_pos[i] + 1;
                size_t qi = ((size_t)i * H + h) * D;
                std::vector<double> s(n), dp(n);
                double mx = -INFINITY, sum = 0, delta = 0;
                for (int j = 0; j < n; j++) {
                    size_t kj = ((size_t)(j0 + j) * KV + g) * D;
                    s[j] = dp[j] = 0;
                    for (int e = 0; e < D; e++) {
                        s[j] += q[qi + e] * k[kj + e] * scale;
                        dp[j] += dout[qi + e] * v[kj + e];
                    }
                    mx = std::max(mx, s[j]);
                }
                for (int j = 0; j < n; j++) sum += exp(s[j] - mx);
                double lse = mx + log(sum);
                r.lse[(size_t)h * Tq + i] = lse;
                for (int j = 0; j < n; j++) {
                    double p = exp(s[j] - lse);
                    delta += p * dp[j];
                    for (int e = 0; e < D; e++)
                        r.out[qi + e] += p * v[((size_t)(j0 + j) * KV + g) * D + e];
                }
                for (int j = 0; j < n; j++) {
                    double p = exp(s[j] - lse), ds = p * (dp[j] - delta);
                    size_t kj = ((size_t)(j0 + j) * KV + g) * D;
                    for (int e = 0; e < D; e++) {
                        r.dq[qi + e] += scale * ds * k[kj + e];
                        r.dk[kj + e] += scale * ds * q[qi + e];
                        r.dv[kj + e] += p * dout[qi + e];
                    }
                }
            }
    return r;
}

// The attention kernel families: fp32, tensor-core mma.sync, and Hopper's (TMA, wgmma), whose
// backward recomputes dQ in a kernel of its own (HOPPER) or sums it in its dK/dV kernel in a
// fixed order (HOPPER_ORDERED), and whose forward and dQ kernel may take 192 query rows a block
// at head_dim 64 (HOPPER_192, three consumer warpgroups).
enum attention_kind { SIMT, MMA, HOPPER, HOPPER_ORDERED, HOPPER_192 };

// That the launches since emu::g_widest_block was zeroed had blocks of at most `threads`
// threads, and one of exactly that many: the variant of the kernel the test means to check ran.
void expect_widest_block(const std::string &what, unsigned threads) {
    bool ok = emu::g_widest_block == threads;
    printf("%-76s %s (%u threads a block, expected %u)\n", what.c_str(), ok ? "ok" : "FAIL",
           emu::g_widest_block, threads);
    failures += !ok;
}

// One layout through one kernel family, the way cuda.c calls it: forward, delta, backward.
void test_attention(const layout &l, attention_kind kind, const char *note = "") {
    int H = l.H, KV = l.KV, D = l.D, Tq = l.Tq(), Tkv = l.Tkv();
    std::vector<bf16> q = random_bf16((size_t)Tq * H * D), k = random_bf16((size_t)Tkv * KV * D);
    std::vector<bf16> v = random_bf16((size_t)Tkv * KV * D), dout = random_bf16((size_t)Tq * H * D);
    attention_ref want = attend(l, widen(q), widen(k), widen(v), widen(dout));
    weft_cuda_attention_args a = {l.n_docs(), Tq, Tkv, H, KV, D,
                                  l.cu_q.data(), l.cu_kv.data(), l.q_pos.data()};
    std::vector<bf16> out(q.size(), NAN_BF16), dq(q.size(), NAN_BF16);
    std::vector<bf16> dk(k.size(), NAN_BF16), dv(v.size(), NAN_BF16);
    std::vector<float> lse((size_t)H * Tq, NAN), delta((size_t)H * Tq, NAN);
    bool hopper = kind >= HOPPER, ordered = kind == HOPPER_ORDERED;
    size_t scratch_bytes = hopper ? weft_cuda_attention_hopper_scratch_bytes(&a, ordered)
                                  : weft_cuda_attention_partials_bytes(&a);
    std::vector<float> partials(scratch_bytes / sizeof(float), NAN);
    const char *family = kind == SIMT ? "simt   " : kind == MMA ? "mma    " : "hopper ";
    std::string name = std::string("attention/") + family + l.label + note +
                       (ordered ? " (ordered dq)" : kind == HOPPER_192 ? " (192 rows)" : "");
    // Hopper's forward and dQ kernel: a producer warpgroup and a consumer per 64 rows of a block.
    unsigned hopper_threads = kind == HOPPER_192 && D == 64 ? 512 : 384;
    emu::g_widest_block = 0;
    if (hopper) {
        if (!weft_cuda_attention_hopper_covers(&a) ||
            !weft_cuda_attention_forward_hopper(queue, &a, q.data(), k.data(), v.data(),
                                                out.data(), lse.data(),
                                                kind == HOPPER_192 ? 192 : 128)) {
            printf("%-76s FAIL: the hopper forward refused it\n", name.c_str());
            failures++;
            return;
        }
    } else if (kind == MMA) {
        weft_cuda_attention_forward_mma(queue, &a, q.data(), k.data(), v.data(), out.data(),
                                        lse.data());
    } else {
        weft_cuda_attention_forward_simt(queue, &a, q.data(), k.data(), v.data(), out.data(),
                                         lse.data());
    }
    if (hopper) expect_widest_block(name + " forward's blocks", hopper_threads);
    weft_cuda_attention_delta(queue, out.data(), dout.data(), delta.data(), Tq, H, D);
    emu::g_widest_block = 0;
    if (kind == SIMT) {
        weft_cuda_attention_backward_simt(queue, &a, q.data(), k.data(), v.data(), lse.data(),
                                          dout.data(), delta.data(), dq.data(), dk.data(),
                                          dv.data());
    } else if (hopper) {
        if (!weft_cuda_attention_backward_hopper(queue, &a, q.data(), k.data(), v.data(),
                                                 lse.data(), dout.data(), delta.data(), dq.data(),
                                                 dk.data(), dv.data(), partials.data(), ordered,
                                                 kind == HOPPER_192 ? 192 : 128)) {
            printf("%-76s FAIL: the hopper backward refused it\n", name.c_str());
            failures++;
            return;
        }
    } else {
        weft_cuda_attention_backward_mma(queue, &a, q.data(), k.data(), v.data(), lse.data(),
                                         dout.data(), delta.data(), dq.data(), dk.data(),
                                         dv.data(), partials.data());
    }
    if (hopper) expect_widest_block(name + " backward's blocks", hopper_threads);
    compare(name + " out", out, want.out, BF16_TOL);
    compare(name + " lse", lse, want.lse, F32_TOL);
    compare(name + " dq", dq, want.dq, BF16_TOL);
    compare(name + " dk", dk, want.dk, BF16_TOL);
    compare(name + " dv", dv, want.dv, BF16_TOL);
}

// -------------------------------------------------------------------------- paged KV cache ----

// A pool (n_blocks, layers, 2, block_size, width) bf16, indexed here as the kernels.h comment
// says, independently of the kernels' own arithmetic.
struct pool_shape {
    int n_blocks, layers, block_size, width;
    size_t size() const { return (size_t)n_blocks * layers * 2 * block_size * width; }
    size_t at(int block, int layer, int kv, int offset) const {
        return ((((size_t)block * layers + layer) * 2 + kv) * block_size + offset) * width;
    }
};

// T rows of one layer to scattered slots; everything else in the pool (the other layer, the slots
// not written) stays as it was.
void test_kv_store(int width) {
    pool_shape p{5, 2, 16, width};
    int T = 37, layer = 1;
    std::vector<bf16> pool = random_bf16(p.size()), k = random_bf16((size_t)T * width);
    std::vector<bf16> v = random_bf16((size_t)T * width);
    std::vector<int32_t> slot(T);
    for (int t = 0; t < T; t++) slot[t] = (t * 7 + 3) % (p.n_blocks * p.block_size); // distinct
    std::vector<double> want = widen(pool);
    for (int t = 0; t < T; t++)
        for (int kv = 0; kv < 2; kv++)
            for (int c = 0; c < width; c++)
                want[p.at(slot[t] / p.block_size, layer, kv, slot[t] % p.block_size) + c] =
                    value_of((kv ? v : k)[(size_t)t * width + c]);
    expect_path("kv_store", width, vector_width(width, pool.data(), k.data(), v.data()));
    weft_cuda_kv_store(queue, pool.data(), p.layers, p.block_size, width, layer, slot.data(),
                       k.data(), v.data(), T);
    compare(sized("kv_store pool", width), pool, want, 0.0);
}

// A decode step's split and store in one launch: q|k|v rows of H + KV + KV heads of D split with
// their q and k heads turned and k and v stored in the pool (padding rows, slot -1, nowhere): the
// same bits as the split with its turn followed by kv_store, in q and in every pool entry.
// Rows whose keys and values go to the pool: each row's slot (row `padding` a padding row's -1,
// if there is one) and position, and RoPE's inverse frequencies.
struct stored_rows {
    std::vector<int32_t> slot, pos;
    std::vector<float> inv_freq;
};

stored_rows make_stored_rows(int T, int padding, const pool_shape &p, int D) {
    stored_rows r{std::vector<int32_t>(T), std::vector<int32_t>(T), std::vector<float>(D / 2)};
    for (int t = 0; t < T; t++) {
        r.slot[t] = t == padding ? -1 : (t * 11 + 5) % (p.n_blocks * p.block_size);
        r.pos[t] = 17 + 131 * t;
    }
    for (int i = 0; i < D / 2; i++) r.inv_freq[i] = (float)pow(10000.0, -2.0 * i / D);
    return r;
}

// How many values of a and b differ in any bit.
size_t values_differ(const std::vector<bf16> &a, const std::vector<bf16> &b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], sizeof(bf16)) != 0;
    return n;
}

void test_split_store(int H, int KV, int D) {
    int T = 9, layer = 1, qd = H * D, kvd = KV * D, width = qd + 2 * kvd;
    pool_shape p{6, 3, 16, kvd};
    std::vector<bf16> fused = random_bf16((size_t)T * width), fused_apart = fused;
    std::vector<bf16> pool = random_bf16(p.size()), pool_apart = pool;
    std::vector<bf16> q((size_t)T * qd, NAN_BF16), q_apart = q, k((size_t)T * kvd), v = k;
    stored_rows r = make_stored_rows(T, 4, p, D);
    std::vector<int32_t> &slot = r.slot, &pos = r.pos;
    std::vector<float> &inv_freq = r.inv_freq;
    void *parts[3] = {q_apart.data(), k.data(), v.data()};
    int widths[3] = {qd, kvd, kvd};
    weft_cuda_split_columns(queue, fused_apart.data(), parts, widths, 3, T, false, pos.data(),
                            inv_freq.data(), 0.9f, H + KV, D);
    weft_cuda_kv_store(queue, pool_apart.data(), p.layers, p.block_size, kvd, layer, slot.data(),
                       k.data(), v.data(), T);
    weft_cuda_split_store(queue, fused.data(), q.data(), qd, kvd, T, pos.data(), inv_freq.data(),
                          0.9f, H + KV, D, pool.data(), p.layers, p.block_size, layer,
                          slot.data());
    size_t wrong = values_differ(q, q_apart) + values_differ(pool, pool_apart) +
                   values_differ(fused, fused_apart);
    std::string name = "split_store H" + std::to_string(H) + " KV" + std::to_string(KV) + " D" +
                       std::to_string(D) + " = split (turning), kv_store";
    printf("%-76s %zu values differ %s\n", name.c_str(), wrong, wrong ? "FAIL" : "ok");
    failures += wrong != 0;
}

// A decode step's q|k|v product with its norm folded in, storing its rows as split_store does
// (few_rows.cu's ROPE_STORE): q and the whole pool equal the normed product into fused rows
// followed by split_store, bit for bit (a padding row stores nothing; entries no row writes stay).
void test_normed_store(int M, int H, int KV, int D, int K, bool bias) {
    int layer = 1, qd = H * D, kvd = KV * D, width = qd + 2 * kvd;
    float eps = 1e-6f;
    pool_shape p{6, 3, 16, kvd};
    std::vector<bf16> x = random_bf16((size_t)M * K, -3.0f, 3.0f), g = random_bf16(K, 0.5f, 1.5f);
    std::vector<bf16> w = random_bf16((size_t)width * K), b = random_bf16(width);
    std::vector<bf16> fused((size_t)M * width), pool = random_bf16(p.size()), pool_apart = pool;
    std::vector<bf16> q((size_t)M * qd, NAN_BF16), q_apart = q;
    stored_rows r = make_stored_rows(M, 2, p, D);
    std::vector<int32_t> &slot = r.slot, &pos = r.pos;
    std::vector<float> &inv_freq = r.inv_freq;
    const bf16 *bp = bias ? b.data() : nullptr;
    weft_cuda_few_rows_normed(queue, M, width, K, x.data(), g.data(), eps, w.data(), bp,
                              fused.data(), false);
    weft_cuda_split_store(queue, fused.data(), q_apart.data(), qd, kvd, M, pos.data(),
                          inv_freq.data(), 0.9f, H + KV, D, pool_apart.data(), p.layers,
                          p.block_size, layer, slot.data());
    weft_cuda_few_rows_normed_store(queue, M, K, x.data(), g.data(), eps, w.data(), bp, q.data(),
                                    qd, kvd, pos.data(), inv_freq.data(), 0.9f, H + KV, D,
                                    pool.data(), p.layers, p.block_size, layer, slot.data());
    size_t wrong = values_differ(q, q_apart) + values_differ(pool, pool_apart);
    std::string name = "few_rows normed store M" + std::to_string(M) + " H" + std::to_string(H) +
                       " KV" + std::to_string(KV) + " D" + std::to_string(D) +
                       (bias ? " bias" : "") + " = normed product, split_store";
    printf("%-76s %zu values differ %s\n", name.c_str(), wrong, wrong ? "FAIL" : "ok");
    failures += wrong != 0;
}

// A sequence of the cache: `len` positions, the last `rows` of them queried (1: decoding; more: a
// prefill continuation or a speculative check); its first `shared_blocks` blocks are those of
// sequence `shares` (the n samples of one prompt share the prompt's full blocks).
struct paged_sequence {
    int len, rows, shares = -1, shared_blocks = 0;
};

struct paged_case {
    std::string label;
    int H, KV, D, block_size;
    std::vector<paged_sequence> seqs;
};

// The batch a paged_case describes: block tables drawn from a shuffled list of block ids, with
// every pool entry no row may read (layer 0, positions past a sequence's end in its last block,
// a block that unused table entries point to) NaN, so reading one fails the finite check.
struct paged_batch {
    pool_shape p;
    std::vector<bf16> pool;
    std::vector<int32_t> cu_q{0}, q_pos, tables;
    int max_blocks = 0;
    int Tq() const { return cu_q.back(); }
};

paged_batch make_paged_batch(const paged_case &c) {
    int bs = c.block_size, n_seqs = (int)c.seqs.size(), n_blocks = 1; // block 0: unused entries
    paged_batch b;
    for (const paged_sequence &s : c.seqs) {
        int blocks = (s.len + bs - 1) / bs;
        b.max_blocks = std::max(b.max_blocks, blocks + 1); // a spare entry past the end
        n_blocks += blocks - s.shared_blocks;
    }
    std::vector<int32_t> ids(n_blocks - 1); // 1 .. n_blocks-1, shuffled
    for (int i = 0; i < n_blocks - 1; i++) ids[i] = i + 1;
    for (int i = n_blocks - 2; i > 0; i--)
        std::swap(ids[i], ids[(int)(uniform(0.0f, 0.999f) * (i + 1))]);
    b.p = {n_blocks, 2, bs, c.KV * c.D};
    b.pool = random_bf16(b.p.size());
    b.tables.assign((size_t)n_seqs * b.max_blocks, 0);
    size_t next = 0;
    for (int s = 0; s < n_seqs; s++) {
        const paged_sequence &q = c.seqs[s];
        int32_t *table = &b.tables[(size_t)s * b.max_blocks];
        for (int j = 0; j < (q.len + bs - 1) / bs; j++)
            table[j] = j < q.shared_blocks ? b.tables[(size_t)q.shares * b.max_blocks + j]
                                           : ids[next++];
        for (int i = q.len - q.rows; i < q.len; i++) b.q_pos.push_back(i);
        b.cu_q.push_back(b.cu_q.back() + q.rows);
    }
    std::vector<bool> readable(b.p.size(), false);
    for (int s = 0; s < n_seqs; s++)
        for (int i = 0; i < c.seqs[s].len; i++)
            for (int kv = 0; kv < 2; kv++)
                std::fill_n(readable.begin() +
                                b.p.at(b.tables[(size_t)s * b.max_blocks + i / bs], 1, kv, i % bs),
                            b.p.width, true);
    for (size_t i = 0; i < b.p.size(); i++)
        if (!readable[i]) b.pool[i] = NAN_BF16;
    return b;
}

// float64 attention of every query row over its sequence's positions 0 .. q_pos, read from
// layer 1 of the pool through the block table: out (Tq, H, D), lse (H, Tq).
void paged_reference(const paged_case &c, const paged_batch &b, const std::vector<bf16> &q,
                     std::vector<double> &out, std::vector<double> &lse) {
    int H = c.H, D = c.D, Tq = b.Tq(), bs = c.block_size;
    out.assign((size_t)Tq * H * D, 0.0);
    lse.assign((size_t)H * Tq, 0.0);
    for (size_t s = 0; s < c.seqs.size(); s++) {
        const int32_t *table = &b.tables[s * b.max_blocks];
        for (int r = b.cu_q[s]; r < b.cu_q[s + 1]; r++)
            for (int h = 0; h < H; h++) {
                int g = h / (H / c.KV), n = b.q_pos[r] + 1;
                const bf16 *qr = &q[((size_t)r * H + h) * D];
                std::vector<double> score(n);
                double mx = -INFINITY, sum = 0;
                for (int i = 0; i < n; i++) {
                    const bf16 *kr = &b.pool[b.p.at(table[i / bs], 1, 0, i % bs) + g * D];
                    score[i] = 0;
                    for (int e = 0; e < D; e++) score[i] += value_of(qr[e]) * value_of(kr[e]);
                    score[i] /= sqrt((double)D);
                    mx = std::max(mx, score[i]);
                }
                for (int i = 0; i < n; i++) sum += exp(score[i] - mx);
                lse[(size_t)h * Tq + r] = mx + log(sum);
                for (int i = 0; i < n; i++) {
                    const bf16 *vr = &b.pool[b.p.at(table[i / bs], 1, 1, i % bs) + g * D];
                    for (int e = 0; e < D; e++)
                        out[((size_t)r * H + h) * D + e] +=
                            exp(score[i] - mx) / sum * value_of(vr[e]);
                }
            }
    }
}

// With split_keys 0 the launcher chooses the splits (here, with few blocks, it splits the long
// sequences in two); a small split_keys makes many splits of up to one tile per warp. Split
// sequences are combined by their last block (arrival counters), and again by the second kernel
// (no counters): the same bits both ways, and the counters left zero. With tensor_cores, the
// mma.sync kernel where the head_dim has one (64, 128).
void test_paged_attention(const paged_case &c, int split_keys, bool tensor_cores,
                          const char *note = "") {
    paged_batch b = make_paged_batch(c);
    int Tq = b.Tq();
    std::vector<bf16> q = random_bf16((size_t)Tq * c.H * c.D);
    std::vector<double> want_out, want_lse;
    paged_reference(c, b, q, want_out, want_lse);
    weft_cuda_paged_args a = {b.pool.data(), b.p.layers, b.p.block_size, b.p.width,
                              (int)c.seqs.size(), Tq, b.max_blocks, c.H, c.KV, c.D,
                              b.cu_q.data(), b.q_pos.data(), b.tables.data(), split_keys,
                              tensor_cores};
    std::vector<int> arrived(WEFT_CUDA_ARRIVAL_COUNTERS, 0);
    std::vector<bf16> outs[2];
    std::vector<float> lses[2];
    for (int counted = 1; counted >= 0; counted--) {
        std::vector<bf16> &out = outs[counted];
        std::vector<float> &lse = lses[counted];
        out.assign(q.size(), NAN_BF16);
        lse.assign((size_t)c.H * Tq, NAN);
        std::vector<float> partials(weft_cuda_paged_partials_bytes(&a) / sizeof(float), NAN);
        weft_cuda_paged_attention(queue, &a, 1, q.data(), out.data(), lse.data(),
                                  partials.data(), counted ? arrived.data() : nullptr);
    }
    std::string name = std::string(tensor_cores ? "paged_attention (mma) " : "paged_attention ") +
                       c.label + " split " +
                       (split_keys ? std::to_string(split_keys) : std::string("auto")) + note;
    compare(name + " out", outs[1], want_out, BF16_TOL);
    compare(name + " lse", lses[1], want_lse, F32_TOL);
    bool same = memcmp(outs[0].data(), outs[1].data(), sizeof(bf16) * q.size()) == 0 &&
                memcmp(lses[0].data(), lses[1].data(), sizeof(float) * lses[0].size()) == 0;
    bool zero = std::all_of(arrived.begin(), arrived.end(), [](int n) { return n == 0; });
    expect(name + ": the second kernel's bits, counters left zero", same && zero);
}

} // namespace

// When the emulator lands cp.async copies and in which order it runs a block's threads
// (cuda_emulation.h); compare() names the reversed order itself.
struct schedule {
    bool copies_early, threads_reversed, warps_one_at_a_time;
    void apply() const {
        emu::g_copies_land_at_issue = copies_early;
        emu::g_threads_in_reverse = threads_reversed;
        emu::g_warps_one_at_a_time = warps_one_at_a_time;
    }
    const char *name() const {
        return warps_one_at_a_time ? " (copies land early, one warp at a time)"
               : copies_early      ? " (copies land early)"
                                   : "";
    }
};

int main() {
    std::vector<int> mixed = {1, 33, 5, 70, 2};
    const layout layouts[] = {
        whole("whole [1,33,5,70,2] H4 KV2 D16", 4, 2, 16, mixed),
        whole("whole [1,33,5,70,2] H6 KV2 D64", 6, 2, 64, mixed),
        whole("whole [1,33,5,70,2] H2 KV2 D80", 2, 2, 80, mixed),
        whole("whole [100] H2 KV1 D128", 2, 1, 128, {100}),
        whole("whole [150,7,90] H2 KV1 D32 (tiles, blocks)", 2, 1, 32, {150, 7, 90}),
        cp_chunks("CP rank 1/2 [40,72] H4 KV2 D32", 4, 2, 32, {40, 72}, 1, 2),
        cp_chunks("CP rank 0/2 [136,64] H2 KV1 D64", 2, 1, 64, {136, 64}, 0, 2),
    };
    // Hopper's tiles are 128 (or at head_dim 64, 192) query rows by 128 keys: these span several
    // of both.
    const layout hopper_layouts[] = {
        whole("whole [1,33,5,70,2] H6 KV2 D64", 6, 2, 64, mixed),
        whole("whole [300,7,190] H2 KV1 D64 (tiles, blocks)", 2, 1, 64, {300, 7, 190}),
        whole("whole [100,200] H2 KV1 D128", 2, 1, 128, {100, 200}),
        // Blocks walking more key tiles than there are stages, so that each stage is refilled.
        whole("whole [700] H2 KV1 D64 (stages refilled)", 2, 1, 64, {700}),
        cp_chunks("CP rank 0/2 [136,64] H2 KV1 D64", 2, 1, 64, {136, 64}, 0, 2),
        cp_chunks("CP rank 1/2 [520] H4 KV2 D128", 4, 2, 128, {520}, 1, 2),
        // Eight query heads to a kv head; keys in blocks that end mid-document, query steps that
        // start mid-block, a one-row document between long ones.
        whole("whole [400,1,333] H8 KV1 D128 (grouped, steps)", 8, 1, 128, {400, 1, 333}),
    };
    for (const layout &l : layouts) test_attention(l, SIMT);
    // Copies landing as late, then as early as allowed; then threads run last to first between
    // rendezvous (late copies); then early copies with each warp running ahead of the others
    // from barrier to barrier: a missing barrier or copy wait shows up one of the four ways.
    const schedule schedules[] = {
        {false, false, false}, {true, false, false}, {false, true, false}, {true, false, true}};
    for (const schedule &when : schedules) {
        when.apply();
        for (const layout &l : layouts) test_attention(l, MMA, when.name());
        for (const layout &l : hopper_layouts) test_attention(l, HOPPER, when.name());
        for (const layout &l : hopper_layouts) test_attention(l, HOPPER_ORDERED, when.name());
        for (const layout &l : hopper_layouts)
            if (l.D == 64) test_attention(l, HOPPER_192, when.name());
    }
    test_attention(whole("whole [1,33,5,70,2] H2 KV1 D40", 2, 1, 40, mixed), SIMT); // simt only
    for (int width : {1032, 300}) test_kv_store(width); // the threads of a row loop twice
    test_split_store(4, 2, 64); // 16-byte vectors
    test_split_store(2, 1, 20); // one value at a time
    // Two RoPE pairs a block (D % 4 == 0, up to 4 rows), one (8 rows, or D % 4 == 2).
    for (int M : {1, 3, 8}) test_normed_store(M, 4, 2, 64, 256, M != 3);
    test_normed_store(2, 2, 1, 20, 136, true);
    test_normed_store(4, 2, 2, 6, 64, false);
    // Sequences of every shape a batch holds: one position, a partial block, full blocks and a
    // partial one, a long one; samples sharing a prompt's full blocks, then going their own way.
    auto decode = [](int bs) {
        return std::vector<paged_sequence>{{1, 1}, {7, 1}, {3 * bs + 5, 1}, {300, 1},
                                           {(300 / bs) * bs + 9, 1, 3, 300 / bs},
                                           {3 * bs + 1, 1, 2, 3}};
    };
    auto prefill = [](int bs) { // the last rows of each sequence at once (consecutive positions)
        return std::vector<paged_sequence>{{1, 1}, {7, 3}, {3 * bs + 5, 2 * bs}, {300, 17},
                                           {(300 / bs) * bs + 9, 9, 3, 300 / bs},
                                           {3 * bs + 1, 4, 2, 3}};
    };
    const paged_case paged_cases[] = {
        {"decode H8 KV4 D64 bs16", 8, 4, 64, 16, decode(16)},
        {"decode H8 KV2 D128 bs32", 8, 2, 128, 32, decode(32)},
        {"decode H4 KV1 D40 bs16", 4, 1, 40, 16, decode(16)},
        {"decode H2 KV1 D16 bs32", 2, 1, 16, 32, decode(32)},
        {"decode H16 KV1 D64 bs16", 16, 1, 64, 16, decode(16)},
        {"decode H2 KV2 D20 bs16", 2, 2, 20, 16, decode(16)},
        {"prefill H4 KV2 D64 bs32", 4, 2, 64, 32, prefill(32)},
        {"prefill H8 KV2 D128 bs16", 8, 2, 128, 16, prefill(16)},
        {"prefill H4 KV1 D40 bs32", 4, 1, 40, 32, prefill(32)},
        {"prefill H4 KV2 D16 bs16", 4, 2, 16, 16, prefill(16)},
        {"prefill H6 KV3 D20 bs16", 6, 3, 20, 16, prefill(16)},
        {"prefill H8 KV1 D64 bs16", 8, 1, 64, 16, prefill(16)}, // a block per row, as decoding
    };
    for (const schedule &when : schedules) {
        when.apply();
        for (const paged_case &c : paged_cases)
            for (int split_keys : {0, 40})
                for (bool mma : {false, true})
                    if (!mma || c.D == 64 || c.D == 128)
                        test_paged_attention(c, split_keys, mma, when.name());
    }
    schedule{false, false, false}.apply();
    printf("%d comparison%s over tolerance\n", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}

