// A CPU stand-in for the parts of the CUDA execution model weft's kernels use, so their
// unmodified source (launchers included) runs, slowly, on a machine without a GPU, and index or
// synchronization mistakes show up in CI. One block at a time: its threads are coroutines
// (started by ucontext, then switched by _setjmp/_longjmp, which unlike swapcontext make no
// system call to save the signal mask) that the scheduler runs until each reaches a rendezvous
// (__syncthreads, a named barrier, a warp shuffle or vote, mma.sync, ldmatrix, a spin on a global
// counter); when every participant is there, the scheduler computes all results at once and
// releases them. Blocks that wait for other blocks run in launch order (run_grid). A warp
// primitive reached by only part of a warp, or a barrier that can never complete, is reported as
// the hang it would be on a GPU. cp.async copies land at the wait or at issue
// (g_copies_land_at_issue), the two ends of what hardware allows.
// What a GPU refuses and a CPU would not is refused too: a launch past the hardware's limits
// (check_launch_limits), and a vector access, cp.async, ldmatrix row or mbarrier at an address
// that is not a multiple of its size (weft_emulated_check_alignment).
//
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate) is emulated from the PTX ISA's fragment tables
// ("Matrix Fragments for mma.m16n8k16 with floating point type"), written here independently of
// the kernels: with g = lane / 4 and t = lane % 4,
//   A (16x16): a[0] = {(g, 2t), (g, 2t+1)}, a[1] = {(g+8, 2t), ..}, a[2] = {(g, 2t+8), ..},
//              a[3] = {(g+8, 2t+8), ..}; the lower 16 bits hold the lower column
//   B (16x8):  b[0] = {(2t, g), (2t+1, g)}, b[1] = {(2t+8, g), (2t+9, g)}  (row k, column n)
//   C (16x8):  c[0] = (g, 2t), c[1] = (g, 2t+1), c[2] = (g+8, 2t), c[3] = (g+8, 2t+1)
// and ldmatrix.x4 from its table (resolve_ldmatrix). If a GPU disagrees, both the kernels and
// these tables are wrong, and test_cuda_ops_match_cpu on the GPU says so. Hopper's mbarriers,
// TMA tile loads and wgmma are in cuda_emulation_hopper.h.
#pragma once
#define WEFT_CUDA_EMULATION 1
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <functional>
#include <numeric>
#include <tuple>
#include <vector>

#include "cuda_emulation_stream.h"

// Dynamic shared memory (common.cuh's dynamic_smem): one buffer, as blocks run one at a time.
// Aligned as a GPU's shared window is, so 128-byte swizzle patterns (bits 4-9 of the shared
// address) are the same here.
alignas(1024) inline unsigned char weft_dynamic_smem[1 << 18];

