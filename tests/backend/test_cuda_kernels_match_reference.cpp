// Every CUDA kernel of the backend (src/backend/cuda/*.cu) but attention's and the KV cache's,
// launcher included, run unchanged on the CPU through cuda_emulation.h
// (cuda_emulated_kernels.cpp), matches a float64 reference: embedding, RMSNorm, bias, RoPE, the
// column split, SwiGLU, the small arithmetic, the output heads (fused cross-entropy, log-probs and
// entropy, sampling, the weighted logits backward) and AdamW; and the reductions repeat bit for
// bit. Attention and the paged KV cache: test_cuda_attention_kernels_match_reference.cpp. No GPU
// is needed, so indexing, masking and barrier mistakes fail in CI; on a GPU,
// test_cuda_ops_match_cpu checks the same ops for real.
#include "kernel_reference.h"

namespace {

// ------------------------------------------------------------------------- small kernels ----

// T past one 256-token tile and C past one pass of 8 columns a thread exercise the backward's
// loops over both.
void test_embedding(int T, int C) {
    int V = 11;
    std::vector<int32_t> ids(T);
    for (int t = 0; t < T; t++) ids[t] = (t * 7) % V; // repeated ids: the backward adds up
    std::vector<bf16> table = random_bf16((size_t)V * C), dout = random_bf16((size_t)T * C);
    std::vector<bf16> out((size_t)T * C, NAN_BF16);
    std::vector<float> dtable = random_f32((size_t)V * C);
    std::vector<double> want_out((size_t)T * C), want_dtable = widen(dtable);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            want_out[(size_t)t * C + c] = value_of(table[(size_t)ids[t] * C + c]);
            want_dtable[(size_t)ids[t] * C + c] += value_of(dout[(size_t)t * C + c]);
        }
    weft_cuda_embedding_forward(queue, ids.data(), table.data(), out.data(), T, C);
    weft_cuda_embedding_backward(queue, ids.data(), dout.data(), dtable.data(), T, C);
    std::string shape = " (" + std::to_string(T) + "x" + std::to_string(C) + ")";
    compare("embedding out" + shape, out, want_out, 0.0);
    compare("embedding dtable +=" + shape, dtable, want_dtable, F32_TOL);
}

// The column reductions' partials: the scratch the backend gives them.
std::vector<float> column_partials(int T, int C) {
    return std::vector<float>(weft_cuda_column_partials_bytes(T, C) / sizeof(float), NAN);
}

// T = 70: 5 column blocks of 16 rows, the last partial; T = 8300: 489 blocks of 17 rows (past
// the block count at which rows per block grow). C not a multiple of the block.
void test_rmsnorm(int C, int T) {
    float eps = 1e-5f;
    std::vector<bf16> x = random_bf16((size_t)T * C), w = random_bf16(C, 0.5f, 1.5f);
    std::vector<bf16> dout = random_bf16((size_t)T * C), dx = random_bf16((size_t)T * C);
    std::vector<bf16> out((size_t)T * C, NAN_BF16);
    std::vector<float> rstd(T, NAN), dw = random_f32(C);
    std::vector<double> want_out((size_t)T * C), want_rstd(T), want_dx = widen(dx);
    std::vector<double> want_dw = widen(dw);
    for (int t = 0; t < T; t++) {
        double ss = 0, dot = 0;
        for (int c = 0; c < C; c++) ss += pow(value_of(x[(size_t)t * C + c]), 2);
        double r = 1.0 / sqrt(ss / C + eps);
        want_rstd[t] = r;
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)t * C + c;
            want_out[i] = value_of(x[i]) * r * value_of(w[c]);
            dot += value_of(dout[i]) * value_of(w[c]) * value_of(x[i]);
        }
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)t * C + c;
            double xi = value_of(x[i]);
            want_dx[i] += r * value_of(w[c]) * value_of(dout[i]) - xi * pow(r, 3) * dot / C;
            want_dw[c] += value_of(dout[i]) * value_of(x[i]) * r;
        }
    }
    expect_path("rmsnorm", C,
                vector_width(C, x.data(), w.data(), out.data(), dout.data(), dx.data()));
    weft_cuda_rmsnorm_forward(queue, x.data(), w.data(), eps, out.data(), rstd.data(), T, C);
    compare(sized("rmsnorm out", C), out, want_out, BF16_TOL);
    compare(sized("rmsnorm rstd", C), rstd, want_rstd, F32_TOL);
    std::vector<float> partials = column_partials(T, C);
    weft_cuda_rmsnorm_backward(queue, x.data(), w.data(), rstd.data(), dout.data(), dx.data(),
                               dw.data(), T, C, partials.data());
    compare(sized("rmsnorm dx +=", C) + " T " + std::to_string(T), dx, want_dx, BF16_TOL);
    compare(sized("rmsnorm dw +=", C) + " T " + std::to_string(T), dw, want_dw, F32_TOL);
}

void test_bias(int C, int T) {
    std::vector<bf16> x = random_bf16((size_t)T * C), bias = random_bf16(C);
    std::vector<bf16> dout = random_bf16((size_t)T * C);
    std::vector<float> dbias = random_f32(C);
    std::vector<double> want_x = widen(x), want_dbias = widen(dbias);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            want_x[(size_t)t * C + c] += value_of(bias[c]);
            want_dbias[c] += value_of(dout[(size_t)t * C + c]);
        }
    expect_path("bias", C, vector_width(C, x.data(), bias.data()));
    weft_cuda_bias_forward(queue, x.data(), bias.data(), T, C);
    std::vector<float> partials = column_partials(T, C);
    weft_cuda_bias_backward(queue, dout.data(), dbias.data(), T, C, partials.data());
    compare(sized("bias x +=", C) + " T " + std::to_string(T), x, want_x, BF16_TOL);
    compare(sized("bias dbias +=", C) + " T " + std::to_string(T), dbias, want_dbias, F32_TOL);
}

