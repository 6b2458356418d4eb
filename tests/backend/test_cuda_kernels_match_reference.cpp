// Every CUDA kernel of the backend (src/backend/cuda/*.cu), launcher included, run unchanged on the
// CPU through cuda_emulation.h (cuda_emulated_kernels.cpp), matches a float64 reference:
// embedding, RMSNorm, bias, RoPE, SwiGLU, the small arithmetic, the output heads (fused
// cross-entropy, log-probs and entropy, the weighted logits backward), AdamW, and
// both attention families (the tensor-core one and the fp32 one) on whole documents, documents
// spanning several tiles and blocks, and context-parallel chunks, and the paged KV cache's store
// and attention (shuffled and shared blocks, decoding and prefill continuations, grouped-query
// heads). No GPU is needed, so indexing, masking and barrier mistakes fail in CI; on a GPU,
// test_cuda_ops_match_cpu checks the same ops for real.
#include "cuda_emulation.h"

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

#include <math.h>

#include <algorithm>
#include <string>

namespace {

// Outputs stored in bf16 carry its rounding (2^-9 = 2e-3 relative); fp32 ones only fp32's.
constexpr double BF16_TOL = 1e-2, F32_TOL = 1e-5;
// The launchers' queue: the emulator runs every launch at once, on no stream.
const weft_cuda_queue emulated_queue = {nullptr, false};
const weft_cuda_stream queue = &emulated_queue;
int failures = 0;
uint64_t rng_state = 20261121;

float uniform(float lo = -1.0f, float hi = 1.0f) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / (1 << 24)));
}

double value_of(float x) { return x; }
double value_of(double x) { return x; }
double value_of(bf16 x) { return __bfloat162float(x); }

std::vector<bf16> random_bf16(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<bf16> x(n);
    for (auto &e : x) e = __float2bfloat16_rn(uniform(lo, hi));
    return x;
}
std::vector<float> random_f32(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> x(n);
    for (auto &e : x) e = uniform(lo, hi);
    return x;
}
template <typename T> std::vector<double> widen(const std::vector<T> &x) {
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); i++) out[i] = value_of(x[i]);
    return out;
}

// max |got - want| / max |want|, and every element finite (outputs start as NaN where the kernel
// overwrites them, so an element it never writes fails).
template <typename T>
void compare(const std::string &what, const std::vector<T> &got, const std::vector<double> &want,
             double tol) {
    double diff = 0, ref = 0;
    bool finite = got.size() == want.size();
    for (size_t i = 0; i < want.size() && finite; i++) {
        double x = value_of(got[i]);
        finite = std::isfinite(x);
        diff = std::max(diff, fabs(x - want[i]));
        ref = std::max(ref, fabs(want[i]));
    }
    double rel = ref > 0 ? diff / ref : diff;
    bool ok = finite && rel <= tol;
    printf("%-76s rel err %.2e (tol %.0e) %s\n", what.c_str(), rel, tol, ok ? "ok" : "FAIL");
    failures += !ok;
}

const bf16 NAN_BF16 = __ushort_as_bfloat16(0x7fff);

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

// Sizes come in pairs: a multiple of 8 (the kernels' 16-byte vector path) and not (one at a time).
std::string sized(const char *what, size_t n) {
    return std::string(what) + " (" + std::to_string(n) + ")";
}

// Fails unless the launcher's vector_width takes the path the size was chosen for, so neither
// path goes untested unnoticed.
void expect_path(const char *what, size_t n, int width) {
    int want = n % 8 == 0 ? 8 : 1;
    printf("%-76s %d-wide path %s\n", sized(what, n).c_str(), width, width == want ? "ok" : "FAIL");
    failures += width != want;
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
    weft_cuda_split_columns(queue, fused.data(), ptrs, widths, 3, rows, false);
    weft_cuda_split_columns(queue, back.data(), ptrs, widths, 3, rows, true);
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
}