namespace emu {

enum op_kind {
    OP_RUNNABLE,
    OP_DONE,
    OP_BLOCK_SYNC,
    OP_BLOCK_OR,
    OP_SYNC_WARP,
    OP_SHFL_XOR,
    OP_SHFL_IDX,
    OP_ANY,
    OP_MMA,
    OP_LDMATRIX,
    OP_MBAR_WAIT,  // one thread waits for an mbarrier phase (cuda_emulation_hopper.h)
    OP_WGMMA_WAIT, // a warpgroup waits for its wgmma groups
    OP_NAMED_BAR,  // bar.sync id, count: part of the block meets at barrier `id`
    OP_COUNTER_WAIT // a thread spins until a global counter holds a value
};

struct wgmma_op; // cuda_emulation_hopper.h

// A cp.async copy in flight: done when its thread waits for its group.
struct pending_copy {
    void *dst;
    const void *src;
    bool valid;
    int group;
};

struct thread_state {
    ucontext_t context; // its first entry
    jmp_buf resume;     // where it waits at a rendezvous
    bool started;
    void *sanitizer_save; // AddressSanitizer's state of the stack it left (start_switch)
    uint3 index;
    op_kind op;
    int predicate, lane_mask, predicate_result;
    double value, value_result; // shuffled ints, floats and doubles all fit a double exactly
    uint32_t a[4], b[2];
    float c[4], d[4];
    const void *row;     // ldmatrix: the row this lane names
    bool transposed;
    uint32_t fragment[4];
    std::vector<pending_copy> copies;
    int committed_groups;
    std::vector<wgmma_op> *wgmma; // issued, not yet waited for (allocated on first use)
    int wgmma_groups, wgmma_pending_allowed;
    uint32_t mbar;   // OP_MBAR_WAIT: the barrier's shared address and the phase parity awaited
    int mbar_parity;
    int bar_id, bar_count;      // OP_NAMED_BAR
    const int *counter;         // OP_COUNTER_WAIT: the counter and the value awaited
    int counter_value;
    std::vector<char> stack;
};

struct block_state {
    std::vector<thread_state> threads;
    jmp_buf scheduler;
    void *sanitizer_save;
    thread_state *current;
    std::function<void()> body;
};

inline block_state *g_block;
bool resolve_hopper(block_state &b); // cuda_emulation_hopper.h
bool resolve_wgmma_waits(block_state &b);
bool land_tma_copies();
void start_block_hopper(block_state &b);
void end_block_hopper(block_state &b);
// When a cp.async copy lands: at the wait (the latest the hardware allows: reading a tile before
// waiting for it reads stale bytes) or at issue (the earliest: refilling a buffer before every
// warp is done with it clobbers data still being read). Tests run both.
inline bool g_copies_land_at_issue = false;
// In which order the scheduler runs a block's threads from one rendezvous to the next: by index,
// or (g_threads_in_reverse) from the last thread to the first. A GPU promises neither, so a
// missing barrier shows up one way or the other: a thread that reads shared memory another
// writes in the same phase reads stale bytes when the reader runs first. Tests run both orders;
// WEFT_EMULATED_THREADS_REVERSED=1 reverses them for a whole program.
inline bool g_threads_in_reverse = [] {
    const char *v = getenv("WEFT_EMULATED_THREADS_REVERSED");
    return v && *v && strcmp(v, "0") != 0;
}();
// Whether one warp at a time runs (g_warps_one_at_a_time): the first warp, in the order above,
// with a runnable thread runs alone, its warp primitives resolved as it reaches them, until it
// waits at a block-wide rendezvous (or ends); then the next. So a warp runs ahead of the others
// as far as the kernel's barriers let it, and a buffer refilled without a barrier after its last
// reader (the readers being other warps) is refilled before they read it.
inline bool g_warps_one_at_a_time = false;
inline uint3 g_block_index;
inline dim3 g_block_dim, g_grid_dim;
// The most threads a block of any launch had since a test last zeroed it: which variant of a
// kernel ran, where variants differ in their warps.
inline unsigned g_widest_block = 0;

[[noreturn]] inline void fail(const char *what) {
    fprintf(stderr, "cuda emulation: %s (block %u,%u)\n", what, g_block_index.x, g_block_index.y);
    exit(1);
}

inline thread_state *self() { return g_block->current; }

// AddressSanitizer, when a sanitized program links it, must be told of every switch between the
// scheduler's stack and a thread's, or it warns and may report false errors. Weak: absent (null)
// in ordinary builds.
extern "C" void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom,
                                               size_t size) __attribute__((weak));
extern "C" void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **old_bottom,
                                                size_t *old_size) __attribute__((weak));
inline const void *g_scheduler_stack; // its bounds, learnt at the first switch into a thread
inline size_t g_scheduler_stack_size;

// Announces a switch to the stack [bottom, bottom + size); `leaving` says the current stack is
// never returned to.
inline void start_switch(const void *bottom, size_t size, void **save, bool leaving = false) {
    if (__sanitizer_start_switch_fiber)
        __sanitizer_start_switch_fiber(leaving ? nullptr : save, bottom, size);
}
inline void finish_switch(void *save, bool to_thread) {
    if (__sanitizer_finish_switch_fiber)
        __sanitizer_finish_switch_fiber(save, to_thread ? &g_scheduler_stack : nullptr,
                                        to_thread ? &g_scheduler_stack_size : nullptr);
}

inline void rendezvous(op_kind op) {
    thread_state *t = self();
    t->op = op;
    if (_setjmp(t->resume) == 0) {
        start_switch(g_scheduler_stack, g_scheduler_stack_size, &t->sanitizer_save);
        _longjmp(g_block->scheduler, 1);
    }
    finish_switch(t->sanitizer_save, true);
}

inline float bf16_bits_to_float(uint32_t bits) {
    uint32_t f = (bits & 0xffffu) << 16;
    float x;
    memcpy(&x, &f, sizeof x);
    return x;
}

