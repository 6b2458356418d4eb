// Helpers shared by the CUDA kernel files: bf16 conversion, grid sizing, block reductions,
// asynchronous copies to shared memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <utility>

#include "backend/cuda/kernels.h"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ size_t global_index() {
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t global_stride() { return (size_t)gridDim.x * blockDim.x; }

// Blocks for a grid-stride loop of 256-thread blocks over N elements: enough to fill the GPU,
// few enough that each thread loops when N is large.
static inline unsigned grid_for(size_t N) {
    size_t blocks = (N + 255) / 256;
    size_t most = WEFT_CUDA_SUM_PARTIALS; // sum_f32's partials hold one per block
    return (unsigned)(blocks < most ? blocks : most);
}

// A V (4, 8 or 16 bytes) read or written at p in one access. A GPU faults on an address that is
// not a multiple of sizeof(V), where a CPU reads it anyway, so the emulator checks every such
// address: CI then finds the shape or offset that would stop a GPU with "misaligned address".
template <typename V> __device__ __forceinline__ V load_vector(const void *p) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_check_alignment(p, sizeof(V), "vector load");
#endif
    return *reinterpret_cast<const V *>(p);
}
template <typename V> __device__ __forceinline__ void store_vector(void *p, V v) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_check_alignment(p, sizeof(V), "vector store");
#endif
    *reinterpret_cast<V *>(p) = v;
}

// VEC consecutive bf16 as floats. Bandwidth-bound kernels move 8 at a time (one 16-byte access):
// with one 2-byte load per thread in flight an SM keeps far too few bytes in flight to reach HBM
// bandwidth. VEC = 1 serves sizes or addresses that do not allow it (see vector_width).
template <int VEC> struct bf16_vec {
    static_assert(VEC == 1 || VEC == 8, "one value or 16 bytes");
    float x[VEC];

    __device__ __forceinline__ void load(const bf16 *p) {
        if constexpr (VEC == 8) {
            uint4 raw = load_vector<uint4>(p);
            const bf16 *h = reinterpret_cast<const bf16 *>(&raw);
#pragma unroll
            for (int k = 0; k < VEC; k++) x[k] = to_f32(h[k]);
        } else {
            x[0] = to_f32(*p);
        }
    }
    __device__ __forceinline__ void store(bf16 *p) const {
        if constexpr (VEC == 8) {
            uint4 raw;
            bf16 *h = reinterpret_cast<bf16 *>(&raw);
#pragma unroll
            for (int k = 0; k < VEC; k++) h[k] = to_bf16(x[k]);
            store_vector(p, raw);
        } else {
            *p = to_bf16(x[0]);
        }
    }
};

// SwiGLU of one gate and up value, u * silu(g): every kernel that forms it (the elementwise
// forward, the few-row product's epilogue) gives the same bits.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float swiglu(float g, float u) { return u * (g * sigmoid(g)); }

// The weft-owned product kernels' outputs (few_rows.cu, skinny.cu), from a column's fp32 sum, with
// the bits of the matmul op's: alpha sum + beta c_in rounded as stored, then the bias added to the
// stored product as a separate add would; and with the gate|up sums, swiglu of the two rounded as
// the product would be stored, as swiglu_forward then reads them.
__device__ __forceinline__ bf16 projection_output(float sum, float alpha, float beta,
                                                  const bf16 *c_in, const bf16 *bias, size_t at,
                                                  int n) {
    float out = alpha * sum;
    if (beta != 0.0f) out += beta * to_f32(c_in[at]);
    bf16 stored = to_bf16(out);
    return bias ? to_bf16(to_f32(stored) + to_f32(bias[n])) : stored;
}
__device__ __forceinline__ bf16 swiglu_output(float gate_sum, float up_sum) {
    return to_bf16(swiglu(to_f32(to_bf16(gate_sum)), to_f32(to_bf16(up_sum))));
}

// Offset (in elements) of the keys of (block, layer, offset) in the paged KV cache's pool
// (kernels.h: (n_blocks, layers, 2, block_size, width)); values follow block_size * width
// elements later.
__device__ __forceinline__ size_t pool_row(int layers, int block_size, int width, int block,
                                           int layer, int offset) {
    return (((size_t)block * layers + layer) * 2 * block_size + offset) * width;
}

// A RoPE launch's rows: their first H heads of D values turn by sign * positions[t] * inv_freq[i]
// (inv_freq (D / 2) f32 on the device), scaled by scale.
struct rope_rows {
    const int32_t *positions;
    const float *inv_freq;
    float scale, sign;
    int H, D;
};