// The reductions across blocks (embedding, RMSNorm weight and bias gradients, sum_f32) give the
// same bits when launched again: the emulator draws each launch's block order anew, as a GPU
// runs blocks in no promised order. Rows are scaled by 2^-(t % 20), so that fp32 sums in another
// order round differently (sums of a few bf16 values of one magnitude are exact in any order).
std::vector<bf16> rows_of_many_magnitudes(int T, int C) {
    std::vector<bf16> x = random_bf16((size_t)T * C);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            bf16 &e = x[(size_t)t * C + c];
            e = __float2bfloat16_rn(__bfloat162float(e) * ldexpf(1.0f, -(t % 20)));
        }
    return x;
}

template <typename T> void expect_same_bits(const char *what, const std::vector<T> &a,
                                            const std::vector<T> &b) {
    bool same = a.size() == b.size() && memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
    printf("%-76s %s\n", (std::string(what) + ": same bits launched again").c_str(),
           same ? "ok" : "FAIL");
    failures += !same;
}

void test_reductions_repeat_bit_for_bit() {
    int T = 8300, C = 64, V = 3; // about 2,800 occurrences of each id; 489 column blocks
    std::vector<int32_t> ids(T);
    for (int t = 0; t < T; t++) ids[t] = (t * 7) % V;
    std::vector<bf16> dout = rows_of_many_magnitudes(T, C), x = random_bf16((size_t)T * C);
    std::vector<bf16> w = random_bf16(C, 0.5f, 1.5f), dx0 = random_bf16((size_t)T * C);
    std::vector<float> rstd = random_f32(T, 0.5f, 2.0f), partials = column_partials(T, C);
    std::vector<float> table0 = random_f32((size_t)V * C), grad0 = random_f32(C);
    std::vector<double> sum_partials(WEFT_CUDA_SUM_PARTIALS);
    std::vector<float> f((size_t)T * C);
    for (size_t i = 0; i < f.size(); i++) f[i] = __bfloat162float(dout[i]);
    std::vector<float> table[2], dw[2], db[2];
    std::vector<double> sums[2];
    for (int run = 0; run < 2; run++) {
        std::vector<bf16> dx = dx0;
        table[run] = table0, dw[run] = grad0, db[run] = grad0, sums[run] = {0.25};
        weft_cuda_embedding_backward(queue, ids.data(), dout.data(), table[run].data(), T, C);
        weft_cuda_rmsnorm_backward(queue, x.data(), w.data(), rstd.data(), dout.data(),
                                   dx.data(), dw[run].data(), T, C, partials.data());
        weft_cuda_bias_backward(queue, dout.data(), db[run].data(), T, C, partials.data());
        weft_cuda_sum_f32(queue, f.data(), f.size(), true, 1.0, true, sums[run].data(),
                          sum_partials.data());
    }
    expect_same_bits("embedding dtable", table[0], table[1]);
    expect_same_bits("rmsnorm dw", dw[0], dw[1]);
    expect_same_bits("bias dbias", db[0], db[1]);
    expect_same_bits("sum_f32 of squares", sums[0], sums[1]);
}

// RoPE from a frequency table: plain RoPE's, and an irregular one scaled by a YaRN-style factor.
void test_rope() {
    int T = 9, H = 3, D = 64;
    double theta = 500000.0;
    std::vector<int32_t> pos(T);
    for (int t = 0; t < T; t++) pos[t] = t * 4999; // up to ~40k: angles need double
    for (int irregular : {0, 1}) {
        std::vector<float> inv_freq(D / 2);
        for (int i = 0; i < D / 2; i++)
            inv_freq[i] = (float)pow(theta, -2.0 * i / D) / (irregular && i % 2 ? 8.0f : 1.0f);
        float scale = irregular ? 1.2079f : 1.0f;
        // The irregular case's rows hold one head more than are rotated (q and k heads at the
        // start of fused q|k|v rows): it must be left as it was.
        int ld = (H + irregular) * D;
        for (float sign : {1.0f, -1.0f}) {
            std::vector<bf16> x = random_bf16((size_t)T * ld);
            std::vector<double> want = widen(x);
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++)
                    for (int i = 0; i < D / 2; i++) {
                        double angle = pos[t] * (double)inv_freq[i];
                        double c = scale * cos(angle), s = scale * sign * sin(angle);
                        size_t at = (size_t)t * ld + (size_t)h * D;
                        double a = value_of(x[at + i]), b = value_of(x[at + i + D / 2]);
                        want[at + i] = a * c - b * s;
                        want[at + i + D / 2] = b * c + a * s;
                    }
            weft_cuda_rope(queue, x.data(), ld, pos.data(), inv_freq.data(), scale, T, H, D,
                           sign);
            compare(irregular ? (sign > 0 ? "rope forward (irregular table, scaled)"
                                          : "rope backward (irregular table, scaled)")
                              : (sign > 0 ? "rope forward" : "rope backward (inverse rotation)"),
                    x, want, BF16_TOL);
        }
    }
}

