// The CUDA backend's choices that the environment may override (switches.h).
#include "backend/cuda/switches.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "core/core.h"

bool weft_cuda_env_switch(const char *name, bool by_default, const char *other) {
    const char *v = getenv(name);
    WEFT_CHECK(!v || !*v || !strcmp(v, "0") || !strcmp(v, "1"),
               "%s=%s: expected %d (the default) or %d (%s)", name, v, by_default, !by_default,
               other);
    return !v || !*v ? by_default : strcmp(v, "1") == 0;
}

int weft_cuda_gemm_split_k(int device) {
    int sms = 0;
    if (!weft_cuda_env_switch("WEFT_CUDA_GEMM_SPLIT_K", false,
                              "split K where a product's tiles leave SMs idle") ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        return 0;
    return sms;
}

int weft_cuda_skinny_rows(void) {
    const char *v = getenv("WEFT_CUDA_SKINNY_ROWS");
    if (!v || !*v) return WEFT_CUDA_SKINNY_ROWS;
    char *end;
    long rows = strtol(v, &end, 10);
    WEFT_CHECK(*end == 0 && rows >= WEFT_CUDA_SKINNY_ROWS && rows <= 1024,
               "WEFT_CUDA_SKINNY_ROWS=%s: expected a number of rows from %d (the default) to 1024",
               v, WEFT_CUDA_SKINNY_ROWS);
    return (int)rows;
}

void weft_cuda_attention_choice(int device, bool *mma, bool *hopper, bool *named) {
    int major = weft_cuda_compute_capability(device) / 10;
    weft_cuda_hopper_code code = major == 9 ? weft_cuda_attention_hopper_code() : WEFT_HOPPER_ABSENT;
    bool built = code == WEFT_HOPPER_BUILT;
    const char *env = getenv("WEFT_CUDA_ATTENTION");
    bool from_env = env && *env;
    const char *choice = from_env ? env : built ? "hopper" : major >= 8 ? "mma" : "simt";
    WEFT_CHECK(!strcmp(choice, "mma") || !strcmp(choice, "simt") || !strcmp(choice, "hopper"),
               "WEFT_CUDA_ATTENTION=%s: expected mma, simt or hopper", choice);
    WEFT_CHECK(!strcmp(choice, "simt") || major >= 8,
               "WEFT_CUDA_ATTENTION=%s: GPU %d (compute capability %d.x) has no bf16 mma; use "
               "simt",
               choice, device, major);
    WEFT_CHECK(strcmp(choice, "hopper") || major == 9,
               "WEFT_CUDA_ATTENTION=hopper: GPU %d has compute capability %d.x, the kernels are "
               "built for 9.0 (H100, H200); use mma",
               device, major);
    WEFT_CHECK(strcmp(choice, "hopper") || code != WEFT_HOPPER_ABSENT,
               "WEFT_CUDA_ATTENTION=hopper: this build of weft's CUDA plugin holds no sm_90a "
               "code; rebuild with CMAKE_CUDA_ARCHITECTURES including 90a, or use mma");
    *mma = strcmp(choice, "simt") != 0;
    *hopper = !strcmp(choice, "hopper");
    *named = *hopper && from_env;
}

bool weft_cuda_attention_ordered_dq(void) {
    const char *dq = getenv("WEFT_CUDA_ATTENTION_DQ");
    WEFT_CHECK(!dq || !*dq || !strcmp(dq, "ordered") || !strcmp(dq, "recompute"),
               "WEFT_CUDA_ATTENTION_DQ=%s: expected recompute (the default) or ordered", dq);
    return dq && !strcmp(dq, "ordered");
}

int weft_cuda_attention_forward_rows(void) {
    const char *rows = getenv("WEFT_CUDA_ATTENTION_ROWS");
    WEFT_CHECK(!rows || !*rows || !strcmp(rows, "128") || !strcmp(rows, "192"),
               "WEFT_CUDA_ATTENTION_ROWS=%s: expected 128 (the default) or 192 (query rows per "
               "block of the hopper forward at head_dim 64)", rows);
    return rows && !strcmp(rows, "192") ? 192 : 128;
}