// RoPE's factors for pair `pair` of row t: cos and sign * sin of positions[t] * inv_freq[pair],
// both scaled. In double as on the CPU (positions reach the tens of thousands, where an fp32
// angle drifts by more than bf16 can hide), and shared by every kernel that turns rows, so each
// gives rope's bits.
__device__ __forceinline__ void rope_factors(const rope_rows &r, int t, int pair, float *c,
                                             float *s) {
    double angle = r.positions[t] * (double)r.inv_freq[pair];
    double sn, cs;
    sincos(angle, &sn, &cs);
    *c = (float)(r.scale * cs);
    *s = (float)(r.scale * r.sign * sn);
}

// The pair (a, b) turned: (a c - b s, b c + a s).
__device__ __forceinline__ void rotate_pair(float a, float b, float c, float s, bf16 *to_a,
                                            bf16 *to_b) {
    *to_a = to_bf16(a * c - b * s);
    *to_b = to_bf16(b * c + a * s);
}

// The parts of fused rows; with `pool`, parts 1 and 2 (k and v) are the paged KV cache's slots
// instead, row t at slot[t] of `layer` (a negative slot: nowhere), as kv_store puts them.
struct column_parts {
    bf16 *part[3];
    int width[3];
    bf16 *pool;
    const int32_t *slot;
    int layers, block_size, layer;
};

// Where column col of a fused row lies: its part and its column there (NULL: nowhere).
__device__ __forceinline__ bf16 *part_at(const column_parts &parts, size_t row, int col) {
    int p = 0;
    while (col >= parts.width[p]) col -= parts.width[p++];
    if (!parts.pool || p == 0) return parts.part[p] + row * parts.width[p] + col;
    int slot = parts.slot[row], bs = parts.block_size, width = parts.width[p];
    if (slot < 0) return nullptr;
    size_t keys = pool_row(parts.layers, bs, width, slot / bs, parts.layer, slot % bs);
    return parts.pool + keys + (p == 2 ? (size_t)bs * width : 0) + col;
}

// A decode step's q|k|v parts as split_store writes them: q (rows, q_width), and keys and values
// (kv_width each) to the pool's slot[t] of `layer`.
__host__ __device__ inline column_parts stored_parts(void *q, int q_width, int kv_width, void *pool,
                                                     const int32_t *slot, int layers,
                                                     int block_size, int layer) {
    return column_parts{{(bf16 *)q, (bf16 *)pool, (bf16 *)pool}, {q_width, kv_width, kv_width},
                        (bf16 *)pool, slot, layers, block_size, layer};
}

// 8 when every pointer is 16-byte aligned and `count` (the elements a kernel walks in vectors:
// the whole tensor, or one row) is a multiple of 8; else 1.
static inline int vector_width(size_t count, const void *a, const void *b = NULL,
                               const void *c = NULL, const void *d = NULL, const void *e = NULL) {
    uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e;
    return count % 8 == 0 && bits % 16 == 0 ? 8 : 1;
}

// WEFT_LAUNCH of kernel<8> or kernel<1>, as vector_width said.
#define WEFT_LAUNCH_VECTORIZED(kernel, vec, grid, threads, smem, stream, ...)                      \
    do {                                                                                           \
        if ((vec) == 8) WEFT_LAUNCH(kernel<8>, grid, threads, smem, stream, __VA_ARGS__);          \
        else WEFT_LAUNCH(kernel<1>, grid, threads, smem, stream, __VA_ARGS__);                     \
    } while (0)

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Bit i set where lane i's predicate holds, in every lane (the emulator builds it from shuffles).
__device__ __forceinline__ unsigned warp_ballot(int predicate) {
#if defined(WEFT_CUDA_EMULATION)
    unsigned mask = predicate ? 1u << (threadIdx.x & 31) : 0u;
    for (int o = 16; o > 0; o >>= 1) mask |= __shfl_xor_sync(0xffffffffu, mask, o);
    return mask;
#else
    return __ballot_sync(0xffffffffu, predicate);
#endif
}

template <typename T> __device__ __forceinline__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block, returned to every thread. `partial` holds one value per warp; blockDim.x
// is a multiple of 32. Safe to call repeatedly: the leading barrier protects `partial`.
template <typename T> __device__ T block_sum(T v, T *partial) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    T total = 0;
    for (int w = 0; w < warps; w++) total += partial[w];
    return total;
}

