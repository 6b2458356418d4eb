// The tensor-core attention kernels (src/backend/cuda/attention_mma.cuh), run unchanged on the CPU
// through cuda_emulation.h, match a float64 reference of causal varlen grouped-query attention:
// forward out and lse, backward dq, dk and dv, on whole documents, documents spanning several
// tiles and blocks, and context-parallel chunks. It needs no GPU, so fragment-layout, staging
// and mask mistakes are caught wherever the CUDA headers are installed; the GPU itself is
// checked by test_cuda_ops_match_cpu.
#include "cuda_emulation.h"

#include "backend/cuda/attention_mma.cu" // kernels and launchers, launched by the emulator

#include <math.h>

#include <algorithm>
#include <string>

namespace {

// bf16 inputs and outputs, fp32 accumulation: errors sit near bf16 rounding (2^-9 = 2e-3).
constexpr double BF16_TOL = 1e-2, LSE_TOL = 1e-5;
int failures = 0;
uint64_t rng_state = 20261121;

float uniform() { // in [-1, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / (1 << 24))) * 2.0f - 1.0f;
}

std::vector<bf16> random_bf16(size_t n) {
    std::vector<bf16> x(n);
    for (auto &e : x) e = __float2bfloat16_rn(uniform());
    return x;
}

std::vector<double> widen(const std::vector<bf16> &x) {
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); i++) out[i] = __bfloat162float(x[i]);
    return out;
}

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

// float64 attention on the bf16 inputs: out (Tq, H, D), lse (H, Tq); then, from dout, the
// gradients dq (Tq, H, D), dk and dv (Tkv, KV, D).
struct reference {
    std::vector<double> out, lse, dq, dk, dv;
};

reference attend(const layout &l, const std::vector<double> &q, const std::vector<double> &k,
                 const std::vector<double> &v, const std::vector<double> &dout) {
    int H = l.H, KV = l.KV, D = l.D, Tq = l.Tq(), Tkv = l.Tkv();
    double scale = 1.0 / sqrt((double)D);
    reference r{std::vector<double>((size_t)Tq * H * D), std::vector<double>((size_t)H * Tq),
                std::vector<double>((size_t)Tq * H * D), std::vector<double>((size_t)Tkv * KV * D),
                std::vector<double>((size_t)Tkv * KV * D)};
    for (int d = 0; d < l.n_docs(); d++)
        for (int i = l.cu_q[d]; i < l.cu_q[d + 1]; i++)
            for (int h = 0; h < H; h++) {
                int g = h / (H / KV), j0 = l.cu_kv[d], n = l.q_pos[i] + 1;
                const double *qi = &q[((size_t)i * H + h) * D], *doi = &dout[((size_t)i * H + h) * D];
                std::vector<double> s(n), dp(n);
                double mx = -INFINITY, sum = 0, delta = 0;
                for (int j = 0; j < n; j++) {
                    const double *kj = &k[((size_t)(j0 + j) * KV + g) * D];
                    const double *vj = &v[((size_t)(j0 + j) * KV + g) * D];
                    s[j] = dp[j] = 0;
                    for (int e = 0; e < D; e++) {
                        s[j] += qi[e] * kj[e] * scale;
                        dp[j] += doi[e] * vj[e];
                    }
                    mx = std::max(mx, s[j]);
                }
                for (int j = 0; j < n; j++) sum += exp(s[j] - mx);
                double lse = mx + log(sum);
                r.lse[(size_t)h * Tq + i] = lse;
                double *oi = &r.out[((size_t)i * H + h) * D];
                for (int j = 0; j < n; j++) {
                    double p = exp(s[j] - lse);
                    delta += p * dp[j];
                    for (int e = 0; e < D; e++) oi[e] += p * v[((size_t)(j0 + j) * KV + g) * D + e];
                }
                for (int j = 0; j < n; j++) {
                    double p = exp(s[j] - lse), ds = p * (dp[j] - delta);
                    size_t kv_at = ((size_t)(j0 + j) * KV + g) * D;
                    for (int e = 0; e < D; e++) {
                        r.dq[((size_t)i * H + h) * D + e] += scale * ds * k[kv_at + e];
                        r.dk[kv_at + e] += scale * ds * qi[e];
                        r.dv[kv_at + e] += p * doi[e];
                    }
                }
            }
    return r;
}