static uint16_t bits_of(bf16 v) {
    uint16_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

// A fused (rows, a + b + c) matrix into three and back: every value where it belongs, exactly
// (a, b, c multiples of 8: the 16-byte path; else one value at a time).
void test_split_columns(int rows, int a, int b, int c) {
    int widths[3] = {a, b, c}, width = a + b + c;
    size_t n = (size_t)rows * width;
    std::vector<bf16> fused = random_bf16(n), back(n, NAN_BF16);
    std::vector<bf16> parts[3];
    void *ptrs[3];
    for (int i = 0; i < 3; i++) {
        parts[i].assign((size_t)rows * widths[i], NAN_BF16);
        ptrs[i] = parts[i].data();
    }
    std::string name = "split_columns " + std::to_string(a) + "|" + std::to_string(b) + "|" +
                       std::to_string(c);
    weft_cuda_split_columns(queue, fused.data(), ptrs, widths, 3, rows, false, nullptr, nullptr,
                            1.0f, 0, 0);
    weft_cuda_split_columns(queue, back.data(), ptrs, widths, 3, rows, true, nullptr, nullptr,
                            1.0f, 0, 0);
    size_t wrong = 0;
    for (int t = 0; t < rows; t++)
        for (int j = 0, p = 0, col = 0; j < width; j++, col++) {
            if (col == widths[p]) p++, col = 0;
            bf16 want = fused[(size_t)t * width + j];
            wrong += bits_of(parts[p][(size_t)t * widths[p] + col]) != bits_of(want);
            wrong += bits_of(back[(size_t)t * width + j]) != bits_of(want);
        }
    printf("%-76s %zu values misplaced %s\n", name.c_str(), wrong, wrong ? "FAIL" : "ok");
    failures += wrong != 0;
}

// q|k|v rows of H + KV + KV heads of D split with their q and k heads turned on the way, and
// joined with them turned back: the same bits as weft_cuda_rope before the plain split (fused
// left turned as rope leaves it) or after the plain join, which the model relies on (RoPE's own
// arithmetic is test_rope's).
void test_split_columns_turning(int rows, int H, int KV, int D) {
    int widths[3] = {H * D, KV * D, KV * D}, width = (H + 2 * KV) * D;
    size_t n = (size_t)rows * width;
    std::vector<int32_t> pos(rows);
    for (int t = 0; t < rows; t++) pos[t] = 3 + 1777 * t;
    std::vector<float> inv_freq(D / 2);
    for (int i = 0; i < D / 2; i++) inv_freq[i] = (float)pow(10000.0, -2.0 * i / D);
    float scale = 1.1f;
    std::vector<bf16> fused = random_bf16(n), turned = fused, joined(n, NAN_BF16);
    std::vector<bf16> want_parts[3], parts[3], want_joined(n, NAN_BF16);
    void *want_ptrs[3], *ptrs[3];
    for (int i = 0; i < 3; i++) {
        want_parts[i].assign((size_t)rows * widths[i], NAN_BF16);
        parts[i] = want_parts[i];
        want_ptrs[i] = want_parts[i].data(), ptrs[i] = parts[i].data();
    }
    weft_cuda_rope(queue, turned.data(), width, pos.data(), inv_freq.data(), scale, rows, H + KV,
                   D, 1.0f);
    weft_cuda_split_columns(queue, turned.data(), want_ptrs, widths, 3, rows, false, nullptr,
                            nullptr, 1.0f, 0, 0);
    weft_cuda_split_columns(queue, fused.data(), ptrs, widths, 3, rows, false, pos.data(),
                            inv_freq.data(), scale, H + KV, D);
    weft_cuda_split_columns(queue, want_joined.data(), want_ptrs, widths, 3, rows, true, nullptr,
                            nullptr, 1.0f, 0, 0);
    weft_cuda_rope(queue, want_joined.data(), width, pos.data(), inv_freq.data(), scale, rows,
                   H + KV, D, -1.0f);
    weft_cuda_split_columns(queue, joined.data(), want_ptrs, widths, 3, rows, true, pos.data(),
                            inv_freq.data(), scale, H + KV, D);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        wrong += bits_of(fused[i]) != bits_of(turned[i]);
        wrong += bits_of(joined[i]) != bits_of(want_joined[i]);
    }
    for (int p = 0; p < 3; p++)
        for (size_t i = 0; i < parts[p].size(); i++)
            wrong += bits_of(parts[p][i]) != bits_of(want_parts[p][i]);
    std::string name = "split_columns turning H" + std::to_string(H) + " KV" + std::to_string(KV) +
                       " D" + std::to_string(D) + " = rope, split / join, rope back";
    printf("%-76s %zu values differ %s\n", name.c_str(), wrong, wrong ? "FAIL" : "ok");
    failures += wrong != 0;
}

// rows x width outputs from gate_up (rows, 2 width): each row's gates (spread into both tails of
// the sigmoid), then its ups.
void test_swiglu(int rows, int width) {
    size_t N = (size_t)rows * width, W = (size_t)width;
    std::vector<bf16> gate_up = random_bf16(2 * N), dout = random_bf16(N);
    for (size_t r = 0; r < (size_t)rows; r++) {
        std::vector<bf16> gates = random_bf16(W, -4, 4);
        std::copy(gates.begin(), gates.end(), gate_up.begin() + r * 2 * W);
    }
    std::vector<bf16> out(N, NAN_BF16), d_gate_up(2 * N, NAN_BF16);
    std::vector<double> want_out(N), want_d(2 * N);
    for (size_t i = 0; i < N; i++) {
        size_t at = i / W * 2 * W + i % W;
        double g = value_of(gate_up[at]), u = value_of(gate_up[at + W]), d = value_of(dout[i]);
        double sg = 1.0 / (1.0 + exp(-g));
        want_out[i] = g * sg * u;
        want_d[at] = d * u * sg * (1.0 + g * (1.0 - sg));
        want_d[at + W] = d * g * sg;
    }
    expect_path("swiglu rows of", W, vector_width(W, gate_up.data(), out.data(), d_gate_up.data()));
    weft_cuda_swiglu_forward(queue, gate_up.data(), out.data(), rows, width);
    weft_cuda_swiglu_backward(queue, gate_up.data(), dout.data(), d_gate_up.data(), rows, width);
    compare(sized("swiglu out", N), out, want_out, BF16_TOL);
    // Gates' and ups' gradients apart, as their scales differ.
    for (int half = 0; half < 2; half++) {
        std::vector<bf16> got(N);
        std::vector<double> want(N);
        for (size_t i = 0; i < N; i++) {
            size_t at = i / W * 2 * W + half * W + i % W;
            got[i] = d_gate_up[at], want[i] = want_d[at];
        }
        compare(sized(half ? "swiglu dup" : "swiglu dgate", N), got, want, BF16_TOL);
    }
}

