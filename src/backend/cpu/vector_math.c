// Exponentials of whole rows at once, for the softmaxes of attention and the output head.
//
// Every element goes through the same 16-lane routine whatever the row's length and the element's
// place in it (a row's tail is padded to a whole vector), and sums run in 16 double lanes folded
// in a fixed order, so an element's bits, and a row's sum, are the same whether the row is
// computed in a training forward or decoded one position at a time. The exponential is glibc's
// vector math library (libmvec, linked with libm) where the compiler targets AVX-512 or AVX2,
// else the scalar expf.
#include <math.h>
#include <string.h>

#include "backend/cpu/internal.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { LANES = 16 };

// out[0..16) = exp(x[0..16)): one vector call per 16 floats.
#if defined(__AVX512F__)
__m512 _ZGVeN16v_expf(__m512 x); // libmvec
static inline void exp16(const float *x, float *out) {
    _mm512_storeu_ps(out, _ZGVeN16v_expf(_mm512_loadu_ps(x)));
}
#elif defined(__AVX2__)
__m256 _ZGVdN8v_expf(__m256 x); // libmvec
static inline void exp16(const float *x, float *out) {
    _mm256_storeu_ps(out, _ZGVdN8v_expf(_mm256_loadu_ps(x)));
    _mm256_storeu_ps(out + 8, _ZGVdN8v_expf(_mm256_loadu_ps(x + 8)));
}
#else
static inline void exp16(const float *x, float *out) {
    for (int l = 0; l < LANES; l++) out[l] = expf(x[l]);
}
#endif

// sums[l] += v[l] in double: lane l of every chunk adds into its own sum.
static inline void add16(double sums[LANES], const float v[LANES]) {
    for (int l = 0; l < LANES; l++) sums[l] += v[l];
}

// The 16 lanes folded pairwise (8 + 8, 4 + 4, ...): a fixed tree.
static double fold16(double sums[LANES]) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) sums[l] += sums[l + w];
    return sums[0];
}

double weft_cpu_exp_sum(const float *x, float sign, float shift, float *out, size_t n) {
    double sums[LANES] = {0};
    float in[LANES], e[LANES];
    size_t j = 0;
    for (; j + LANES <= n; j += LANES) {
        for (int l = 0; l < LANES; l++) in[l] = sign * x[j + l] - shift;
        exp16(in, e);
        if (out) memcpy(out + j, e, sizeof e);
        add16(sums, e);
    }
    if (j < n) {
        for (int l = 0; l < LANES; l++) in[l] = j + l < n ? sign * x[j + l] - shift : -INFINITY;
        exp16(in, e);
        if (out) memcpy(out + j, e, sizeof(float) * (n - j));
        add16(sums, e);
    }
    return fold16(sums);
}

double weft_cpu_dot_shifted(const float *e, const float *x, float shift, size_t n) {
    double sums[LANES] = {0};
    size_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) sums[l] += e[j + l] * ((double)x[j + l] - shift);
    for (int l = 0; j < n; j++, l++) sums[l] += e[j] * ((double)x[j] - shift);
    return fold16(sums);
}

float weft_cpu_row_max(const float *x, int n) {
    float m[LANES];
    for (int l = 0; l < LANES; l++) m[l] = -INFINITY;
    int j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
    for (; j < n; j++) m[0] = x[j] > m[0] ? x[j] : m[0];
    for (int l = 1; l < LANES; l++) m[0] = m[l] > m[0] ? m[l] : m[0];
    return m[0];
}
