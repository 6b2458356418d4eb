// Hopper (sm_90a) building blocks: mbarriers, TMA tile loads and warpgroup MMA (wgmma), each a
// thin wrapper over its PTX, and under WEFT_CUDA_EMULATION over the CPU emulator's version
// (tests/backend/cuda_emulation.h), which implements them from the PTX ISA's definitions.
//
// Shared-memory tiles are in the one layout both TMA and wgmma speak, "128-byte swizzle": a tile
// of R rows x 64 bf16 (128 bytes a row) stored row after row from a 1024-byte aligned address,
// the 16-byte chunk c of row r at chunk c ^ (r % 8) (the swizzle is a function of the shared
// address's bits 4-6 and 7-9). A tile wider than 64 columns is several such "atoms" one after
// another. Bank-conflict free for both TMA's writes and wgmma's reads.
#pragma once
#include "backend/cuda/common.cuh"

#if !defined(WEFT_CUDA_EMULATION)
#include <cuda.h> // CUtensorMap
typedef CUtensorMap weft_tensor_map;
#else
typedef emu::tensor_map weft_tensor_map;
#undef __grid_constant__
#define __grid_constant__
#endif

// The instructions exist only in code compiled for sm_90a; elsewhere the kernels trap, and the
// launcher never selects them.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WEFT_SM90A 1
#endif

namespace hopper {

constexpr int ATOM_COLS = 64;     // bf16 columns of a 128-byte swizzled row
constexpr int ATOM_ROW_BYTES = 128;

__device__ __forceinline__ uint32_t smem_address(const void *p) {
#if defined(WEFT_CUDA_EMULATION)
    return weft_emulated_smem_address(p);
#else
    return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

// Where byte `offset` of a 128-byte-swizzled tile (from a 1024-byte aligned start) is stored.
__host__ __device__ constexpr uint32_t swizzled(uint32_t offset) {
    return offset ^ ((offset >> 7) & 7) << 4;
}

// The first 1024-byte aligned address at or after p (the swizzle pattern's period).
__device__ __forceinline__ unsigned char *align_1024(unsigned char *p) {
    return p + ((1024 - smem_address(p) % 1024) % 1024);
}

// ------------------------------------------------------------------------------ mbarrier ----

__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_mbar_init(bar, count);
#elif defined(WEFT_SM90A)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count)
                 : "memory");
#else
    __trap();
#endif
}

// Makes the initialized barriers visible to the async proxy (TMA) before anyone uses them.
__device__ __forceinline__ void mbar_init_fence() {
#if defined(WEFT_SM90A) && !defined(WEFT_CUDA_EMULATION)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_mbar_arrive(bar, 0);
#elif defined(WEFT_SM90A)
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
#else
    __trap();
#endif
}

// Arrives and announces `bytes` of TMA transfers that must land before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_mbar_arrive(bar, bytes);
#elif defined(WEFT_SM90A)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     smem_address(bar)),
                 "r"(bytes)
                 : "memory");
#else
    __trap();
#endif
}

// Waits until the phase of parity `parity` has completed. A wait that cannot end is a kernel
// bug: after about 2^35 cycles (some seconds) it traps, so the launch fails instead of hanging.
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_mbar_wait(bar, parity);
#elif defined(WEFT_SM90A)
    // All in PTX: a loop the compiler sees might make the wgmma after it look divergent.
    asm volatile("{\n.reg .pred p;\n.reg .u64 t0, t1;\n"
                 "mov.u64 t0, %%clock64;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@p bra DONE;\n"
                 "mov.u64 t1, %%clock64;\n"
                 "sub.u64 t1, t1, t0;\n"
                 "setp.lt.u64 p, t1, 34359738368;\n" // 2^35 cycles
                 "@p bra WAIT;\n"
                 "trap;\n"
                 "DONE:\n}\n" ::"r"(smem_address(bar)),
                 "r"(parity)
                 : "memory");
#else
    __trap();
#endif
}

// ----------------------------------------------------------------------------------- TMA ----

// The box at (x = column, y = row) of the 2-D tensor `map` into shared memory at dst (1024-byte
// aligned), completing its bytes on `bar`. Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_2d(void *dst, const weft_tensor_map *map, int x, int y,
                                            uint64_t *bar) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_tma_load_2d(dst, map, x, y, bar);
#elif defined(WEFT_SM90A)
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_address(dst)),
                 "l"((uint64_t)map), "r"(x), "r"(y), "r"(smem_address(bar))
                 : "memory");
#else
    __trap();
#endif
}

// Hands registers between warpgroups (every thread of the warpgroup executes it): the producer
// needs few, the consumers' accumulators many. Nothing to emulate.
template <int REGISTERS> __device__ __forceinline__ void registers_decrease_to() {
#if defined(WEFT_SM90A) && !defined(WEFT_CUDA_EMULATION)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
#endif
}
template <int REGISTERS> __device__ __forceinline__ void registers_increase_to() {
#if defined(WEFT_SM90A) && !defined(WEFT_CUDA_EMULATION)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
#endif
}

// ------------------------------------------------------- part of a block; other blocks ----