// d = a b + c for the warp whose lanes are `lanes`, from the fragment tables above.
inline void resolve_mma(thread_state *lanes) {
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const thread_state &s = lanes[lane];
        int g = lane >> 2, t = lane & 3;
        for (int half = 0; half < 2; half++) {
            int col = 2 * t + half, shift = 16 * half;
            A[g][col] = bf16_bits_to_float(s.a[0] >> shift);
            A[g + 8][col] = bf16_bits_to_float(s.a[1] >> shift);
            A[g][col + 8] = bf16_bits_to_float(s.a[2] >> shift);
            A[g + 8][col + 8] = bf16_bits_to_float(s.a[3] >> shift);
            B[col][g] = bf16_bits_to_float(s.b[0] >> shift);
            B[col + 8][g] = bf16_bits_to_float(s.b[1] >> shift);
            C[g][col] = s.c[half];
            C[g + 8][col] = s.c[2 + half];
        }
    }
    for (int lane = 0; lane < 32; lane++) {
        int g = lane >> 2, t = lane & 3;
        for (int e = 0; e < 4; e++) {
            int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
            float acc = C[row][col];
            for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
            lanes[lane].d[e] = acc;
        }
    }
}

// ldmatrix.x4: lanes 8i .. 8i+7 name the rows of matrix i; lane l gets, of each matrix, row l/4,
// columns 2(l%4) and +1 (transposed: rows 2(l%4) and +1 of column l/4), lower column (row) in
// the low half.
inline void resolve_ldmatrix(thread_state *lanes) {
    uint16_t M[4][8][8];
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 8; r++) memcpy(M[i][r], lanes[8 * i + r].row, 16);
    for (int lane = 0; lane < 32; lane++) {
        int g = lane >> 2, t = lane & 3;
        bool tr = lanes[lane].transposed;
        if (tr != lanes[0].transposed) fail("ldmatrix lanes disagree on .trans");
        for (int i = 0; i < 4; i++) {
            uint32_t lo = tr ? M[i][2 * t][g] : M[i][g][2 * t];
            uint32_t hi = tr ? M[i][2 * t + 1][g] : M[i][g][2 * t + 1];
            lanes[lane].fragment[i] = lo | hi << 16;
        }
    }
}

inline void resolve_warp(thread_state *lanes) {
    op_kind op = lanes[0].op;
    for (int lane = 1; lane < 32; lane++)
        if (lanes[lane].op != op) fail("lanes of one warp wait at different primitives");
    if (op == OP_MMA) resolve_mma(lanes);
    if (op == OP_LDMATRIX) resolve_ldmatrix(lanes);
    for (int lane = 0; lane < 32; lane++) {
        thread_state &s = lanes[lane];
        if (op == OP_SHFL_XOR) s.value_result = lanes[lane ^ s.lane_mask].value;
        if (op == OP_SHFL_IDX) s.value_result = lanes[s.lane_mask & 31].value;
        if (op == OP_ANY) {
            s.predicate_result = 0;
            for (int other = 0; other < 32; other++)
                s.predicate_result |= lanes[other].predicate != 0;
        }
        s.op = OP_RUNNABLE;
    }
}

inline bool is_warp_op(op_kind op) {
    return op == OP_SYNC_WARP || op == OP_SHFL_XOR || op == OP_SHFL_IDX || op == OP_ANY ||
           op == OP_MMA || op == OP_LDMATRIX;
}
inline bool is_block_op(op_kind op) { return op == OP_BLOCK_SYNC || op == OP_BLOCK_OR; }

// bar.sync id, count: releases the threads at barrier `id` once `count` of them are there.
inline bool resolve_named_barriers(block_state &b) {
    bool released = false;
    for (auto &first : b.threads) {
        if (first.op != OP_NAMED_BAR) continue;
        int there = 0;
        for (auto &t : b.threads)
            if (t.op == OP_NAMED_BAR && t.bar_id == first.bar_id) {
                if (t.bar_count != first.bar_count) fail("bar.sync with different thread counts");
                there++;
            }
        if (there > first.bar_count) fail("more threads at a named barrier than its count");
        if (there < first.bar_count) continue;
        int id = first.bar_id;
        for (auto &t : b.threads)
            if (t.op == OP_NAMED_BAR && t.bar_id == id) t.op = OP_RUNNABLE;
        released = true;
    }
    return released;
}

