// One vector type for the CPU kernels that are written with intrinsics (few_rows.c,
// bf16_weights.c): as wide as the CPU's registers, W floats.
#pragma once
#ifdef __AVX__
#include <immintrin.h>

#ifdef __AVX512F__
typedef __m512 vec;
enum { W = 16 };
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, x) _mm512_storeu_ps(p, x)
#define VSET1(x) _mm512_set1_ps(x)
#define VMUL(x, y) _mm512_mul_ps(x, y)
#define VADD(x, y) _mm512_add_ps(x, y)
#define VFMA(x, y, z) _mm512_fmadd_ps(x, y, z)
#else
typedef __m256 vec;
enum { W = 8 };
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, x) _mm256_storeu_ps(p, x)
#define VSET1(x) _mm256_set1_ps(x)
#define VMUL(x, y) _mm256_mul_ps(x, y)
#define VADD(x, y) _mm256_add_ps(x, y)
#ifdef __FMA__
#define VFMA(x, y, z) _mm256_fmadd_ps(x, y, z)
#else
#define VFMA(x, y, z) VADD(VMUL(x, y), z) // never taken by few_rows.c: without FMA no kind is fused
#endif
#endif

#endif