void test_small_arithmetic(size_t N) { // ragged last blocks
    std::vector<bf16> y = random_bf16(N), x = random_bf16(N);
    std::vector<float> f = random_f32(N);
    std::vector<double> want_y = widen(y), want_f = widen(f), sums(2, 0.0), got(2, NAN);
    for (size_t i = 0; i < N; i++) {
        want_y[i] += value_of(x[i]);
        sums[0] += f[i];
        sums[1] += (double)f[i] * f[i];
        want_f[i] *= 0.37;
    }
    expect_path("add_bf16", N, vector_width(N, y.data(), x.data()));
    weft_cuda_add_bf16(queue, y.data(), x.data(), N);
    std::vector<double> partials(WEFT_CUDA_SUM_PARTIALS, NAN);
    weft_cuda_sum_f32(queue, f.data(), N, false, 1.0, false, &got[0], partials.data());
    weft_cuda_sum_f32(queue, f.data(), N, true, 1.0, false, &got[1], partials.data());
    std::vector<double> acc(1, 0.5), want_acc(1, 0.5 - 2.0 * sums[0]);
    weft_cuda_sum_f32(queue, f.data(), N, false, -2.0, true, &acc[0], partials.data());
    compare(sized("sum_f32 accumulated, scaled", N), acc, want_acc, 1e-12);
    weft_cuda_scale_f32(queue, f.data(), 0.37f, N);
    compare(sized("add_bf16 y +=", N), y, want_y, BF16_TOL);
    compare(sized("sum_f32 (sum, sum of squares)", N), got, sums, 1e-12);
    compare(sized("scale_f32", N), f, want_f, F32_TOL);
}

void test_cross_entropy(int V) { // V not a multiple of the block
    int T = 37;
    float scale = 0.25f;
    std::vector<bf16> logits = random_bf16((size_t)T * V, -6, 6);
    std::vector<int32_t> targets(T);
    for (int t = 0; t < T; t++) targets[t] = t % 5 == 4 ? -1 : (t * 131) % V;
    // A row whose target is its maximum, so `correct` is exercised both ways.
    logits[(size_t)1 * V + targets[1]] = __float2bfloat16_rn(9.0f);
    std::vector<double> want_grad((size_t)T * V, 0.0), want_loss(T, 0.0), want_correct(T, 0.0);
    for (int t = 0; t < T; t++) {
        if (targets[t] < 0) continue;
        const bf16 *row = &logits[(size_t)t * V];
        double mx = -INFINITY, sum = 0;
        int arg = 0;
        for (int j = 0; j < V; j++)
            if (value_of(row[j]) > mx) mx = value_of(row[j]), arg = j;
        for (int j = 0; j < V; j++) sum += exp(value_of(row[j]) - mx);
        want_loss[t] = mx + log(sum) - value_of(row[targets[t]]);
        want_correct[t] = arg == targets[t];
        for (int j = 0; j < V; j++)
            want_grad[(size_t)t * V + j] =
                scale * (exp(value_of(row[j]) - mx) / sum - (j == targets[t] ? 1.0 : 0.0));
    }
    std::vector<float> loss(T, NAN), correct(T, NAN);
    expect_path("cross_entropy", V, vector_width(V, logits.data()));
    weft_cuda_cross_entropy(queue, logits.data(), targets.data(), scale, loss.data(),
                            correct.data(), T, V);
    compare(sized("cross_entropy row loss", V), loss, want_loss, F32_TOL);
    compare(sized("cross_entropy correct", V), correct, want_correct, 0.0);
    compare(sized("cross_entropy grad (in place)", V), logits, want_grad, BF16_TOL);
}

// Rows of logits (T, V) with targets, the way every head test builds them: every fifth row without
// a target, and one row whose target is its maximum.
struct head_rows {
    int T, V;
    std::vector<bf16> logits;
    std::vector<int32_t> targets;
};

head_rows make_head_rows(int V) {
    head_rows h{37, V, random_bf16((size_t)37 * V, -6, 6), std::vector<int32_t>(37)};
    for (int t = 0; t < h.T; t++) h.targets[t] = t % 5 == 4 ? -1 : (t * 131) % V;
    h.logits[(size_t)1 * V + h.targets[1]] = __float2bfloat16_rn(9.0f);
    return h;
}

// Row t's log-softmax (float64), its entropy, and whether its target is the argmax.
double row_log_softmax(const head_rows &h, int t, std::vector<double> &logp, bool *right) {
    const bf16 *row = &h.logits[(size_t)t * h.V];
    double mx = -INFINITY, sum = 0, H = 0;
    int arg = 0;
    for (int j = 0; j < h.V; j++)
        if (value_of(row[j]) > mx) mx = value_of(row[j]), arg = j;
    for (int j = 0; j < h.V; j++) sum += exp(value_of(row[j]) - mx);
    logp.resize(h.V);
    for (int j = 0; j < h.V; j++) {
        logp[j] = value_of(row[j]) - mx - log(sum);
        H -= exp(logp[j]) * logp[j];
    }
    *right = arg == h.targets[t];
    return H;
}

void test_logprobs(int V) {
    head_rows h = make_head_rows(V);
    std::vector<double> want_lp(h.T, 0.0), want_H(h.T, 0.0), want_correct(h.T, 0.0), logp;
    for (int t = 0; t < h.T; t++) {
        if (h.targets[t] < 0) continue;
        bool right;
        want_H[t] = row_log_softmax(h, t, logp, &right);
        want_lp[t] = logp[h.targets[t]];
        want_correct[t] = right;
    }
    std::vector<float> lp(h.T, NAN), H(h.T, NAN), correct(h.T, NAN);
    std::vector<bf16> before = h.logits;
    weft_cuda_logprobs(queue, h.logits.data(), h.targets.data(), lp.data(), H.data(),
                       correct.data(), h.T, V);
    compare(sized("logprobs", V), lp, want_lp, F32_TOL);
    compare(sized("logprobs entropy", V), H, want_H, F32_TOL);
    compare(sized("logprobs correct", V), correct, want_correct, 0.0);
    compare(sized("logprobs leaves the logits", V), h.logits, widen(before), 0.0);
    // The rollout's host finishes a log-prob from a row's normalizer: logprobs' bits.
    std::vector<float> lse(h.T, NAN), finished(h.T, 0.0f);
    weft_cuda_log_normalizers(queue, h.logits.data(), lse.data(), h.T, V);
    for (int t = 0; t < h.T; t++)
        if (h.targets[t] >= 0)
            finished[t] = -(lse[t] - (float)value_of(h.logits[(size_t)t * V + h.targets[t]]));
    compare(sized("log_normalizers give logprobs' bits", V), finished, widen(lp), 0.0);
}