// Releases whatever rendezvous is complete; false when nothing could be released.
inline bool resolve(block_state &b) {
    bool released = false;
    size_t n = b.threads.size(), waiting_block = 0, done = 0;
    for (size_t w = 0; w < n; w += 32) {
        int at_warp_op = 0;
        for (size_t l = w; l < w + 32; l++) at_warp_op += is_warp_op(b.threads[l].op);
        if (at_warp_op == 32) {
            resolve_warp(&b.threads[w]);
            released = true;
        } else if (at_warp_op > 0) {
            fail("a warp primitive was reached by only part of a warp");
        }
    }
    released |= resolve_hopper(b);
    released |= resolve_named_barriers(b);
    for (auto &t : b.threads)
        if (t.op == OP_COUNTER_WAIT && *t.counter >= t.counter_value) {
            if (*t.counter > t.counter_value) fail("a counter passed the value a thread waits for");
            t.op = OP_RUNNABLE;
            released = true;
        }
    for (auto &t : b.threads) {
        waiting_block += is_block_op(t.op);
        done += t.op == OP_DONE;
    }
    if (waiting_block > 0 && waiting_block + done == n) {
        if (done > 0) fail("__syncthreads after some threads of the block returned");
        int any = 0;
        for (auto &t : b.threads) any |= t.predicate != 0 && t.op == OP_BLOCK_OR;
        for (auto &t : b.threads) {
            t.predicate_result = any;
            t.op = OP_RUNNABLE;
        }
        released = true;
    }
    return released;
}

inline void thread_entry() {
    finish_switch(nullptr, true);
    g_block->body();
    if (!self()->copies.empty()) fail("a thread returned with cp.async copies never waited for");
    self()->op = OP_DONE;
    start_switch(g_scheduler_stack, g_scheduler_stack_size, nullptr, true);
    _longjmp(g_block->scheduler, 1); // its stack is dropped: nothing here to unwind
}

// Runs thread t until it waits at a rendezvous or finishes. Its own function, so that no local
// of the scheduler's loop lives across a _setjmp.
__attribute__((noinline)) inline void run_until_rendezvous(block_state &b, thread_state &t) {
    b.current = &t;
    if (_setjmp(b.scheduler) != 0) {
        finish_switch(b.sanitizer_save, false);
        return;
    }
    start_switch(t.stack.data(), t.stack.size(), &b.sanitizer_save);
    if (t.started) _longjmp(t.resume, 1);
    t.started = true;
    setcontext(&t.context);
    fail("setcontext failed");
}

// Runs `body` as one block of `threads` threads (a multiple of 32) with blockIdx = index.
inline void run_block(uint3 index, int threads, const std::function<void()> &body) {
    static block_state b; // stacks are kept between blocks
    b.body = body;
    b.threads.resize(threads);
    g_block = &b;
    g_block_index = index;
    g_block_dim = dim3(threads);
    for (int i = 0; i < threads; i++) {
        thread_state &t = b.threads[i];
        t.stack.resize(256 << 10);
        getcontext(&t.context);
        t.context.uc_stack.ss_sp = t.stack.data();
        t.context.uc_stack.ss_size = t.stack.size();
        t.context.uc_link = nullptr; // thread_entry never returns
        makecontext(&t.context, thread_entry, 0);
        t.started = false;
        t.index = make_uint3(i, 0, 0);
        t.op = OP_RUNNABLE;
        t.copies.clear();
        t.committed_groups = 0;
    }
    start_block_hopper(b);
    for (;;) {
        bool ran = false;
        int only_warp = -1; // g_warps_one_at_a_time: the warp that runs this round
        for (int i = 0; i < threads && g_warps_one_at_a_time && only_warp < 0; i++) {
            int k = g_threads_in_reverse ? threads - 1 - i : i;
            if (b.threads[k].op == OP_RUNNABLE) only_warp = k / 32;
        }
        for (int i = 0; i < threads; i++) {
            int k = g_threads_in_reverse ? threads - 1 - i : i;
            thread_state &t = b.threads[k];
            if (t.op == OP_RUNNABLE && (only_warp < 0 || k / 32 == only_warp)) {
                run_until_rendezvous(b, t);
                ran = true;
            }
        }
        // One warp at a time, a warpgroup's wgmma also complete as soon as all of it waits for
        // them, so that it runs ahead of the other warpgroups (products done, stages released)
        // as far as its barriers let it: a stage refilled while another warpgroup still reads
        // it is then refilled before that one reads it.
        if (g_warps_one_at_a_time) resolve_wgmma_waits(b);
        bool all_done = true;
        for (auto &t : b.threads) all_done = all_done && t.op == OP_DONE;
        if (all_done) break;
        // TMA copies land, then wgmma run, as late as they can: when nothing else moves.
        if (!resolve(b) && !ran && !land_tma_copies() && !resolve_wgmma_waits(b)) {
            for (auto &t : b.threads)
                if (t.op == OP_COUNTER_WAIT)
                    fail("a block waits for a count that no earlier block reached (on a GPU: "
                         "a hang, or a wait on a block launched later)");
            fail("threads wait at a rendezvous that can never complete");
        }
    }
    end_block_hopper(b);
}

