// The wgmma instructions weft's Hopper kernels use (hopper.cuh), by N: inline PTX needs one
// operand per accumulator register, so the lists are built by the macros below. Accumulators
// are float d[N / 8][4] in the mma.sync C layout per warp (attention_hopper.cu relies on it):
// warp w of the warpgroup holds rows 16w + g and 16w + g + 8, columns 8i + 2t and + 1, of d[i].
// Both forms take bf16 in and accumulate in fp32.
#pragma once

namespace hopper {

// The accumulator operands of an m64nNk16 wgmma (d[0 .. N/8), "+f" each) and their PTX register
// list; the operands after them are numbered from N / 2.
#define WEFT_ACC4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define WEFT_ACC_N64                                                                               \
    WEFT_ACC4(0), WEFT_ACC4(1), WEFT_ACC4(2), WEFT_ACC4(3), WEFT_ACC4(4), WEFT_ACC4(5),            \
        WEFT_ACC4(6), WEFT_ACC4(7)
#define WEFT_ACC_N128                                                                              \
    WEFT_ACC_N64, WEFT_ACC4(8), WEFT_ACC4(9), WEFT_ACC4(10), WEFT_ACC4(11), WEFT_ACC4(12),         \
        WEFT_ACC4(13), WEFT_ACC4(14), WEFT_ACC4(15)
#define WEFT_REGS_N64                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "       \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WEFT_REGS_N128                                                                             \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "       \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "        \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "        \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d (64 x N) (+)= A B, A (64 x 16) from the shared-memory descriptor A (operand %A) or from
// registers "{%A, .., %A+3}" (RS), B (16 x N) from descriptor B, accumulating where operand P is
// nonzero. SS: imm-trans-a, imm-trans-b are operands TA, TB (0: K-major, 1: MN-major); RS: B is
// MN-major (16 rows of N).
#define WEFT_WGMMA_SS(N, A, B, P, TA, TB)                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                  \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 " WEFT_REGS_N##N        \
                 ", %" #A ", %" #B ", p, 1, 1, %" #TA ", %" #TB ";\n}\n"                            \
                 : WEFT_ACC_N##N                                                                   \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"((int)TRANS_A), "n"((int)TRANS_B))
#define WEFT_WGMMA_RS(N, A0, A1, A2, A3, B, P)                                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                  \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 " WEFT_REGS_N##N        \
                 ", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, 1;\n}\n"           \
                 : WEFT_ACC_N##N                                                                   \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

// d (64 x N) (+)= A (64 x 16) B (16 x N), both in shared memory: A K-major (64 rows of 16), or
// MN-major (TRANS_A: 16 rows of 64); B K-major (N rows of 16), or MN-major (TRANS_B: 16 rows of N).
template <int N, bool TRANS_A = false, bool TRANS_B = false>
__device__ __forceinline__ void wgmma_ss(float (*d)[4], uint64_t desc_a, uint64_t desc_b,
                                         int accumulate) {
    static_assert(N == 64 || N == 128, "wgmma shapes: n64, n128");
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_wgmma(&d[0][0], N, nullptr, desc_a, desc_b, accumulate, TRANS_A, TRANS_B);
#elif defined(WEFT_SM90A)
    if constexpr (N == 64) WEFT_WGMMA_SS(64, 32, 33, 34, 35, 36);
    else WEFT_WGMMA_SS(128, 64, 65, 66, 67, 68);
#else
    __trap();
#endif
}

// d (64 x N) (+)= A (64 x 16, registers: the mma.sync A fragment of each warp's 16 rows)
// B (16 x N, MN-major in shared memory: 16 rows of N)
template <int N>
__device__ __forceinline__ void wgmma_rs(float (*d)[4], const uint32_t a[4], uint64_t desc_b,
                                         int accumulate) {
    static_assert(N == 64 || N == 128, "wgmma shapes: n64, n128");
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_wgmma(&d[0][0], N, a, 0, desc_b, accumulate, false, true);
#elif defined(WEFT_SM90A)
    if constexpr (N == 64) WEFT_WGMMA_RS(64, 32, 33, 34, 35, 36, 37);
    else WEFT_WGMMA_RS(128, 64, 65, 66, 67, 68, 69);
#else
    __trap();
#endif
}

#undef WEFT_WGMMA_RS
#undef WEFT_WGMMA_SS
#undef WEFT_REGS_N128
#undef WEFT_REGS_N64
#undef WEFT_ACC_N128
#undef WEFT_ACC_N64
#undef WEFT_ACC4

} // namespace hopper