// Sampling filters, as rollout/sampling.h states them (off: top_k 0, top_p 1, min_p 0).
struct filters {
    int top_k;
    double top_p, min_p;
};

// The processed distribution's weights of a row (0 outside the kept set), in float64 from its
// definition, by a full sort: rank by weight (ties to the lower id), keep the first top_k, then
// the shortest prefix of those whose weight reaches top_p of theirs, then min_p.
std::vector<double> processed_weights(const bf16 *row, int V, float temperature, filters f) {
    double mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = std::max(mx, value_of(row[j]));
    std::vector<double> w(V);
    for (int j = 0; j < V; j++) w[j] = exp((value_of(row[j]) - mx) / temperature);
    std::vector<int> rank(V);
    std::iota(rank.begin(), rank.end(), 0);
    std::stable_sort(rank.begin(), rank.end(), [&](int a, int b) { return w[a] > w[b]; });
    int kept = f.top_k > 0 && f.top_k < V ? f.top_k : V;
    if (f.top_p < 1) {
        double mass = 0, cumulative = 0;
        for (int r = 0; r < kept; r++) mass += w[rank[r]];
        int r = 0;
        while (r < kept - 1 && (cumulative += w[rank[r]]) < f.top_p * mass) r++;
        kept = r + 1;
    }
    for (int r = kept; r < V; r++) w[rank[r]] = 0;
    for (int j = 0; j < V; j++)
        if (w[j] < f.min_p) w[j] = 0;
    return w;
}

// The first token whose cumulative weight (w, token order) exceeds u times the total: the last of
// nonzero weight where rounding leaves u's point past them all.
int inverse_cdf(const std::vector<double> &w, double u) {
    double mass = std::accumulate(w.begin(), w.end(), 0.0), cumulative = 0;
    int token = -1;
    for (size_t j = 0; j < w.size(); j++) {
        if (w[j] == 0) continue;
        token = (int)j;
        if (u * mass < (cumulative += w[j])) break;
    }
    return token;
}

// Draws from the rows of make_head_rows (ties for the largest logit, and at the filters' cuts,
// included) at uniform points u, among them 0 and just below 1, against the inverse CDF of
// processed_weights walked token by token; and each drawn token's log-prob, bit for bit the
// logprobs op's on its row.
void test_sample_tokens(int V, float temperature, filters f) {
    head_rows h = make_head_rows(V);
    int n = 3 * h.T;
    std::vector<int32_t> rows(n), tokens(n, -1), want_tokens(n);
    std::vector<double> u(n), want_processed(n);
    std::vector<float> processed(n, NAN), logprob(n, NAN), want_logprob(n, NAN);
    for (int d = 0; d < n; d++) {
        rows[d] = (d * 7) % h.T;
        u[d] = d == 0 ? 0.0 : d == 1 ? 1.0 - 1e-12 : (double)uniform(0.0f, 1.0f);
        const bf16 *row = &h.logits[(size_t)rows[d] * V];
        int arg = 0;
        for (int j = 1; j < V; j++)
            if (value_of(row[j]) > value_of(row[arg])) arg = j;
        want_tokens[d] = arg, want_processed[d] = 0.0;
        if (temperature == 0) continue;
        std::vector<double> w = processed_weights(row, V, temperature, f);
        int token = inverse_cdf(w, u[d]);
        want_tokens[d] = token;
        want_processed[d] = log(w[token] / std::accumulate(w.begin(), w.end(), 0.0));
    }
    weft_cuda_sample_tokens(queue, h.logits.data(), rows.data(), u.data(), n, V, temperature,
                            f.top_k, f.top_p, f.min_p, tokens.data(), logprob.data(),
                            processed.data());
    int wrong = 0;
    for (int d = 0; d < n; d++) wrong += tokens[d] != want_tokens[d];
    char config[96];
    snprintf(config, sizeof config, " T %g top_k %d top_p %g min_p %g", temperature, f.top_k,
             f.top_p, f.min_p);
    std::string name = sized("sample_tokens", V) + config;
    printf("%-76s %d of %d tokens differ %s\n", (name + " tokens").c_str(), wrong, n,
           wrong ? "FAIL" : "ok");
    failures += wrong > 0;
    compare(name + " processed log-prob", processed, want_processed, F32_TOL);
    std::vector<bf16> drawn_rows((size_t)n * V);
    for (int d = 0; d < n; d++)
        std::copy_n(&h.logits[(size_t)rows[d] * V], V, &drawn_rows[(size_t)d * V]);
    weft_cuda_logprobs(queue, drawn_rows.data(), tokens.data(), want_logprob.data(), nullptr,
                       nullptr, n, V);
    compare(name + " log-prob = the logprobs op's", logprob, widen(want_logprob), 0.0);
}