// The order in which a launch's blocks run: a GPU promises none, so neither does the emulator. It
// walks the blocks with a stride coprime to their count from an offset, both drawn per launch
// from a seed that differs from process to process (WEFT_EMULATED_BLOCK_SEED fixes it; 0 runs
// them in index order). A kernel whose result depends on the order, as float atomics adding
// into one place do, then gives different bits in two runs of the same job, as on a GPU.
struct block_order {
    uint64_t stride, offset;
};

inline uint64_t next_random(uint64_t &state) { // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline block_order draw_block_order(uint64_t blocks) {
    static uint64_t state = []() -> uint64_t {
        const char *fixed = getenv("WEFT_EMULATED_BLOCK_SEED");
        if (fixed && *fixed) return strtoull(fixed, nullptr, 10);
        return ((uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(nullptr)) | 1;
    }();
    if (state == 0 || blocks < 2) return {1, 0};
    uint64_t stride = 1 + next_random(state) % blocks, offset = next_random(state) % blocks;
    while (std::gcd(stride, blocks) != 1) stride = stride % blocks + 1;
    return {stride, offset};
}

// A kernel launch: every block of `grid`, one at a time (in block_order's order, or in index
// order for a kernel whose blocks wait for earlier ones: WEFT_LAUNCH_IN_ORDER), checking the
// kernel stays inside the dynamic shared memory it was launched with (the bytes past it are a
// canary). A GPU starts blocks in index order, so a block may wait for a lower-indexed one; in
// index order here every such wait is met by blocks that already ran, and one that is not (a
// wait for a later block, which could hang a GPU) fails.
// What a GPU refuses at launch, refused here too, so that CI finds a launch no GPU would start:
// the CUDA programming guide's limits for compute capability 9.0 (those of 8.0 are lower only in
// shared memory: 163 KiB, and the kernels that ask for more than that are sm_90's).
constexpr unsigned MAX_BLOCK_THREADS = 1024, MAX_GRID_Y = 65535;
constexpr size_t MAX_DYNAMIC_SMEM = 227u << 10; // per block, after opting in past 48 KiB

inline void check_launch_limits(dim3 grid, unsigned threads, size_t smem_bytes) {
    char why[160] = "";
    if (threads == 0 || threads > MAX_BLOCK_THREADS || threads % 32 != 0)
        snprintf(why, sizeof why, "a block of %u threads: 32 to 1024, a multiple of 32", threads);
    else if (grid.x == 0 || grid.y == 0 || grid.y > MAX_GRID_Y || grid.z != 1)
        snprintf(why, sizeof why, "grid (%u, %u, %u): grid.y is at most 65535 (z unused here)",
                 grid.x, grid.y, grid.z);
    else if (smem_bytes > MAX_DYNAMIC_SMEM)
        snprintf(why, sizeof why, "%zu bytes of dynamic shared memory: a block has at most %zu",
                 smem_bytes, MAX_DYNAMIC_SMEM);
    if (why[0]) fail(why);
}

// Fills every kernel's static `__shared__` variables with 0xFF bytes (cuda_emulation_statics.cpp
// finds them in the program's symbol table), and how many it fills.
void poison_static_smem();
size_t static_smem_variables();

inline void run_grid(dim3 grid, unsigned threads, size_t smem_bytes,
                     const std::function<void()> &kernel, bool in_order = false) {
    constexpr size_t CANARY = 4096;
    check_launch_limits(grid, threads, smem_bytes);
    if (smem_bytes + CANARY > sizeof weft_dynamic_smem)
        fail("shared memory larger than the emulator's");
    g_grid_dim = grid;
    g_widest_block = threads > g_widest_block ? threads : g_widest_block;
    uint64_t blocks = (uint64_t)grid.x * grid.y;
    block_order order = in_order ? block_order{1, 0} : draw_block_order(blocks);
    for (uint64_t i = 0; i < blocks; i++) {
        uint64_t b = (order.offset + i * order.stride) % blocks;
        memset(weft_dynamic_smem, 0xA5, smem_bytes + CANARY);
        poison_static_smem();
        run_block(make_uint3((unsigned)(b % grid.x), (unsigned)(b / grid.x), 0), (int)threads,
                  kernel);
        for (size_t k = smem_bytes; k < smem_bytes + CANARY; k++)
            if (weft_dynamic_smem[k] != 0xA5) fail("kernel wrote past its dynamic shared memory");
    }
}

inline void launch(dim3 grid, unsigned threads, size_t smem_bytes, std::function<void()> kernel,
                   bool in_order = false) {
    stream_work([=] { run_grid(grid, threads, smem_bytes, kernel, in_order); });
}

} // namespace emu