template <typename T> double value_of(T x) { return x; }
template <> double value_of(bf16 x) { return __bfloat162float(x); }

// max |got - want| / max |want|, every element finite (outputs start as NaN: unwritten fails).
template <typename T>
void compare(const layout &l, const char *what, const std::vector<T> &got,
             const std::vector<double> &want, double tol) {
    double diff = 0, ref = 0;
    bool finite = true;
    for (size_t i = 0; i < want.size(); i++) {
        double x = value_of(got[i]);
        finite = finite && std::isfinite(x);
        diff = std::max(diff, fabs(x - want[i]));
        ref = std::max(ref, fabs(want[i]));
    }
    double rel = ref > 0 ? diff / ref : diff;
    bool ok = finite && rel <= tol;
    printf("%-44s %-4s rel err %.2e (tol %.0e) %s\n", l.label.c_str(), what, rel, tol,
           ok ? "ok" : "FAIL");
    failures += !ok;
}

void check(const layout &l) {
    int H = l.H, KV = l.KV, D = l.D, Tq = l.Tq(), Tkv = l.Tkv();
    std::vector<bf16> q = random_bf16((size_t)Tq * H * D), k = random_bf16((size_t)Tkv * KV * D);
    std::vector<bf16> v = random_bf16((size_t)Tkv * KV * D), dout = random_bf16((size_t)Tq * H * D);
    reference want = attend(l, widen(q), widen(k), widen(v), widen(dout));

    weft_cuda_attention_args a = {l.n_docs(), Tq, Tkv, H, KV, D,
                                  l.cu_q.data(), l.cu_kv.data(), l.q_pos.data()};
    bf16 nan = __ushort_as_bfloat16(0x7fff);
    std::vector<bf16> out(q.size(), nan), dq(q.size(), nan), dk(k.size(), nan), dv(v.size(), nan);
    std::vector<float> lse((size_t)H * Tq, NAN);
    weft_cuda_attention_forward_mma(nullptr, &a, q.data(), k.data(), v.data(), out.data(),
                                    lse.data());
    compare(l, "out", out, want.out, BF16_TOL);
    compare(l, "lse", lse, want.lse, LSE_TOL);

    // delta from the kernel's own bf16 output, as weft_cuda_attention_delta computes it.
    std::vector<float> delta((size_t)H * Tq);
    for (int i = 0; i < Tq; i++)
        for (int h = 0; h < H; h++) {
            float acc = 0;
            for (int e = 0; e < D; e++) {
                size_t at = ((size_t)i * H + h) * D + e;
                acc += __bfloat162float(out[at]) * __bfloat162float(dout[at]);
            }
            delta[(size_t)h * Tq + i] = acc;
        }
    std::vector<float> partials(weft_cuda_attention_partials_bytes(&a) / sizeof(float), NAN);
    weft_cuda_attention_backward_mma(nullptr, &a, q.data(), k.data(), v.data(), lse.data(),
                                     dout.data(), delta.data(), dq.data(), dk.data(), dv.data(),
                                     partials.data());
    compare(l, "dq", dq, want.dq, BF16_TOL);
    compare(l, "dk", dk, want.dk, BF16_TOL);
    compare(l, "dv", dv, want.dv, BF16_TOL);
}

} // namespace

int main() {
    std::vector<int> mixed = {1, 33, 5, 70, 2};
    check(whole("whole [1,33,5,70,2] H4 KV2 D16", 4, 2, 16, mixed));
    check(whole("whole [1,33,5,70,2] H6 KV2 D64", 6, 2, 64, mixed));
    check(whole("whole [1,33,5,70,2] H2 KV2 D80", 2, 2, 80, mixed));
    check(whole("whole [100] H2 KV1 D128", 2, 1, 128, {100}));
    check(whole("whole [150,7,90] H2 KV1 D32 (tiles, blocks)", 2, 1, 32, {150, 7, 90}));
    check(cp_chunks("CP rank 1/2 [40,72] H4 KV2 D32", 4, 2, 32, {40, 72}, 1, 2));
    check(cp_chunks("CP rank 0/2 [136,64] H2 KV1 D64", 2, 1, 64, {136, 64}, 0, 2));
    printf("%d comparison%s over tolerance\n", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
