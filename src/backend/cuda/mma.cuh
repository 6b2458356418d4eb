// The warp-level tensor-core product the mma.sync kernels share (attention_mma.cuh, skinny.cu).
#pragma once
#include "backend/cuda/common.cuh"

// c (16x8) += a (16x16) b (16x8), bf16 in, fp32 accumulators: mma.sync.m16n8k16. With
// g = lane / 4 and t = lane % 4 (PTX ISA, "matrix fragments for mma.m16n8k16"):
//   A regs: {row g, cols 2t..2t+1}, {row g+8, cols 2t..}, {row g, cols 2t+8..}, {row g+8, 2t+8..}
//   B regs: {rows (k) 2t..2t+1, col (n) g}, {rows 2t+8..2t+9, col g}
//   C:      c0,c1 at row g, cols 2t, 2t+1; c2,c3 at row g+8, same cols
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(WEFT_CUDA_EMULATION) // the CPU test harness (tests/backend/cuda_emulation.h)
    weft_emulated_mma(c, a, b0, b1);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap(); // the launchers never select these kernels below sm_80
#endif
}