// bar.sync: the `threads` threads (whole warps) that reach barrier `id` (1-15; 0 is
// __syncthreads) wait for each other, the rest of the block goes on.
__device__ __forceinline__ void named_barrier(int id, int threads) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_named_barrier(id, threads);
#else
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Makes this thread's ordinary writes to shared memory visible to the async proxy: to the wgmma
// that read them after a barrier.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(WEFT_SM90A) && !defined(WEFT_CUDA_EMULATION)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Spins until the global counter holds `value` (acquire: what its writers wrote before raising it
// is seen after). Another block raises it, so the wait is bounded as mbar_wait's is: a count
// that never comes traps after about 2^35 cycles instead of hanging the GPU.
__device__ __forceinline__ void wait_counter(const int *counter, int value) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_wait_counter(counter, value);
#elif defined(WEFT_SM90A)
    asm volatile("{\n.reg .pred p;\n.reg .u64 t0, t1;\n.reg .s32 v;\n"
                 "mov.u64 t0, %%clock64;\n"
                 "SPIN:\n"
                 "ld.acquire.gpu.global.s32 v, [%0];\n"
                 "setp.eq.s32 p, v, %1;\n"
                 "@p bra READY;\n"
                 "mov.u64 t1, %%clock64;\n"
                 "sub.u64 t1, t1, t0;\n"
                 "setp.lt.u64 p, t1, 34359738368;\n" // 2^35 cycles
                 "@p bra SPIN;\n"
                 "trap;\n"
                 "READY:\n}\n" ::"l"(counter),
                 "r"(value)
                 : "memory");
#else
    __trap();
#endif
}

// Raises the counter by one, after (release) every write this thread made or saw before: its
// block's threads' too where a barrier ordered them before this.
__device__ __forceinline__ void signal_counter(int *counter) {
#if defined(WEFT_CUDA_EMULATION)
    (*counter)++;
#elif defined(WEFT_SM90A)
    __threadfence();
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
#else
    __trap();
#endif
}

// dst[0 .. bytes/4) += src (shared memory) in global memory, asynchronously (TMA's bulk
// reduction: the L2 adds whole lines); bytes and both addresses multiples of 16. In the current
// bulk group of this thread (bulk_commit closes it; bulk_wait waits for groups).
__device__ __forceinline__ void bulk_reduce_add(float *dst, const float *src, uint32_t bytes) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_bulk_reduce_add(dst, src, bytes);
#elif defined(WEFT_SM90A)
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                     dst),
                 "r"(smem_address(src)), "r"(bytes)
                 : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_bulk_commit();
#elif defined(WEFT_SM90A)
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most PENDING of this thread's bulk groups are in flight; READ: only until they
// have read their sources (which may then be overwritten), not until their writes are done.
template <int PENDING, bool READ> __device__ __forceinline__ void bulk_wait() {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_bulk_wait(PENDING, READ);
#elif defined(WEFT_SM90A)
    if constexpr (READ) asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
    else asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}
// Orders global memory accesses of the async proxy (bulk reductions) with this thread's ordinary
// ones (a counter's acquire before, its release after).
__device__ __forceinline__ void fence_proxy_async_global() {
#if defined(WEFT_SM90A) && !defined(WEFT_CUDA_EMULATION)
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------- wgmma ----

// The descriptor of a 128-byte-swizzled operand at p: `leading` and `stride` bytes as the PTX
// ISA's "matrix descriptor" defines them (K-major: stride = between 8-row groups, leading
// unused; MN-major: leading = between 64-column atoms, stride = between 8-row groups of K).
__device__ __forceinline__ uint64_t smem_descriptor(const void *p, uint32_t leading,
                                                    uint32_t stride) {
    return (uint64_t)((smem_address(p) & 0x3FFFF) >> 4) |
           (uint64_t)((leading >> 4) & 0x3FFF) << 16 | (uint64_t)((stride >> 4) & 0x3FFF) << 32 |
           1ull << 62;
}

// The descriptor `desc` moved `bytes` further into the same shared memory: only its start
// address field (bits 0-13: the address / 16) changes, and as shared memory ends below 256 KB the
// addition never carries out of the field, so it is one 32-bit add where smem_descriptor would
// take four instructions (a wgmma sequence walks one tile in constant steps).
__device__ __forceinline__ uint64_t descriptor_plus(uint64_t desc, uint32_t bytes) {
    uint32_t start = (uint32_t)desc + (bytes >> 4);
    return (desc & 0xFFFFFFFF00000000ull) | start;
}

// Orders this thread's register and shared-memory accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() {
#if defined(WEFT_SM90A) && !defined(WEFT_CUDA_EMULATION)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_wgmma_commit();
#elif defined(WEFT_SM90A)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most PENDING committed groups of this warpgroup's wgmma are still running.
template <int PENDING> __device__ __forceinline__ void wgmma_wait() {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_wgmma_wait(PENDING);
#elif defined(WEFT_SM90A)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// Keeps the compiler from moving accesses to accumulator registers across the asynchronous MMA.
template <int N> __device__ __forceinline__ void fence_registers(float (*d)[4]) {
#if !defined(WEFT_CUDA_EMULATION)
#pragma unroll
    for (int i = 0; i < N / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
#endif
}

} // namespace hopper

#include "backend/cuda/hopper_wgmma.cuh"
