// Varlen causal attention forward for Hopper (sm_90a), in FlashAttention-3's design: one
// producer thread streams K and V tiles with TMA into a ring of shared-memory stages guarded by
// mbarriers ("full": the tile landed; "empty": every consumer is done with it), while consumer
// warpgroups of 64 query rows each multiply on the tensor cores with warpgroup MMA (wgmma): the
// scores S = Q K^T from shared memory, the online softmax in registers, then O += P V with P
// straight from the score registers. The P V of tile j - 1 runs while the softmax of tile j
// does, so the tensor cores work meanwhile. (FlashAttention-3's ping-pong, the two consumer
// warpgroups taking turns issuing their products, made it 2-7% slower on an H100 at single
// documents of 4K-32K: bench/README.md.) Same contract and masking rule as the mma.sync kernels
// (attention_mma.cuh), whose helpers for masking and the online softmax it shares: query row i
// of document d sees keys cu_kv[d] + [0, q_pos[i]]. head_dim 64 or 128. The block's walk over the
// key tiles (query_block) is the dQ kernel's too (attention_hopper_backward.cu).
#include "backend/cuda/attention_hopper.cuh"

namespace {
namespace fa3 {

constexpr int KEYS = 128; // keys per tile of the forward

// A consumer warpgroup of the forward, run by run_pipeline: its 64 query rows against every key
// tile the block walks (all of them: skipping the tiles only the other warpgroup's rows see
// would put the wgmma under a branch, which ptxas answers by serializing them; the elementwise
// mask is skipped instead, under a branch of its own, where every row sees the whole tile).
// Tile j's softmax runs while the previous tile's P V is on the tensor cores.
template <int D, int WG, int C> struct consumer {
    using B = query_block<D, KEYS, 1, C>;
    using L = typename B::L;
    static constexpr int NT = KEYS / 8, NO = D / 8;
    static constexpr bool OVERLAP = true;
    struct tile {
        float s[NT][4], corr[2]; // scores, then probabilities; the factor for o
    };
    const B &b;
    int lo[2], hi[2]; // the keys this thread's two rows see
    float scale_log2, o[NO][4], m[2], l[2];
    uint32_t p[KEYS / 16][4]; // the last tile's P, bf16 A fragments

    __device__ __forceinline__ bool more(int j) const { return j < b.tiles; }
    // Waits for tile j and issues its scores s = Q K^T, committed.
    __device__ __forceinline__ void first(int j, tile &t) {
        b.wait_tile(j);
        issue_a_bt<D, KEYS>(t.s, b.template my_rows<WG>(0), L::ROW_ATOM,
                            b.smem + L::k_tile(j % STAGES), L::KEY_ATOM);
        hopper::wgmma_commit();
    }
    // o += P V with tile j's values, committed.
    __device__ __forceinline__ void second(int j) {
        issue_a_b<KEYS, D>(o, p, b.smem + L::v_tile(j % STAGES), L::KEY_ATOM);
        hopper::wgmma_commit();
    }
    __device__ __forceinline__ void elementwise(int j, tile &t) {
        hopper::fence_registers<KEYS>(t.s);
        mask_scores<1, NT>(&t.s, b.key_lo + j * KEYS, &lo, &hi);
        softmax_probabilities<NT>(t.s, m, l, t.corr, scale_log2);
    }
    // No P V in flight: o rescaled for the tile, whose probabilities become p.
    __device__ __forceinline__ void take(const tile &t) {
        hopper::fence_registers<D>(o);
        rescale_rows<NO>(o, t.corr);
#pragma unroll
        for (int kc = 0; kc < KEYS / 16; kc++) c_to_a(p[kc], t.s, kc);
    }
    __device__ __forceinline__ void release(int j) {
        hopper::fence_registers<D>(o);
        b.release_tile(j);
    }
};

template <int D, int WG, int C>
__device__ void consume(const weft_cuda_attention_args &a, const query_block<D, KEYS, 1, C> &b,
                        bf16 *out, float *lse, float scale_log2) {
    int mine = b.my_row();
    consumer<D, WG, C> c = {b,          {b.row_lo[mine], b.row_lo[mine + 8]},
                            {b.row_hi[mine], b.row_hi[mine + 8]},
                            scale_log2, {},
                            {-INFINITY, -INFINITY},
                            {0.0f, 0.0f},
                            {}};
    b.wait_rows();
    run_pipeline(c);
    float inv[2];
    for (int r = 0; r < 2; r++) {
        float sum = quad_sum(c.l[r]);
        inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
        int row = b.r0 + mine + 8 * r;
        if ((threadIdx.x & 3) == 0 && row < a.Tq)
            lse[(size_t)b.h * a.Tq + row] = (c.m[r] + log2f(sum)) * LN2;
    }
    store_query_rows<D>(a, b.r0 + mine, b.h, c.o, inv, out);
}

// C consumer warpgroups of 64 query rows each (block_rows).
template <int D, int C>
__global__ void __launch_bounds__(block_threads(C), 1)
    forward_kernel(const __grid_constant__ weft_tensor_map q_map,
                   const __grid_constant__ weft_tensor_map k_map,
                   const __grid_constant__ weft_tensor_map v_map, weft_cuda_attention_args a,
                   bf16 *out, float *lse, float scale_log2) {
    wait_for_earlier_kernels();
    query_block<D, KEYS, 1, C> b(a, true);
    int role = take_role<C>();
    if (role == 0) { // the producer warpgroup: one thread issues every copy
        const weft_tensor_map *rows[] = {&q_map};
        if (threadIdx.x == 0) b.produce(rows, &k_map, &v_map);
        return;
    }
    as_consumer<C>(
        role, [&](auto wg) { consume<D, decltype(wg)::value, C>(a, b, out, lse, scale_log2); });
}

} // namespace fa3
} // namespace