// Speculative sampling's verification (backend.h's verify_drafts) against its rule in float64 on
// processed_weights: sequences of 0 to 3 drafts, each drafted from a row q that equals its target
// row p (every draft passes), is p rounded differently (most pass) or is another row (most
// fail); drafts drawn from q (a token p's filters drop among them), some with an acceptance
// number of -1 (any draft passes). The emitted tokens, their count, their processed log-probs,
// and their log-probs bit for bit the logprobs op's.
void test_verify_drafts(int V, float temperature, filters f) {
    head_rows h = make_head_rows(V);
    const int n = 40, k = 3;
    std::vector<int32_t> index((size_t)n * (2 + k)), count(n, -1), want_count(n);
    std::vector<int32_t> draft_tokens((size_t)n * k, -1);
    std::vector<double> u((size_t)n * (2 * k + 1));
    std::vector<bf16> q_rows((size_t)n * k * V);
    std::vector<int32_t> tokens((size_t)n * (k + 1), -1), want_tokens, emitted_rows;
    std::vector<float> logprob(tokens.size(), NAN), processed(tokens.size(), NAN);
    std::vector<double> want_processed;
    auto weights = [&](const bf16 *row) {
        if (temperature != 0) return processed_weights(row, V, temperature, f);
        std::vector<double> w(V, 0.0); // greedy: the first largest logit
        w[std::max_element(row, row + V, [](bf16 a, bf16 b) {
              return value_of(a) < value_of(b);
          }) - row] = 1.0;
        return w;
    };
    auto normalized = [](std::vector<double> w) {
        double mass = std::accumulate(w.begin(), w.end(), 0.0);
        for (double &x : w) x /= mass;
        return w;
    };
    for (int i = 0; i < n; i++) {
        int32_t *ix = &index[(size_t)i * (2 + k)];
        double *uu = &u[(size_t)i * (2 * k + 1)];
        int p_row = (i * 5) % (h.T - k), n_drafts = i % (k + 1);
        ix[0] = p_row, ix[1] = n_drafts;
        for (int j = 0; j < 2 * k + 1; j++) uu[j] = (double)uniform(0.0f, 1.0f);
        bool any = i % 9 == 8; // every draft passes
        for (int d = 0; d < k; d++) {
            const bf16 *p = &h.logits[(size_t)(p_row + d) * V];
            bf16 *q = &q_rows[(size_t)((i * k + d * 7) % (n * k)) * V];
            int kind = (i + d) % 3;
            for (int j = 0; j < V; j++)
                q[j] = kind == 0 ? p[j]
                     : kind == 1 ? __float2bfloat16_rn((float)value_of(p[j]) + uniform(-0.05f, 0.05f))
                                 : h.logits[(size_t)((i * 7 + d + 11) % h.T) * V + j];
            ix[2 + d] = (i * k + d * 7) % (n * k); // draft rows in no particular order
            std::vector<double> wq = weights(q), wp = weights(p);
            int x = inverse_cdf(any ? wp : wq, uu[d]);
            if (i % 13 == 5 && temperature != 0) // a token p's filters drop, where there is one
                for (int j = 0; j < V; j++)
                    if (wp[j] == 0 && wq[j] > 0) x = j;
            draft_tokens[ix[2 + d]] = x;
            if (any) uu[d] = -1.0;
        }
        // The rule, in float64.
        int emitted = 0;
        for (int d = 0;; d++) {
            const bf16 *p = &h.logits[(size_t)(p_row + d) * V];
            std::vector<double> P = normalized(weights(p));
            int token = -1;
            bool passed = false;
            if (d < n_drafts) {
                std::vector<double> Q = normalized(weights(&q_rows[(size_t)ix[2 + d] * V]));
                int x = draft_tokens[ix[2 + d]];
                passed = uu[d] * Q[x] < P[x];
                std::vector<double> r(V);
                for (int j = 0; j < V; j++) r[j] = std::max(0.0, P[j] - Q[j]);
                bool residual = std::accumulate(r.begin(), r.end(), 0.0) > 0;
                token = passed ? x : inverse_cdf(residual ? r : P, uu[k + d]);
            } else {
                token = inverse_cdf(P, uu[2 * k]);
            }
            want_tokens.push_back(token), emitted_rows.push_back(p_row + d);
            want_processed.push_back(temperature == 0 ? 0.0 : log(P[token]));
            emitted++;
            if (!passed) break;
        }
        want_count[i] = emitted;
    }
    weft_cuda_verify_drafts(queue, h.logits.data(), q_rows.data(), draft_tokens.data(),
                            index.data(), u.data(), n, k, V, temperature, f.top_k, f.top_p,
                            f.min_p, tokens.data(), logprob.data(), processed.data(),
                            count.data());
    int wrong = 0, passes = 0;
    std::vector<int32_t> got_tokens;
    std::vector<float> got_processed, got_logprob;
    for (int i = 0; i < n; i++) {
        bool differs = count[i] != want_count[i];
        passes += want_count[i] - 1;
        for (int d = 0; d < want_count[i] && !differs; d++) {
            size_t at = (size_t)i * (k + 1) + d;
            differs = tokens[at] != want_tokens[got_tokens.size()];
            got_tokens.push_back(tokens[at]);
            got_processed.push_back(processed[at]), got_logprob.push_back(logprob[at]);
        }
        wrong += differs;
    }
    char config[96];
    snprintf(config, sizeof config, " T %g top_k %d top_p %g min_p %g", temperature, f.top_k,
             f.top_p, f.min_p);
    std::string name = sized("verify_drafts", V) + config;
    printf("%-76s %d of %d sequences differ, %d drafts pass %s\n", (name + " tokens").c_str(),
           wrong, n, passes, wrong ? "FAIL" : "ok");
    failures += wrong > 0;
    if (wrong) return;
    compare(name + " processed log-prob", got_processed, want_processed, F32_TOL);
    std::vector<bf16> drawn_rows(emitted_rows.size() * V);
    std::vector<float> want_logprob(emitted_rows.size(), NAN);
    for (size_t j = 0; j < emitted_rows.size(); j++)
        std::copy_n(&h.logits[(size_t)emitted_rows[j] * V], V, &drawn_rows[j * V]);
    weft_cuda_logprobs(queue, drawn_rows.data(), got_tokens.data(), want_logprob.data(), nullptr,
                       nullptr, (int)emitted_rows.size(), V);
    compare(name + " log-prob = the logprobs op's", got_logprob, widen(want_logprob), 0.0);
}

// RMSNorm folded into a few-row product: bit for bit weft_cuda_rmsnorm_forward into a buffer and
// then weft_cuda_few_rows (with a bias) or weft_cuda_few_rows_swiglu, at K where the product's
// block has the norm's 256 threads (2048; 4104, where a thread sums two vectors) and where it has
// fewer (896: 128 threads, each taking two of the norm's).
void test_few_rows_normed(int M, int K, bool swiglu) {
    int N = swiglu ? 40 : 72, rows_of_w = swiglu ? 2 * N : N; // N: the output's width
    float eps = 1e-6f;
    std::vector<bf16> x = random_bf16((size_t)M * K, -3.0f, 3.0f), g = random_bf16(K, 0.5f, 1.5f);
    std::vector<bf16> w = random_bf16((size_t)rows_of_w * K), bias = random_bf16(N);
    std::vector<bf16> normed((size_t)M * K), want((size_t)M * N, NAN_BF16);
    std::vector<bf16> got((size_t)M * N, NAN_BF16);
    std::vector<float> rstd(M);
    weft_cuda_rmsnorm_forward(queue, x.data(), g.data(), eps, normed.data(), rstd.data(), M, K);
    if (swiglu)
        weft_cuda_few_rows_swiglu(queue, M, N, K, normed.data(), K, w.data(), K, want.data(), N);
    else
        weft_cuda_few_rows(queue, M, N, K, 1.0f, normed.data(), K, w.data(), K, 0.0f, nullptr,
                           bias.data(), want.data(), N);
    weft_cuda_few_rows_normed(queue, M, N, K, x.data(), g.data(), eps, w.data(),
                              swiglu ? nullptr : bias.data(), got.data(), swiglu);
    std::string name = std::string(swiglu ? "few_rows_swiglu" : "few_rows") + " normed M " +
                       std::to_string(M) + " K " + std::to_string(K) + " = rmsnorm, then it";
    compare(name, got, widen(want), 0.0);
}

