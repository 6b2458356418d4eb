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

// The 16 lanes folded pairwise (8 + 8, 4 + 4, ...): a fixed tree.
static double fold16(double sums[LANES]) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) sums[l] += sums[l + w];
    return sums[0];
}

// exp_chunk: e = exp(sign x - shift) for the first `lanes` (1 to 16) lanes of a chunk (x read only
// there) and exp(-inf) = 0 past them; stored to out (where given, first `lanes` only) and added,
// lane l into double sum l. As vectors where the CPU has them (the compiler kept a scalar loop's
// lane arrays in memory, which took as long as the exponentials): the operations, so the bits, are
// the scalar ones.
#if defined(__AVX512F__)
__m512 _ZGVeN16v_expf(__m512 x); // libmvec

typedef struct sums16 {
    __m512d lo, hi;
} sums16;

static inline void exp_chunk(const float *x, float sign, float shift, int lanes, float *out,
                             sums16 *s) {
    __mmask16 valid = (__mmask16)((1u << lanes) - 1);
    __m512 in = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(sign), _mm512_maskz_loadu_ps(valid, x)),
                              _mm512_set1_ps(shift));
    __m512 e = _ZGVeN16v_expf(_mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), in));
    if (out) _mm512_mask_storeu_ps(out, valid, e);
    __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
    s->lo = _mm512_add_pd(s->lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s->hi = _mm512_add_pd(s->hi, _mm512_cvtps_pd(high));
}

static void sums_store(const sums16 *s, double out[LANES]) {
    _mm512_storeu_pd(out, s->lo), _mm512_storeu_pd(out + 8, s->hi);
}
#elif defined(__AVX2__)
__m256 _ZGVdN8v_expf(__m256 x); // libmvec

typedef struct sums16 {
    __m256d q[4];
} sums16;

static inline void exp_chunk(const float *x, float sign, float shift, int lanes, float *out,
                             sums16 *s) {
    for (int h = 0; h < 2; h++, lanes -= 8, x += 8) {
        __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 in = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(sign), _mm256_maskload_ps(x, valid)),
                                  _mm256_set1_ps(shift));
        __m256 e = _ZGVdN8v_expf(
            _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), in, _mm256_castsi256_ps(valid)));
        if (out) _mm256_maskstore_ps(out + 8 * h, valid, e);
        s->q[2 * h] = _mm256_add_pd(s->q[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s->q[2 * h + 1] = _mm256_add_pd(s->q[2 * h + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
}

static void sums_store(const sums16 *s, double out[LANES]) {
    for (int q = 0; q < 4; q++) _mm256_storeu_pd(out + 4 * q, s->q[q]);
}
#else
typedef struct sums16 {
    double l[LANES];
} sums16;

static inline void exp_chunk(const float *x, float sign, float shift, int lanes, float *out,
                             sums16 *s) {
    for (int l = 0; l < LANES; l++) {
        float e = expf(l < lanes ? sign * x[l] - shift : -INFINITY);
        if (out && l < lanes) out[l] = e;
        s->l[l] += e;
    }
}

static void sums_store(const sums16 *s, double out[LANES]) {
    memcpy(out, s->l, sizeof s->l);
}
#endif

double weft_cpu_exp_sum(const float *x, float sign, float shift, float *out, size_t n) {
    sums16 s;
    memset(&s, 0, sizeof s); // +0.0 in every lane
    for (size_t j = 0; j < n; j += LANES)
        exp_chunk(x + j, sign, shift, n - j < LANES ? (int)(n - j) : LANES, out ? out + j : NULL,
                  &s);
    double sums[LANES];
    sums_store(&s, sums);
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
