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

// The 16 lanes folded pairwise (8 + 8, 4 + 4, ...): a fixed tree.
static double fold16(double sums[LANES]) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) sums[l] += sums[l + w];
    return sums[0];
}

#if defined(__AVX512F__) || defined(__AVX2__)
// A chunk of 16 as vectors: e = exp(sign x - shift) for the lanes of `mask` (x read only there)
// and exp(-inf) = 0 past them, stored to out (where given) and added into the double sums.
// Written with intrinsics because the compiler kept the scalar version's arrays in memory (as
// long as the exponentials themselves); the operations, so the bits, are the scalar ones.
#if defined(__AVX512F__)
typedef struct sums16 {
    __m512d lo, hi;
} sums16;

static inline void exp_chunk(const float *x, __m512 sign, __m512 shift, unsigned mask, float *out,
                             sums16 *s) {
    __m512 in = _mm512_sub_ps(_mm512_mul_ps(sign, _mm512_maskz_loadu_ps(mask, x)), shift);
    if (mask != 0xffffu) in = _mm512_mask_blend_ps(mask, _mm512_set1_ps(-INFINITY), in);
    __m512 e = _ZGVeN16v_expf(in);
    if (out) _mm512_mask_storeu_ps(out, mask, e);
    s->lo = _mm512_add_pd(s->lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s->hi = _mm512_add_pd(
        s->hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
}

static double exp_sum_vectors(const float *x, float sign, float shift, float *out, size_t n) {
    sums16 s = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512 vsign = _mm512_set1_ps(sign), vshift = _mm512_set1_ps(shift);
    size_t j = 0;
    for (; j + LANES <= n; j += LANES) exp_chunk(x + j, vsign, vshift, 0xffffu, out ? out + j : NULL, &s);
    if (j < n)
        exp_chunk(x + j, vsign, vshift, (1u << (n - j)) - 1, out ? out + j : NULL, &s);
    double sums[LANES];
    _mm512_storeu_pd(sums, s.lo), _mm512_storeu_pd(sums + 8, s.hi);
    return fold16(sums);
}
#else
typedef struct sums16 {
    __m256d q[4];
} sums16;

// Eight lanes of a chunk: `lanes` of them from x, the rest exp(-inf).
static inline __m256 exp8(const float *x, __m256 sign, __m256 shift, int lanes) {
    __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 in = _mm256_sub_ps(_mm256_mul_ps(sign, _mm256_maskload_ps(x, valid)), shift);
    in = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), in, _mm256_castsi256_ps(valid));
    return _ZGVdN8v_expf(in);
}

static inline void exp_chunk(const float *x, __m256 sign, __m256 shift, int lanes, float *out,
                             sums16 *s) {
    __m256 e[2];
    for (int h = 0; h < 2; h++) {
        int here = lanes - 8 * h < 0 ? 0 : lanes - 8 * h > 8 ? 8 : lanes - 8 * h;
        e[h] = exp8(x + 8 * h, sign, shift, here);
        if (out && here == 8) _mm256_storeu_ps(out + 8 * h, e[h]);
        else if (out) _mm256_maskstore_ps(out + 8 * h, _mm256_cmpgt_epi32(_mm256_set1_epi32(here),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), e[h]);
        s->q[2 * h] = _mm256_add_pd(s->q[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(e[h])));
        s->q[2 * h + 1] = _mm256_add_pd(s->q[2 * h + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(e[h], 1)));
    }
}

static double exp_sum_vectors(const float *x, float sign, float shift, float *out, size_t n) {
    sums16 s = {{_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}};
    __m256 vsign = _mm256_set1_ps(sign), vshift = _mm256_set1_ps(shift);
    size_t j = 0;
    for (; j + LANES <= n; j += LANES) exp_chunk(x + j, vsign, vshift, LANES, out ? out + j : NULL, &s);
    if (j < n) exp_chunk(x + j, vsign, vshift, (int)(n - j), out ? out + j : NULL, &s);
    double sums[LANES];
    for (int q = 0; q < 4; q++) _mm256_storeu_pd(sums + 4 * q, s.q[q]);
    return fold16(sums);
}
#endif
#endif

// sums[l] += v[l] in double: lane l of every chunk adds into its own sum.
static inline void add16(double sums[LANES], const float v[LANES]) {
    for (int l = 0; l < LANES; l++) sums[l] += v[l];
}

double weft_cpu_exp_sum(const float *x, float sign, float shift, float *out, size_t n) {
#if defined(__AVX512F__) || defined(__AVX2__)
    return exp_sum_vectors(x, sign, shift, out, n);
#endif
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
