// The CUDA backend's choices that the environment may override (WEFT_CUDA_*), read once as the
// backend is created.
#pragma once
#include <stdbool.h>

// A switch of the environment, 0 or 1, `by_default` when unset (`other`: what the other value
// does, for the error a bad value gets).
bool weft_cuda_env_switch(const char *name, bool by_default, const char *other);

// WEFT_CUDA_ATTENTION=mma|simt|hopper picks the attention kernels: hopper, the forward and
// backward on TMA and wgmma where they cover the shape, mma elsewhere (compute capability 9.0 and
// a plugin built for sm_90a), the default where it can run: on an H100 its forward was 1.4-1.7x
// the mma one's, forward+backward 1.2-1.8x, at 4K-32K tokens; mma, the tensor-core kernels of
// compute capability 8.0 and up, the default elsewhere and the reference; simt, fp32, to compare
// against. named: hopper, and chosen by the variable.
void weft_cuda_attention_choice(int device, bool *mma, bool *hopper, bool *named);

// WEFT_CUDA_GEMM_SPLIT_K=1 lets cuBLASLt split K where a product's tiles leave SMs idle
// (matmul.h); off by default until a GPU run says it pays (bench/gpu_generate_throughput.py
// times it as its splitk runner). The SMs to fill, or 0.
int weft_cuda_gemm_split_k(int device);

// WEFT_CUDA_SKINNY_ROWS=N (64 to 1024; default WEFT_CUDA_SKINNY_ROWS, 64) sends products of up to
// N rows to skinny.cu instead of cuBLASLt: past 64 rows in blocks of 64, x staged in shared
// memory. Whether that beats cuBLASLt at a batch-256 decode step (whose 2,048-column products
// give cuBLASLt's tiles a fraction of the SMs) is for a GPU run to say
// (bench/gpu_generate_throughput.py's skinny256 runner).
int weft_cuda_skinny_rows(void);

// WEFT_CUDA_ATTENTION_DQ=ordered sums the hopper backward's dQ in its dK/dV kernel, in turns;
// recompute, the default, gives dQ a kernel of its own, which was faster than the ordered dQ's
// first three versions (1.6-1.9x on an H100, 1.07-1.15x on an H200; bench/README.md).
bool weft_cuda_attention_ordered_dq(void);

// WEFT_CUDA_ATTENTION_ROWS=192 gives the hopper forward and dQ kernel at head_dim 64 blocks of
// 192 query rows (three consumer warpgroups, FlashAttention-3's forward tiling) instead of 128,
// the default until a GPU run says it pays (bench/gpu_attention.py's hopper-192 family). The rows
// a block takes.
int weft_cuda_attention_forward_rows(void);