// Draws from the rows of make_head_rows (ties for the largest logit included) at uniform points
// u, among them 0 and just below 1, against the inverse CDF walked in float64 token by token.
void test_sample_tokens(int V, float temperature) {
    head_rows h = make_head_rows(V);
    int n = 3 * h.T;
    std::vector<int32_t> rows(n), tokens(n, -1), want_tokens(n);
    std::vector<double> u(n), want_processed(n);
    std::vector<float> processed(n, NAN);
    for (int d = 0; d < n; d++) {
        rows[d] = (d * 7) % h.T;
        u[d] = d == 0 ? 0.0 : d == 1 ? 1.0 - 1e-12 : (double)uniform(0.0f, 1.0f);
        const bf16 *row = &h.logits[(size_t)rows[d] * V];
        int arg = 0;
        for (int j = 1; j < V; j++)
            if (value_of(row[j]) > value_of(row[arg])) arg = j;
        want_tokens[d] = arg, want_processed[d] = 0.0;
        if (temperature == 0) continue;
        std::vector<double> w(V);
        double mass = 0, cumulative = 0;
        for (int j = 0; j < V; j++)
            mass += w[j] = exp((value_of(row[j]) - value_of(row[arg])) / temperature);
        int token = V - 1;
        for (int j = 0; j < V; j++)
            if (u[d] * mass < (cumulative += w[j])) {
                token = j;
                break;
            }
        want_tokens[d] = token, want_processed[d] = log(w[token] / mass);
    }
    weft_cuda_sample_tokens(queue, h.logits.data(), rows.data(), u.data(), n, V, temperature,
                            tokens.data(), processed.data());
    int wrong = 0;
    for (int d = 0; d < n; d++) wrong += tokens[d] != want_tokens[d];
    std::string name = sized("sample_tokens", V) + " T " + std::to_string(temperature);
    printf("%-76s %d of %d tokens differ %s\n", (name + " tokens").c_str(), wrong, n,
           wrong ? "FAIL" : "ok");
    failures += wrong > 0;
    compare(name + " processed log-prob", processed, want_processed, F32_TOL);
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
// fixed order (HOPPER_ORDERED).
enum attention_kind { SIMT, MMA, HOPPER, HOPPER_ORDERED };

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
    bool hopper = kind == HOPPER || kind == HOPPER_ORDERED, ordered = kind == HOPPER_ORDERED;
    size_t scratch_bytes = hopper ? weft_cuda_attention_hopper_scratch_bytes(&a, ordered)
                                  : weft_cuda_attention_partials_bytes(&a);
    std::vector<float> partials(scratch_bytes / sizeof(float), NAN);
    const char *family = kind == SIMT ? "simt   " : kind == MMA ? "mma    " : "hopper ";
    std::string name = std::string("attention/") + family + l.label + note +
                       (ordered ? " (ordered dq)" : "");
    if (hopper) {
        if (!weft_cuda_attention_hopper_covers(&a) ||
            !weft_cuda_attention_forward_hopper(queue, &a, q.data(), k.data(), v.data(),
                                                out.data(), lse.data())) {
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
    weft_cuda_attention_delta(queue, out.data(), dout.data(), delta.data(), Tq, H, D);
    if (kind == SIMT) {
        weft_cuda_attention_backward_simt(queue, &a, q.data(), k.data(), v.data(), lse.data(),
                                          dout.data(), delta.data(), dq.data(), dk.data(),
                                          dv.data());
    } else if (hopper) {
        if (!weft_cuda_attention_backward_hopper(queue, &a, q.data(), k.data(), v.data(),
                                                 lse.data(), dout.data(), delta.data(), dq.data(),
                                                 dk.data(), dv.data(), partials.data(), ordered)) {
            printf("%-76s FAIL: the hopper backward refused it\n", name.c_str());
            failures++;
            return;
        }
    } else {
        weft_cuda_attention_backward_mma(queue, &a, q.data(), k.data(), v.data(), lse.data(),
                                         dout.data(), delta.data(), dq.data(), dk.data(),
                                         dv.data(), partials.data());
    }
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
// sequences in two); a small split_keys makes many splits of up to one tile per warp.
void test_paged_attention(const paged_case &c, int split_keys, const char *note = "") {
    paged_batch b = make_paged_batch(c);
    int Tq = b.Tq();
    std::vector<bf16> q = random_bf16((size_t)Tq * c.H * c.D), out(q.size(), NAN_BF16);
    std::vector<float> lse((size_t)c.H * Tq, NAN);
    std::vector<double> want_out, want_lse;
    paged_reference(c, b, q, want_out, want_lse);
    weft_cuda_paged_args a = {b.pool.data(), b.p.layers, b.p.block_size, b.p.width,
                              (int)c.seqs.size(), Tq, b.max_blocks, c.H, c.KV, c.D,
                              b.cu_q.data(), b.q_pos.data(), b.tables.data(), split_keys};
    std::vector<float> partials(weft_cuda_paged_partials_bytes(&a) / sizeof(float), NAN);
    weft_cuda_paged_attention(queue, &a, 1, q.data(), out.data(), lse.data(), partials.data());
    std::string name = "paged_attention " + c.label + " split " +
                       (split_keys ? std::to_string(split_keys) : std::string("auto")) + note;
    compare(name + " out", out, want_out, BF16_TOL);
    compare(name + " lse", lse, want_lse, F32_TOL);
}

} // namespace

int main() {
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
    test_swiglu(5, 200);
    test_swiglu(3, 201);
    test_swiglu(1, 1000);
    for (size_t N : {70000, 70001}) test_small_arithmetic(N);
    for (int V : {1000, 1001}) {
        test_cross_entropy(V);
        test_logprobs(V);
        test_logits_backward(V);
        for (float temperature : {0.0f, 1.0f, 0.6f}) test_sample_tokens(V, temperature);
    }
    test_adamw();
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
    // Hopper's tiles are 128 query rows by 128 keys: these span several of both.
    const layout hopper_layouts[] = {
        whole("whole [1,33,5,70,2] H6 KV2 D64", 6, 2, 64, mixed),
        whole("whole [300,7,190] H2 KV1 D64 (tiles, blocks)", 2, 1, 64, {300, 7, 190}),
        whole("whole [100,200] H2 KV1 D128", 2, 1, 128, {100, 200}),
        cp_chunks("CP rank 0/2 [136,64] H2 KV1 D64", 2, 1, 64, {136, 64}, 0, 2),
        cp_chunks("CP rank 1/2 [520] H4 KV2 D128", 4, 2, 128, {520}, 1, 2),
        // Eight query heads to a kv head; keys in blocks that end mid-document, query steps that
        // start mid-block, a one-row document between long ones.
        whole("whole [400,1,333] H8 KV1 D128 (grouped, steps)", 8, 1, 128, {400, 1, 333}),
    };
    for (const layout &l : layouts) test_attention(l, SIMT);
    for (bool early : {false, true}) { // copies landing as late, then as early as allowed
        emu::g_copies_land_at_issue = early;
        const char *when = early ? " (copies land early)" : "";
        for (const layout &l : layouts) test_attention(l, MMA, when);
        for (const layout &l : hopper_layouts) test_attention(l, HOPPER, when);
        for (const layout &l : hopper_layouts) test_attention(l, HOPPER_ORDERED, when);
    }
    test_attention(whole("whole [1,33,5,70,2] H2 KV1 D40", 2, 1, 40, mixed), SIMT); // simt only
    for (int width : {1032, 300}) test_kv_store(width); // the threads of a row loop twice
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
    };
    for (bool early : {false, true}) {
        emu::g_copies_land_at_issue = early;
        for (const paged_case &c : paged_cases)
            for (int split_keys : {0, 40})
                test_paged_attention(c, split_keys, early ? " (copies land early)" : "");
    }
    printf("%d comparison%s over tolerance\n", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