// skinny.cu's products past 64 rows (blocks of 64 rows, x staged in shared memory), and of 33
// to 64 rows with x staged (shared_x) or read from L2 by each column group, against float64, and
// every row the bits of that row multiplied alone (one row: x read from global
// memory; every 7th row and the last), with and without the SwiGLU: K in splits whose chunks
// pair up (1024: 4 each) and do not (96: 3; 4096 at N 832: 7, in 4 pairs, so each buffer is
// staged again), a partial last row block, and the copies landing when issued as well as late.
void test_skinny_rows(int M, int N, int K, bool swiglu, bool shared_x = true) {
    weft_cuda_queue staging = emulated_queue;
    staging.skinny_shared_x = shared_x;
    int width = swiglu ? N / 2 : N, rows_of_w = N;
    std::vector<bf16> x = random_bf16((size_t)M * K), w = random_bf16((size_t)rows_of_w * K);
    std::vector<bf16> got((size_t)M * width, NAN_BF16), alone(width, NAN_BF16);
    std::vector<float> partials(weft_cuda_skinny_partials_bytes(M, N, K) / sizeof(float) + 1);
    std::vector<int> arrived(WEFT_CUDA_ARRIVAL_COUNTERS, 0);
    auto product = [&](int m, const bf16 *xm, bf16 *y) {
        if (swiglu)
            weft_cuda_skinny_swiglu(&staging, m, width, K, xm, K, w.data(), K, y, width,
                                    partials.data(), arrived.data());
        else
            weft_cuda_skinny(&staging, m, N, K, 1.0f, xm, K, w.data(), K, 0.0f, nullptr, nullptr,
                             y, N, partials.data(), arrived.data());
    };
    product(M, x.data(), got.data());
    std::vector<double> want((size_t)M * width);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < width; n++) {
            double sum = 0, up = 0;
            for (int k = 0; k < K; k++) {
                double xv = value_of(x[(size_t)m * K + k]);
                sum += xv * value_of(w[(size_t)n * K + k]);
                if (swiglu) up += xv * value_of(w[(size_t)(n + width) * K + k]);
            }
            want[(size_t)m * width + n] = swiglu ? sum / (1 + exp(-sum)) * up : sum;
        }
    int differ = 0;
    for (int m = 0; m < M; m += m + 7 < M ? 7 : M - 1 - m > 0 ? M - 1 - m : 1) { // every 7th, last
        partials.assign(partials.size(), 0.0f);
        product(1, x.data() + (size_t)m * K, alone.data());
        differ += memcmp(alone.data(), got.data() + (size_t)m * width, width * sizeof(bf16)) != 0;
    }
    std::string name = std::string(swiglu ? "skinny_swiglu" : "skinny") + " M " +
                       std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) +
                       (M <= 64 && !shared_x ? " (x from L2)" : "") +
                       (emu::g_copies_land_at_issue ? " (copies land early)" : "") +
                       (emu::g_warps_one_at_a_time ? " (one warp at a time)" : "");
    compare(name, got, want, BF16_TOL);
    expect(name + ": every row the row alone's bits, counters left zero",
           differ == 0 &&
               std::all_of(arrived.begin(), arrived.end(), [](int n) { return n == 0; }));
}

// Token ids fed from the draws before (rows with a source) beside ids that stay, over more rows
// than one block's threads.
void test_take_tokens(int n) {
    std::vector<int32_t> drawn(n / 2 + 1), from(n), tokens(n), want(n);
    for (size_t d = 0; d < drawn.size(); d++) drawn[d] = 1000 + (int32_t)(d * 37 % 501);
    for (int r = 0; r < n; r++) {
        from[r] = r % 3 == 0 ? -1 : (r * 5) % (int)drawn.size();
        tokens[r] = want[r] = r;
        if (from[r] >= 0) want[r] = drawn[from[r]];
    }
    weft_cuda_take_tokens(queue, tokens.data(), drawn.data(), from.data(), n);
    int wrong = 0;
    for (int r = 0; r < n; r++) wrong += tokens[r] != want[r];
    std::string name = "take_tokens " + std::to_string(n) + " rows";
    printf("%-76s %d of %d tokens differ %s\n", name.c_str(), wrong, n, wrong ? "FAIL" : "ok");
    failures += wrong > 0;
}

// The gradient of sum_t w_t logp_t + u_t H_t: w (onehot - p) - u p (log p + H), with u = 0 on some
// rows (cross-entropy's own expression).
void test_logits_backward(int V) {
    head_rows h = make_head_rows(V);
    std::vector<float> w = random_f32(h.T), u = random_f32(h.T);
    for (int t = 0; t < h.T; t += 3) u[t] = 0.0f;
    std::vector<double> want((size_t)h.T * V, 0.0), logp;
    for (int t = 0; t < h.T; t++) {
        if (h.targets[t] < 0) continue;
        bool right;
        double H = row_log_softmax(h, t, logp, &right);
        for (int j = 0; j < V; j++) {
            double p = exp(logp[j]);
            want[(size_t)t * V + j] = w[t] * ((j == h.targets[t]) - p) - u[t] * p * (logp[j] + H);
        }
    }
    weft_cuda_logits_backward(queue, h.logits.data(), h.targets.data(), w.data(), u.data(),
                              h.T, V);
    compare(sized("logits_backward (log-prob and entropy weights)", V), h.logits, want, BF16_TOL);
}