// cp.async, shared by the attention kernels (sm_80 and newer): 16 bytes global -> shared without
// passing through registers; zeros when !valid.
__device__ __forceinline__ void cp_async16(bf16 *dst, const bf16 *src, bool valid) {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_cp_async16(dst, src, valid);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
#else
    __trap();
#endif
}

// Closes the group of copies issued so far; waits until at most `pending` groups are in flight.
__device__ __forceinline__ void cp_async_commit() {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_cp_async_wait(PENDING);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
#endif
}

// The first statement of every weft kernel. Launched early (weft_cuda_queue.early_launch), a
// kernel's blocks may be resident while the kernel before it on the stream still runs: here they
// wait until the earlier kernels have finished and their writes are visible (griddepcontrol.wait,
// which returns at once after a plain launch), and then let the next kernel launch in its turn.
// So nothing a kernel reads or writes overlaps the kernel before it, and only the launch latency
// is hidden. tests/backend/test_cuda_kernels_wait_for_earlier_kernels_first.py checks every
// kernel starts so.
__device__ __forceinline__ void wait_for_earlier_kernels() {
#if !defined(WEFT_CUDA_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Rows of a bf16 matrix that no kernel writes while a forward runs (a product's weights): `rows`
// rows from `first`, `ld` elements apart, `cols` elements each.
struct fixed_rows {
    const bf16 *first;
    size_t ld;
    int rows, cols;
};

// wait_for_earlier_kernels, having first asked L2 for the rows of `a` and `b` (a thread a row,
// one bulk prefetch each: cp.async.bulk.prefetch, sm_90; rows 16-byte aligned, `cols` a multiple
// of 8). A prefetch brings nothing into the thread and has no effect on what later loads see (L2
// is where every write lands), so it may come before the wait: an early-launched product starts
// streaming its weights from memory while the small kernel before it still runs, where a decode
// step otherwise reads nothing at all. Early launches are sm_90's, and so is this.
__device__ __forceinline__ void prefetch_rows(const fixed_rows &r, int thread) {
#if defined(WEFT_CUDA_EMULATION) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    if (thread < 0 || thread >= r.rows || r.cols <= 0) return;
    const bf16 *row = r.first + thread * r.ld;
    uint32_t bytes = (uint32_t)r.cols * (uint32_t)sizeof(bf16);
#if defined(WEFT_CUDA_EMULATION)
    weft_emulated_bulk_prefetch(row, bytes);
#else
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row), "r"(bytes));
#endif
#endif
}
__device__ __forceinline__ void wait_for_earlier_kernels(fixed_rows a, fixed_rows b = {}) {
    prefetch_rows(a, (int)threadIdx.x);
    prefetch_rows(b, (int)threadIdx.x - a.rows);
    wait_for_earlier_kernels();
}

// The block's dynamic shared memory (the bytes given at launch), as an array of T. Every kernel
// reaches it through this one declaration, which the CPU test harness can stand in for.
#ifndef WEFT_CUDA_EMULATION
template <typename T> __device__ __forceinline__ T *dynamic_smem() {
    extern __shared__ __align__(16) unsigned char weft_dynamic_smem[];
    return reinterpret_cast<T *>(weft_dynamic_smem);
}
#endif

// Launches kernel<<<grid, threads, smem, queue's stream>>>(args...), first opting in to more than
// the default 48 KiB of dynamic shared memory when it asks for that; with the queue's early_launch,
// as a programmatic dependent launch (the kernel starts with wait_for_earlier_kernels). The CPU
// test harness (tests/backend/cuda_emulation.h) defines its own WEFT_LAUNCH, so launchers written
// with this macro run there unchanged.
#ifndef WEFT_LAUNCH
template <typename... Params, typename... Args>
void weft_launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 threads, size_t smem,
                        weft_cuda_stream queue, Args &&...args) {
    if (smem > (48u << 10))
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaLaunchAttribute early = {};
    early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    early.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = threads;
    config.dynamicSmemBytes = smem;
    config.stream = queue->stream;
    config.attrs = &early;
    config.numAttrs = queue->early_launch ? 1 : 0;
    cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...); // errors: cuda.c's launched()
}
#define WEFT_LAUNCH(kernel, grid, threads, smem, queue, ...)                                       \
    weft_launch_kernel(kernel, dim3(grid), dim3(threads), (size_t)(smem), queue, __VA_ARGS__)
// The same, for a kernel whose blocks wait for lower-indexed ones: a GPU starts blocks in index
// order, so those have started and the wait ends; the emulator then runs the blocks in that order.
#define WEFT_LAUNCH_IN_ORDER WEFT_LAUNCH
#endif