#if !defined(WEFT_CUDA_EMULATION)
// 1 in the module compiled for sm_90a, 0 in any other (sm_80's, or PTX JIT-compiled for a newer
// GPU): the loaded module's copy says whether these kernels can run on this device.
__device__ int hopper_instructions_compiled =
#if defined(WEFT_SM90A)
    1;
#else
    0;
#endif
#endif

extern "C" weft_cuda_hopper_code weft_cuda_attention_hopper_code(void) {
#if defined(WEFT_CUDA_EMULATION)
    return WEFT_HOPPER_EMULATED;
#else
    int compiled = 0;
    return cudaMemcpyFromSymbol(&compiled, hopper_instructions_compiled, sizeof compiled) ==
                       cudaSuccess &&
                   compiled == 1
               ? WEFT_HOPPER_BUILT
               : WEFT_HOPPER_ABSENT;
#endif
}

extern "C" bool weft_cuda_attention_hopper_covers(const weft_cuda_attention_args *a) {
    return (a->D == 64 || a->D == 128) && a->Tq > 0 && a->Tkv > 0;
}

extern "C" bool weft_cuda_attention_forward_hopper(weft_cuda_stream s,
                                                   const weft_cuda_attention_args *a,
                                                   const void *q, const void *k, const void *v,
                                                   void *out, float *lse, int rows_at_64) {
    int consumers = fa3::query_block_consumers(a->D, rows_at_64);
    int rows = fa3::block_rows(consumers);
    fa3::qkv_maps m;
    if (!fa3::make_qkv_maps(&m, a, q, k, v, rows, fa3::KEYS)) return false;
    dim3 grid((a->Tq + rows - 1) / rows, a->H);
    float scale_log2 = LOG2E / sqrtf((float)a->D);
#define LAUNCH(D, C)                                                                               \
    WEFT_LAUNCH((fa3::forward_kernel<D, C>), grid, fa3::block_threads(C),                          \
                (fa3::query_layout<D, fa3::KEYS, 1, C>::BYTES), s, m.q, m.k, m.v, *a, (bf16 *)out, \
                lse, scale_log2)
    if (a->D == 128) LAUNCH(128, 2);
    else if (consumers == 3) LAUNCH(64, 3);
    else LAUNCH(64, 2);
#undef LAUNCH
    return true;
}
