// Times weft's CUDA attention (forward, and forward + backward) on packed causal documents, the
// kernels alone, for bench/gpu_attention.py to set against PyTorch's SDPA on the same shape.
//
//   bench_attention H KV D LEN... [--iters N]
//
// Prints one JSON line: the shape, milliseconds per forward and per forward + backward, and the
// kernel family used (WEFT_CUDA_ATTENTION picks it).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// A device tensor of n bf16 (or f32) values drawn uniformly from [-1, 1).
static void *random_tensor(weft_backend *be, size_t n, weft_dtype type, unsigned *seed) {
    float *host = weft_alloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) host[i] = (float)rand_r(seed) / RAND_MAX * 2.0f - 1.0f;
    void *dev = be->alloc(be, n * weft_dtype_size(type));
    be->from_f32(be, dev, type, host, n);
    weft_free(host);
    return dev;
}

static int32_t *upload_ints(weft_backend *be, const int32_t *host, size_t n) {
    int32_t *dev = be->alloc(be, n * sizeof(int32_t));
    be->to_device(be, dev, host, n * sizeof(int32_t));
    return dev;
}

int main(int argc, char **argv) {
    int iters = 20, n_docs = 0, lens[64];
    if (argc < 5) {
        fprintf(stderr, "usage: %s H KV D LEN... [--iters N]\n", argv[0]);
        return 2;
    }
    int H = atoi(argv[1]), KV = atoi(argv[2]), D = atoi(argv[3]);
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (n_docs < 64 && atoi(argv[i]) > 0) lens[n_docs++] = atoi(argv[i]);
        else return fprintf(stderr, "bench_attention: bad argument %s\n", argv[i]), 2;
    }
    if (H <= 0 || KV <= 0 || H % KV || D <= 0 || n_docs == 0 || iters <= 0)
        return fprintf(stderr, "bench_attention: need H %% KV == 0, D > 0, documents\n"), 2;

    int32_t cu[65] = {0};
    for (int d = 0; d < n_docs; d++) cu[d + 1] = cu[d] + lens[d];
    int T = cu[n_docs];
    int32_t *pos = weft_alloc(sizeof(int32_t) * (size_t)T);
    for (int d = 0; d < n_docs; d++)
        for (int i = 0; i < lens[d]; i++) pos[cu[d] + i] = i;

    weft_backend *be = weft_backend_cuda_create(0);
    unsigned seed = 1;
    size_t nq = (size_t)T * H * D, nkv = (size_t)T * KV * D;
    void *q = random_tensor(be, nq, be->act_dtype, &seed);
    void *k = random_tensor(be, nkv, be->act_dtype, &seed);
    void *v = random_tensor(be, nkv, be->act_dtype, &seed);
    void *dout = random_tensor(be, nq, be->act_dtype, &seed);
    size_t esz = weft_dtype_size(be->act_dtype);
    void *out = be->alloc(be, nq * esz), *dq = be->alloc(be, nq * esz);
    void *dk = be->alloc(be, nkv * esz), *dv = be->alloc(be, nkv * esz);
    float *lse = be->alloc(be, sizeof(float) * (size_t)H * T);
    int32_t *cu_dev = upload_ints(be, cu, (size_t)n_docs + 1), *pos_dev = upload_ints(be, pos, T);
    weft_attention_layout layout = {n_docs, T, T, cu_dev, cu_dev, pos_dev};

    double ms[2];
    for (int with_backward = 0; with_backward < 2; with_backward++) {
        double t0 = 0;
        for (int it = -3; it < iters; it++) { // 3 warm-up calls
            if (it == 0) {
                be->synchronize(be);
                t0 = now();
            }
            be->attention_forward(be, q, k, v, &layout, out, lse, H, KV, D);
            if (with_backward)
                be->attention_backward(be, q, k, v, &layout, out, lse, dout, dq, dk, dv, H, KV,
                                       D);
        }
        be->synchronize(be);
        ms[with_backward] = 1e3 * (now() - t0) / iters;
    }
    const char *family = getenv("WEFT_CUDA_ATTENTION");
    printf("{\"H\": %d, \"KV\": %d, \"D\": %d, \"tokens\": %d, \"docs\": %d, \"iters\": %d, "
           "\"forward_ms\": %.4f, \"forward_backward_ms\": %.4f, \"family\": \"%s\"}\n",
           H, KV, D, T, n_docs, iters, ms[0], ms[1],
           family && *family ? family : "default");
    weft_free(pos);
    weft_backend_destroy(be); // process exit frees the device buffers
    return 0;
}
