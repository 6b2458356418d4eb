// What the emulated kernel tests share (test_cuda_*_match_reference.cpp): random inputs, float64
// references' comparisons with a tolerance, the failure count, and the launchers' queue. Each test
// is its own program, so the state here (the generator, the count) is per test.
#pragma once
#include "cuda_emulation.h"

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

#include <math.h>

#include <algorithm>
#include <string>
#include <vector>

// Outputs stored in bf16 carry its rounding (2^-9 = 2e-3 relative); fp32 ones only fp32's.
inline constexpr double BF16_TOL = 1e-2, F32_TOL = 1e-5;
// The launchers' queue: the emulator runs every launch at once, on no stream; the products ask
// for their weights as an early-launched kernel on sm_90 does (the prefetch's checks), and skinny
// stages x in shared memory from 33 rows, as cuda.c's default queue has it.
inline const weft_cuda_queue emulated_queue = {nullptr, false, true, true};
inline const weft_cuda_stream queue = &emulated_queue;
inline int failures = 0;
inline uint64_t rng_state = 20261121;

inline float uniform(float lo = -1.0f, float hi = 1.0f) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / (1 << 24)));
}

inline double value_of(float x) { return x; }
inline double value_of(double x) { return x; }
inline double value_of(bf16 x) { return __bfloat162float(x); }

inline std::vector<bf16> random_bf16(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<bf16> x(n);
    for (auto &e : x) e = __float2bfloat16_rn(uniform(lo, hi));
    return x;
}
inline std::vector<float> random_f32(size_t n, float lo = -1.0f, float hi = 1.0f) {
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
    std::string name = what + (emu::g_threads_in_reverse ? " (threads reversed)" : "");
    printf("%-76s rel err %.2e (tol %.0e) %s\n", name.c_str(), rel, tol, ok ? "ok" : "FAIL");
    failures += !ok;
}

inline const bf16 NAN_BF16 = __ushort_as_bfloat16(0x7fff);

// Sizes come in pairs: a multiple of 8 (the kernels' 16-byte vector path) and not (one at a time).
inline std::string sized(const char *what, size_t n) {
    return std::string(what) + " (" + std::to_string(n) + ")";
}

// A property that holds or not, printed as compare() prints a tolerance.
inline void expect(const std::string &what, bool holds) {
    std::string name = what + (emu::g_threads_in_reverse ? " (threads reversed)" : "");
    printf("%-76s %s\n", name.c_str(), holds ? "ok" : "FAIL");
    failures += !holds;
}

// Fails unless the launcher's vector_width takes the path the size was chosen for, so neither
// path goes untested unnoticed.
inline void expect_path(const char *what, size_t n, int width) {
    int want = n % 8 == 0 ? 8 : 1;
    printf("%-76s %d-wide path %s\n", sized(what, n).c_str(), width, width == want ? "ok" : "FAIL");
    failures += width != want;
}
