// The CUDA op test's fixtures (test_cuda_ops_match_cpu.c): tensors held by the CPU backend and
// the CUDA backend at once, filled alike, and their comparison. One test program includes it.
#pragma once
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../testing.h"
#include "backend/backend.h"

// Outputs stored in bf16 carry its rounding (at most 2^-8 of an element); fp32 outputs only
// summation order (GPU atomics), near 1e-7. Measured on the emulated backend: 4.4e-3 and 1.2e-7.
static const double BF16_TOL = 1e-2, F32_TOL = 1e-5;

static weft_backend *cpu, *gpu;
static weft_rng rng;
static int failures;

// A tensor held by both backends: host values (bf16-exact where the GPU stores bf16), the CPU
// backend's fp32 copy and the GPU backend's copy in `type`.
typedef struct twin {
    size_t n;
    weft_dtype type;
    float *host;
    void *c, *g;
} twin;

static float bf16_round(float x) { // as the GPU backend's from_f32 rounds
    return weft_f32_from_bf16(weft_bf16_from_f32(x));
}

static twin make(size_t n, weft_dtype type, double scale, bool random) {
    twin t = {n, type, weft_alloc(n * sizeof(float) + 4), NULL, NULL};
    for (size_t i = 0; i < n && random; i++) {
        float v = (float)(weft_rng_normal(&rng) * scale);
        t.host[i] = type == WEFT_BF16 ? bf16_round(v) : v;
    }
    t.c = cpu->alloc(cpu, n * sizeof(float));
    t.g = gpu->alloc(gpu, n * weft_dtype_size(type));
    cpu->from_f32(cpu, t.c, WEFT_F32, t.host, n);
    gpu->from_f32(gpu, t.g, type, t.host, n);
    return t;
}

static twin act(size_t n, double scale) { return make(n, WEFT_BF16, scale, true); }
static twin f32(size_t n, double scale) { return make(n, WEFT_F32, scale, true); }
static twin zeros(size_t n, weft_dtype type) { return make(n, type, 0, false); }

static void release(twin *t) {
    cpu->free(cpu, t->c);
    gpu->free(gpu, t->g);
    weft_free(t->host);
}

// Integer arrays (ids, positions, offsets) on both devices.
typedef struct ints {
    int32_t *c, *g;
} ints;

static ints upload_ints(const int32_t *v, size_t n) {
    ints t = {cpu->alloc(cpu, n * 4 + 4), gpu->alloc(gpu, n * 4 + 4)};
    cpu->to_device(cpu, t.c, v, n * 4);
    gpu->to_device(gpu, t.g, v, n * 4);
    return t;
}

static void release_ints(ints *t) {
    cpu->free(cpu, t->c);
    gpu->free(gpu, t->g);
}

// max|gpu - cpu| / max|cpu| of the tensor's current contents, reported against tol.
static void compare(const char *what, const twin *t, double tol) {
    float *a = weft_alloc(t->n * sizeof(float) + 4), *b = weft_alloc(t->n * sizeof(float) + 4);
    cpu->to_f32(cpu, a, t->c, WEFT_F32, t->n);
    gpu->to_f32(gpu, b, t->g, t->type, t->n);
    double diff = 0, ref = 0;
    bool finite = true;
    for (size_t i = 0; i < t->n; i++) {
        finite = finite && isfinite(b[i]);
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        ref = fmax(ref, fabs((double)a[i]));
    }
    double rel = ref > 0 ? diff / ref : diff;
    bool ok = finite && rel <= tol;
    printf("%-52s rel err %.2e (tol %.0e) %s\n", what, rel, tol, ok ? "ok" : "FAIL");
    failures += !ok;
    weft_free(a);
    weft_free(b);
}

// Whether the GPU copies of a and b hold the same bits (bf16 and f32 both widen exactly).
static bool same_bits(const twin *a, const twin *b) {
    float *x = weft_alloc(a->n * sizeof(float) + 4), *y = weft_alloc(b->n * sizeof(float) + 4);
    gpu->to_f32(gpu, x, a->g, a->type, a->n);
    gpu->to_f32(gpu, y, b->g, b->type, b->n);
    bool same = a->n == b->n && !memcmp(x, y, a->n * sizeof(float));
    weft_free(x);
    weft_free(y);
    return same;
}

// GPU copies of two tensors alike, printed as a check: the fused op's bits against the ops apart.
static void expect_same_bits(const char *what, const twin *a, const twin *b) {
    bool same = same_bits(a, b);
    printf("%-52s %s\n", what, same ? "ok" : "FAIL");
    failures += !same;
}