// The arguments are evaluated at the launch, as on a GPU, and kept: a launch recorded in a graph
// runs later, with them (not with what `*args` or a local points to by then).
// The kernel may be a local pointer to one: it is captured with them.
#define WEFT_LAUNCH_WITH_ORDER(in_order, kernel, grid, threads, smem_bytes, stream, ...)           \
    emu::launch(dim3(grid), (threads), (size_t)(smem_bytes),                                       \
                [kernel_fn = (kernel), launch_args = std::make_tuple(__VA_ARGS__)] {               \
                    std::apply(kernel_fn, launch_args);                                            \
                },                                                                                 \
                in_order)
#define WEFT_LAUNCH(...) WEFT_LAUNCH_WITH_ORDER(false, __VA_ARGS__)
#define WEFT_LAUNCH_IN_ORDER(...) WEFT_LAUNCH_WITH_ORDER(true, __VA_ARGS__)

// Shared memory: `__shared__` variables are per block, and blocks run one at a time, so static
// storage stands in for them; dynamic shared memory is the one buffer above. A GPU's shared
// memory starts undefined, so run_grid fills the variables with 0xFF bytes (NaN as any float, -1
// as an int) before each block: a kernel reading one before its block writes it reads that
// rather than the last block's value or a zero.
#undef __shared__
#define __shared__ static
template <typename T> T *dynamic_smem() { return reinterpret_cast<T *>(weft_dynamic_smem); }

// The CUDA built-ins the kernels use. (The kernels pun bf16 pairs as 32-bit words, as CUDA code
// does: build with -fno-strict-aliasing.)
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#define threadIdx (emu::self()->index)
#define blockIdx (emu::g_block_index)
#define blockDim (emu::g_block_dim)
#define gridDim (emu::g_grid_dim)