void test_adamw() {
    size_t N = 5000;
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (bool with_master : {true, false}) {
        std::vector<float> p = random_f32(N), m(N, 0.0f), v(N, 0.0f);
        std::vector<bf16> param(N, NAN_BF16);
        std::vector<double> want_p = widen(p), want_m(N, 0.0), want_v(N, 0.0);
        for (int step = 1; step <= 3; step++) {
            std::vector<float> g = random_f32(N);
            double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            for (size_t i = 0; i < N; i++) {
                want_m[i] = b1 * want_m[i] + (1 - b1) * g[i];
                want_v[i] = b2 * want_v[i] + (1 - b2) * (double)g[i] * g[i];
                want_p[i] = want_p[i] * (1 - lr * wd) -
                            lr / bc1 * want_m[i] / (sqrt(want_v[i]) / sqrt(bc2) + eps);
            }
            if (with_master)
                weft_cuda_adamw(queue, param.data(), p.data(), g.data(), m.data(), v.data(), N,
                                lr, b1, b2, eps, wd, step);
            else
                weft_cuda_adamw(queue, p.data(), nullptr, g.data(), m.data(), v.data(), N, lr,
                                b1, b2, eps, wd, step);
        }
        std::string label = with_master ? "adamw (fp32 master, bf16 param)" : "adamw (fp32)";
        compare(label + " param, 3 steps", p, want_p, F32_TOL);
        compare(label + " exp_avg_sq", v, want_v, F32_TOL);
        if (with_master) compare(label + " bf16 = rounded master", param, widen(p), 4e-3);
    }
}

} // namespace

// Every kernel, its threads run in index order between rendezvous, then in reverse
// (cuda_emulation.h's g_threads_in_reverse): a missing barrier reads stale shared memory one way.
static void test_every_kernel() {
    test_embedding(37, 300);
    test_embedding(600, 2100);
    for (int C : {2056, 300}) { // a thread loops twice over 16-byte vectors at 2056
        test_rmsnorm(C, 70);
        test_bias(C, 70);
    }
    test_rmsnorm(300, 8300);
    test_bias(300, 8300);
    test_reductions_repeat_bit_for_bit();
    test_rope();
    // Rows of 200 (16-byte vectors), of 201 (one value at a time: a vector would cross rows), and
    // one row (a decode step).
    test_split_columns(7, 64, 16, 16); // 16-byte vectors
    test_split_columns(5, 12, 4, 4);   // one value at a time
    test_split_columns_turning(6, 4, 2, 64); // 16-byte vectors past the turned heads
    test_split_columns_turning(3, 2, 1, 20); // one value at a time
    test_split_columns_turning(8192, 4, 1, 8); // many rows: a thread turns 3 heads, the last 2
    test_swiglu(5, 200);
    test_swiglu(3, 201);
    test_swiglu(1, 1000);
    for (size_t N : {70000, 70001}) test_small_arithmetic(N);
    for (int V : {1000, 1001}) {
        test_cross_entropy(V);
        test_logprobs(V);
        test_logits_backward(V);
        for (float temperature : {0.0f, 1.0f, 0.6f}) test_sample_tokens(V, temperature, {0, 1, 0});
        // Cuts inside runs of equal logits (make_head_rows' bf16 values repeat), top-p over
        // top-k's survivors, a nucleus of one token, and all three at once.
        for (filters f : {filters{50, 1, 0}, filters{0, 0.9, 0}, filters{200, 0.5, 0},
                          filters{0, 1, 0.05}, filters{0, 1e-4, 0}, filters{30, 0.8, 0.02}})
            test_sample_tokens(V, 0.7f, f);
    }
    { // a vocabulary smaller than the spans: most threads own no token
        test_sample_tokens(50, 0.7f, {10, 0.8, 0.02});
        test_sample_tokens(50, 1.0f, {0, 0.5, 0});
    }
    for (int V : {1000, 1001})
        for (float temperature : {0.0f, 1.0f})
            test_verify_drafts(V, temperature, {0, 1, 0});
    test_verify_drafts(1000, 0.7f, {30, 0.8, 0.02});
    test_verify_drafts(50, 1.3f, {10, 0.9, 0});
    for (int n : {1, 7, 300}) test_take_tokens(n);
    for (int K : {2048, 4104, 896})
        for (int M : {1, 3, 8})
            for (bool swiglu : {false, true}) test_few_rows_normed(M, K, swiglu);
    test_adamw();
}

// skinny.cu's shared-memory x, whose hazards are between warps: copies landing late, at issue,
// and at issue with one warp at a time running ahead (threads in index order).
static void test_skinny_schedules() {
    for (int when = 0; when < 3; when++) { // copies landing late, at issue, and at issue with
        emu::g_copies_land_at_issue = when > 0; // one warp at a time running ahead
        emu::g_warps_one_at_a_time = when == 2;
        test_skinny_rows(150, 136, 96, false);
        test_skinny_rows(130, 1024, 1024, false);
        test_skinny_rows(70, 832, 4096, false); // 7 chunks a split: a buffer staged again
        test_skinny_rows(70, 144, 64, true);
        for (bool shared_x : {true, false}) test_skinny_rows(50, 832, 4096, false, shared_x);
        test_skinny_rows(40, 144, 256, true);
    }
    emu::g_copies_land_at_issue = emu::g_warps_one_at_a_time = false;
}

int main() {
    // The kernels' __shared__ variables start each block as junk only if the emulator found them
    // in the symbol table (cuda_emulation_statics.cpp): a stripped or restructured program would
    // silently give them the last block's values again.
    size_t found = emu::static_smem_variables();
    printf("%-60s %zu %s\n", "static __shared__ variables the emulator poisons", found,
           found >= 16 ? "ok" : "FAIL");
    failures += found < 16;
    for (bool reversed : {false, true}) {
        emu::g_threads_in_reverse = reversed;
        test_every_kernel();
    }
    emu::g_threads_in_reverse = false;
    test_skinny_schedules();
    printf("%d comparison%s over tolerance\n", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