inline void __syncthreads() { emu::rendezvous(emu::OP_BLOCK_SYNC); }
inline int __syncthreads_or(int predicate) {
    emu::self()->predicate = predicate;
    emu::rendezvous(emu::OP_BLOCK_OR);
    return emu::self()->predicate_result;
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu::rendezvous(emu::OP_SYNC_WARP); }
template <typename T> T __shfl_xor_sync(unsigned, T value, int lane_mask) {
    emu::self()->value = (double)value;
    emu::self()->lane_mask = lane_mask;
    emu::rendezvous(emu::OP_SHFL_XOR);
    return (T)emu::self()->value_result;
}
template <typename T> T __shfl_sync(unsigned, T value, int src_lane) {
    emu::self()->value = (double)value;
    emu::self()->lane_mask = src_lane; // the lane read from
    emu::rendezvous(emu::OP_SHFL_IDX);
    return (T)emu::self()->value_result;
}
inline int __any_sync(unsigned, int predicate) {
    emu::self()->predicate = predicate;
    emu::rendezvous(emu::OP_ANY);
    return emu::self()->predicate_result;
}
inline void weft_emulated_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    emu::thread_state *t = emu::self();
    memcpy(t->a, a, sizeof t->a);
    t->b[0] = b0;
    t->b[1] = b1;
    memcpy(t->c, c, sizeof t->c);
    emu::rendezvous(emu::OP_MMA);
    memcpy(c, t->d, sizeof t->d);
}
// bar.sync id, count (hopper.cuh's named_barrier).
inline void weft_emulated_named_barrier(int id, int count) {
    emu::self()->bar_id = id;
    emu::self()->bar_count = count;
    emu::rendezvous(emu::OP_NAMED_BAR);
}
// Spins until *counter == value (hopper.cuh's wait_counter).
inline void weft_emulated_wait_counter(const int *counter, int value) {
    emu::self()->counter = counter;
    emu::self()->counter_value = value;
    emu::rendezvous(emu::OP_COUNTER_WAIT);
}
// Threads switch only at the rendezvous points above, so a read-modify-write is atomic.
inline float atomicAdd(float *p, float x) {
    float old = *p;
    *p = old + x;
    return old;
}
inline double atomicAdd(double *p, double x) {
    double old = *p;
    *p = old + x;
    return old;
}
inline int atomicAdd(int *p, int x) {
    int old = *p;
    *p = old + x;
    return old;
}
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long x) {
    unsigned long long old = *p;
    *p = old + x;
    return old;
}
// One address space, and a thread runs until its next rendezvous: every write is seen at once.
inline void __threadfence() {}
template <typename T> inline T __ldcg(const T *p) { return *p; }
inline int atomicMax(int *p, int x) {
    int old = *p;
    *p = x > old ? x : old;
    return old;
}
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// An access of `bytes` at p (a power of two up to 16) needs p a multiple of it on a GPU.
inline void weft_emulated_check_alignment(const void *p, size_t bytes, const char *what) {
    if ((uintptr_t)p % bytes == 0) return;
    char why[128];
    snprintf(why, sizeof why, "%s of %zu bytes at an address %zu bytes past alignment: a GPU "
             "faults (misaligned address)", what, bytes, (size_t)((uintptr_t)p % bytes));
    emu::fail(why);
}
// ldmatrix and cp.async (attention_mma.cuh's wrappers call these under emulation); see
// g_copies_land_at_issue for when a copy lands.
inline void weft_emulated_ldmatrix(uint32_t r[4], const void *row, bool transposed) {
    weft_emulated_check_alignment(row, 16, "ldmatrix row");
    emu::thread_state *t = emu::self();
    t->row = row;
    t->transposed = transposed;
    emu::rendezvous(emu::OP_LDMATRIX);
    memcpy(r, t->fragment, sizeof t->fragment);
}
inline void weft_emulated_cp_async16(void *dst, const void *src, bool valid) {
    weft_emulated_check_alignment(dst, 16, "cp.async destination");
    if (valid) weft_emulated_check_alignment(src, 16, "cp.async source");
    emu::thread_state *t = emu::self();
    if (emu::g_copies_land_at_issue) {
        if (valid) memcpy(dst, src, 16);
        else memset(dst, 0, 16);
        return;
    }
    t->copies.push_back({dst, src, valid, t->committed_groups});
}
inline void weft_emulated_cp_async_commit() { emu::self()->committed_groups++; }
inline void weft_emulated_cp_async_wait(int pending_groups) {
    emu::thread_state *t = emu::self();
    std::vector<emu::pending_copy> later;
    for (const emu::pending_copy &c : t->copies) {
        if (c.group < t->committed_groups - pending_groups) {
            if (c.valid) memcpy(c.dst, c.src, 16);
            else memset(c.dst, 0, 16);
        } else {
            later.push_back(c);
        }
    }
    t->copies = later;
}
// cp.async.bulk.prefetch.L2.global (common.cuh's prefetch_rows): it reads nothing into the
// kernel, but the PTX ISA asks for a 16-byte aligned address and a size a multiple of 16, and the
// bytes must be the kernel's to read; both ends are touched, so AddressSanitizer builds see a row
// that runs past its allocation.
inline void weft_emulated_bulk_prefetch(const void *src, uint32_t bytes) {
    if (bytes == 0 || bytes % 16 || (uintptr_t)src % 16)
        emu::fail("cp.async.bulk.prefetch: size and address must be nonzero multiples of 16 bytes");
    const volatile unsigned char *p = static_cast<const unsigned char *>(src);
    (void)p[0], (void)p[bytes - 1];
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

#include "cuda_emulation_hopper.h"
