// Hopper's asynchronous instructions for the CUDA emulator (cuda_emulation.h), from the PTX ISA's
// definitions, written independently of the kernels (src/backend/cuda/hopper.cuh):
//
// mbarrier: a 64-bit object in shared memory with an expected arrival count, pending arrivals, a
//   transaction count and a phase. arrive (with expect_tx: first adds bytes to the transaction
//   count) takes one pending arrival; a TMA copy's complete_tx takes its bytes. When both reach
//   zero the phase completes: the phase number advances and the arrivals are re-armed.
//   try_wait.parity(P) is true once the phase of parity P has completed, that is when the
//   current phase's parity is not P (so on a fresh barrier, parity 1, "the phase before", is).
// TMA (cp.async.bulk.tensor.2d, tile mode): the box (box[0] columns x box[1] rows) at (x, y) of a
//   row-major tensor, rows one after another in shared memory, elements outside the tensor as
//   zeros, then complete_tx of the whole box's bytes on the barrier. With 128-byte swizzle the
//   16-byte chunk at shared address a goes to a ^ ((a >> 7) & 7) << 4. Copies land at issue
//   (g_copies_land_at_issue) or as late as possible: only when no thread can run otherwise.
// wgmma.mma_async m64nNk16, bf16 in, f32 accumulate: D (64 x N) = A (64 x 16) B (16 x N) (+ D).
//   A from a descriptor (K-major, or transposed (imm-trans-a) MN-major) or from registers (warp w of the warpgroup gives rows 16w ..
//   16w + 15 in the mma.m16n8k16 A fragment layout); B from a descriptor, K-major (N rows of 16)
//   or, transposed (imm-trans-b), MN-major (16 rows of N). D: warp w holds rows 16w + g and
//   16w + g + 8 at columns 8i + 2t, + 1 in d[4i .. 4i + 3], as mma's C fragment. Descriptor: bits
//   0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
//   62-63 swizzle (1 = 128-byte). 128-byte canonical layouts (CUTLASS's GMMA notation, in bf16
//   elements with T = 8): K-major ((8, m), (T, 2)) : ((8T, SBO), (1, T)); MN-major
//   ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO)); the swizzle applies to the final address.
//   The product is computed at wgmma.wait_group, once nothing else in the block can move, and
//   reads shared memory then (the latest the hardware may): a kernel that refills an operand's
//   buffer too early, or reads or writes the accumulators or an A operand's registers before the
//   wait, gets wrong numbers or an error here. Where copies land at issue, the product reads its
//   operands as early instead, when the last of its warpgroup's threads issues it: a kernel that
//   issues it before another thread's writes to an operand are ordered before (a missing
//   barrier) gets wrong numbers.
// Bulk reductions (cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32): bytes of fp32 from
//   shared memory added into global memory, in bulk groups (commit_group); the source is read at
//   the thread's cp.async.bulk.wait_group.read and the sums land at its wait_group, the latest
//   each may happen: a kernel that refills the source or counts the sums as landed too early gets
//   wrong numbers here.
#pragma once
#include <map>

namespace emu {

struct tensor_map {
    const unsigned char *base;
    uint64_t cols, rows, row_stride; // elements, elements, bytes
    uint32_t box_cols, box_rows, element_bytes, swizzle_bytes;
};

struct mbarrier {
    int expected, pending;
    int64_t tx;
    uint32_t phase;
};

struct tma_copy {
    unsigned char *dst;
    tensor_map map;
    int x, y;
    uint32_t bar;
};

struct wgmma_op {
    float *d;
    int n;
    bool a_in_registers, trans_a, trans_b, accumulate;
    uint32_t a[4];
    const uint32_t *a_registers; // where a came from: they must hold it until the wait
    uint64_t desc_a, desc_b;
    int group;
    std::vector<float> snapshot; // d at issue, to catch writes before the wait
    std::vector<float> early_a, early_b; // operands read at issue (execute_wgmma)
};

inline std::map<uint32_t, mbarrier> g_mbarriers; // of the running block, by shared address
inline std::vector<tma_copy> g_tma_copies;        // issued, not landed

// A bulk reduction (cp.reduce.async.bulk .add.f32) in flight: its source is read (snapshot) at
// the thread's wait_group.read, its sums land at its wait_group; both as late as allowed.
struct bulk_reduction {
    const thread_state *thread;
    float *dst;
    const float *src;
    uint32_t floats;
    int group;
    std::vector<float> snapshot;
};
inline std::vector<bulk_reduction> g_bulk_reductions;
inline std::map<const thread_state *, int> g_bulk_groups; // committed groups per thread

inline uint32_t smem_offset(const void *p, size_t bytes = 1) {
    const unsigned char *c = static_cast<const unsigned char *>(p);
    if (c < weft_dynamic_smem || c + bytes > weft_dynamic_smem + sizeof weft_dynamic_smem)
        fail("a Hopper instruction names an address outside (dynamic) shared memory");
    return (uint32_t)(c - weft_dynamic_smem);
}

inline uint32_t swizzle_128b(uint32_t address) { return address ^ ((address >> 7) & 7) << 4; }

inline mbarrier &barrier_at(uint32_t address) {
    auto it = g_mbarriers.find(address);
    if (it == g_mbarriers.end()) fail("mbarrier used before mbarrier.init");
    return it->second;
}

inline void complete_if_done(mbarrier &m) {
    if (m.pending == 0 && m.tx == 0) {
        m.phase++;
        m.pending = m.expected;
    }
}

inline void land(const tma_copy &c) {
    const tensor_map &m = c.map;
    uint32_t row_bytes = m.box_cols * m.element_bytes, start = smem_offset(c.dst);
    smem_offset(c.dst, (size_t)row_bytes * m.box_rows);
    for (uint32_t r = 0; r < m.box_rows; r++)
        for (uint32_t col = 0; col < m.box_cols; col++) {
            int64_t x = (int64_t)c.x + col, y = (int64_t)c.y + r;
            bool inside = x >= 0 && y >= 0 && (uint64_t)x < m.cols && (uint64_t)y < m.rows;
            uint32_t address = start + r * row_bytes + col * m.element_bytes;
            if (m.swizzle_bytes) address = swizzle_128b(address);
            unsigned char *dst = weft_dynamic_smem + address;
            if (inside)
                memcpy(dst, m.base + y * m.row_stride + x * m.element_bytes, m.element_bytes);
            else
                memset(dst, 0, m.element_bytes);
        }
    mbarrier &bar = barrier_at(c.bar);
    bar.tx -= (int64_t)row_bytes * m.box_rows;
    complete_if_done(bar);
}

// Lands every copy in flight; false when there was none.
inline bool land_tma_copies() {
    if (g_tma_copies.empty()) return false;
    std::vector<tma_copy> copies;
    copies.swap(g_tma_copies);
    for (const tma_copy &c : copies) land(c);
    return true;
}

// The byte address of element (mn, k) of a 128-byte-swizzled operand (see the top).
inline uint32_t operand_address(uint64_t desc, bool mn_major, int mn, int k) {
    uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, leading = (uint32_t)(desc >> 16 & 0x3FFF) << 4;
    uint32_t stride = (uint32_t)(desc >> 32 & 0x3FFF) << 4;
    if (desc >> 62 != 1 || (desc >> 49 & 7) != 0)
        fail("wgmma descriptor: only 128-byte swizzle with base offset 0 is emulated");
    uint32_t address;
    if (mn_major) {
        // The PTX ISA's canonical MN-major layouts are whole 64-element atoms (the K-major ones
        // may start 32, 64 or 96 bytes into a row, to step through K).
        if (start & 127) fail("wgmma descriptor: an MN-major operand starting mid-row of its atom");
        address = start + (mn % 64) * 2 + (mn / 64) * leading + (k % 8) * 128 + (k / 8) * stride;
    } else {
        if ((start & 127) + 32 > 128) fail("wgmma descriptor: a K-major k16 step crosses its row");
        address = start + (mn % 8) * 128 + (mn / 8) * stride + k * 2;
    }
    return swizzle_128b(address);
}

inline float smem_bf16(uint32_t address) {
    uint16_t bits;
    memcpy(&bits, weft_dynamic_smem + address, 2);
    return bf16_bits_to_float(bits);
}

// Fails unless the warpgroup's op i is the same instruction in every one of its 128 threads,
// and each thread's A registers (if A is in registers) still hold what it issued: the wait.
inline void check_wgmma_issued(thread_state *lanes, size_t i) {
    const wgmma_op &op = (*lanes[0].wgmma)[i];
    for (int lane = 0; lane < 128; lane++) {
        const wgmma_op &mine = (*lanes[lane].wgmma)[i];
        if (mine.n != op.n || mine.a_in_registers != op.a_in_registers ||
            mine.desc_a != op.desc_a || mine.desc_b != op.desc_b || mine.trans_a != op.trans_a ||
            mine.trans_b != op.trans_b || mine.accumulate != op.accumulate)
            fail("the threads of a warpgroup issued different wgmma");
        if (op.a_in_registers && memcmp(mine.a, mine.a_registers, sizeof mine.a))
            fail("wgmma A registers written between the wgmma and its wgmma.wait_group");
    }
}

// The operands A (64 x 16) and B (16 x N) of the warpgroup's op i: A from the registers each
// thread issued, or from shared memory, and B from shared memory, as it is now.
inline void wgmma_operands(thread_state *lanes, size_t i, std::vector<float> &A,
                           std::vector<float> &B) {
    const wgmma_op &op = (*lanes[0].wgmma)[i];
    int n = op.n;
    A.assign(64 * 16, 0.0f);
    B.assign(16 * (size_t)n, 0.0f);
    if (op.a_in_registers) {
        for (int lane = 0; lane < 128; lane++) {
            const uint32_t *a = (*lanes[lane].wgmma)[i].a;
            int row0 = 16 * (lane / 32), g = (lane & 31) >> 2, t = lane & 3;
            for (int half = 0; half < 2; half++) {
                int col = 2 * t + half, shift = 16 * half;
                A[(row0 + g) * 16 + col] = bf16_bits_to_float(a[0] >> shift);
                A[(row0 + g + 8) * 16 + col] = bf16_bits_to_float(a[1] >> shift);
                A[(row0 + g) * 16 + col + 8] = bf16_bits_to_float(a[2] >> shift);
                A[(row0 + g + 8) * 16 + col + 8] = bf16_bits_to_float(a[3] >> shift);
            }
        }
    } else {
        for (int m = 0; m < 64; m++)
            for (int k = 0; k < 16; k++)
                A[m * 16 + k] = smem_bf16(operand_address(op.desc_a, op.trans_a, m, k));
    }
    for (int k = 0; k < 16; k++)
        for (int c = 0; c < n; c++)
            B[k * n + c] = smem_bf16(operand_address(op.desc_b, op.trans_b, c, k));
}

// Runs the warpgroup's op i: with the operands it read when its last thread issued it
// (g_copies_land_at_issue: the earliest the hardware may read them, so a product issued before
// another thread's writes to its operands are ordered before it reads stale bytes), else with
// them as they are at the wait (the latest).
inline void execute_wgmma(thread_state *lanes, size_t i) {
    wgmma_op &op = (*lanes[0].wgmma)[i];
    int n = op.n;
    check_wgmma_issued(lanes, i);
    std::vector<float> A, B;
    if (op.early_a.empty()) wgmma_operands(lanes, i, A, B);
    else A.swap(op.early_a), B.swap(op.early_b);
    for (int lane = 0; lane < 128; lane++) {
        const wgmma_op &mine = (*lanes[lane].wgmma)[i];
        if (!mine.snapshot.empty() &&
            memcmp(mine.snapshot.data(), mine.d, mine.snapshot.size() * sizeof(float)))
            fail("wgmma accumulators written between the wgmma and its wgmma.wait_group");
        int row0 = 16 * (lane / 32), g = (lane & 31) >> 2, t = lane & 3;
        for (int e = 0; e < n / 2; e++) {
            int row = row0 + g + 8 * ((e >> 1) & 1), col = 8 * (e >> 2) + 2 * t + (e & 1);
            float acc = op.accumulate ? mine.d[e] : 0.0f;
            for (int k = 0; k < 16; k++) acc += A[row * 16 + k] * B[k * n + col];
            mine.d[e] = acc;
        }
    }
}

// The warpgroup at lanes waits: runs its groups older than the most recent `allowed`.
inline void resolve_wgmma_wait(thread_state *lanes) {
    int allowed = lanes[0].wgmma_pending_allowed, groups = lanes[0].wgmma_groups;
    size_t n_ops = lanes[0].wgmma->size();
    for (int lane = 0; lane < 128; lane++)
        if (lanes[lane].wgmma_pending_allowed != allowed || lanes[lane].wgmma_groups != groups ||
            lanes[lane].wgmma->size() != n_ops)
            fail("the threads of a warpgroup disagree on their wgmma groups");
    size_t done = 0;
    while (done < n_ops && (*lanes[0].wgmma)[done].group < groups - allowed) {
        execute_wgmma(lanes, done);
        done++;
    }
    for (int lane = 0; lane < 128; lane++) {
        lanes[lane].wgmma->erase(lanes[lane].wgmma->begin(), lanes[lane].wgmma->begin() + done);
        lanes[lane].op = OP_RUNNABLE;
    }
}

// Releases the barrier waits that are over.
inline bool resolve_hopper(block_state &b) {
    bool released = false;
    for (auto &t : b.threads)
        if (t.op == OP_MBAR_WAIT && (barrier_at(t.mbar).phase & 1) != (uint32_t)t.mbar_parity) {
            t.op = OP_RUNNABLE;
            released = true;
        }
    return released;
}

// Runs the wgmma of every warpgroup whose 128 threads all wait for them. The scheduler calls it
// last, when nothing else can move, so the products read shared memory as late as they can:
// after any copy a kernel let into their buffers too early.
inline bool resolve_wgmma_waits(block_state &b) {
    bool released = false;
    for (size_t w = 0; w + 128 <= b.threads.size(); w += 128) {
        int waiting = 0;
        for (size_t l = w; l < w + 128; l++) waiting += b.threads[l].op == OP_WGMMA_WAIT;
        if (waiting == 128) {
            resolve_wgmma_wait(&b.threads[w]);
            released = true;
        }
    }
    return released;
}

inline void start_block_hopper(block_state &b) {
    g_mbarriers.clear();
    g_tma_copies.clear();
    g_bulk_reductions.clear();
    g_bulk_groups.clear();
    for (auto &t : b.threads) {
        if (!t.wgmma) t.wgmma = new std::vector<wgmma_op>;
        t.wgmma->clear();
        t.wgmma_groups = 0;
    }
}

inline void end_block_hopper(block_state &b) {
    if (!g_tma_copies.empty()) fail("a block ended with TMA copies in flight");
    if (!g_bulk_reductions.empty()) fail("a block ended with bulk reductions never waited for");
    for (auto &t : b.threads) {
        if (!t.wgmma->empty()) fail("a thread ended with wgmma never waited for");
        delete t.wgmma; // the block's threads go with it
        t.wgmma = nullptr;
    }
}

} // namespace emu

inline uint32_t weft_emulated_smem_address(const void *p) { return emu::smem_offset(p); }

inline void weft_emulated_mbar_init(uint64_t *bar, int count) {
    if (count < 1) emu::fail("mbarrier.init with a count below 1");
    weft_emulated_check_alignment(bar, 8, "mbarrier"); // an 8-byte object on a GPU
    emu::g_mbarriers[emu::smem_offset(bar, 8)] = {count, count, 0, 0};
}

inline void weft_emulated_mbar_arrive(uint64_t *bar, uint32_t expect_tx_bytes) {
    emu::mbarrier &m = emu::barrier_at(emu::smem_offset(bar, 8));
    if (m.pending == 0) emu::fail("mbarrier arrival beyond its expected count");
    m.tx += expect_tx_bytes;
    m.pending--;
    emu::complete_if_done(m);
}

inline void weft_emulated_mbar_wait(uint64_t *bar, int parity) {
    emu::thread_state *t = emu::self();
    t->mbar = emu::smem_offset(bar, 8);
    t->mbar_parity = parity & 1;
    emu::barrier_at(t->mbar);
    emu::rendezvous(emu::OP_MBAR_WAIT);
}

inline void weft_emulated_tma_load_2d(void *dst, const emu::tensor_map *map, int x, int y,
                                      uint64_t *bar) {
    if (map->swizzle_bytes && emu::smem_offset(dst) % 1024)
        emu::fail("TMA with 128-byte swizzle into shared memory not 1024-byte aligned");
    emu::tma_copy c{static_cast<unsigned char *>(dst), *map, x, y, emu::smem_offset(bar, 8)};
    emu::barrier_at(c.bar);
    if (emu::g_copies_land_at_issue) emu::land(c);
    else emu::g_tma_copies.push_back(c);
}

// Host side: cuTensorMapEncodeTiled's arguments for a 2-D bf16 tensor (rows of `cols` elements,
// `row_stride` bytes apart), with the same checks the driver makes.
inline emu::tensor_map weft_emulated_tensor_map_2d(const void *base, uint64_t cols, uint64_t rows,
                                                   uint64_t row_stride, uint32_t box_cols,
                                                   uint32_t box_rows, bool swizzle_128b) {
    if ((uintptr_t)base % 16 || row_stride % 16 || cols == 0 || rows == 0 || box_cols > 256 ||
        box_rows > 256 || (box_cols * 2) % 16 || (swizzle_128b && box_cols * 2 > 128))
        emu::fail("cuTensorMapEncodeTiled would refuse these arguments");
    return {static_cast<const unsigned char *>(base), cols, rows, row_stride,
            box_cols,                                 box_rows, 2,    swizzle_128b ? 128u : 0u};
}

inline void weft_emulated_wgmma(float *d, int n, const uint32_t *a, uint64_t desc_a,
                                uint64_t desc_b, int accumulate, bool trans_a, bool trans_b) {
    emu::thread_state *t = emu::self();
    if (a && trans_a) emu::fail("wgmma: imm-trans-a with A in registers");
    if (n < 8 || n > 256 || n % 8) emu::fail("wgmma: no m64nNk16 shape has that N");
    emu::wgmma_op op{d,     n,      a != nullptr, trans_a, trans_b, accumulate != 0, {0, 0, 0, 0},
                     a,     desc_a, desc_b,       t->wgmma_groups, {},  {}, {}};
    if (a) memcpy(op.a, a, sizeof op.a);
    bool chained = false; // an earlier pending op writes the same accumulators
    for (const emu::wgmma_op &other : *t->wgmma) chained |= other.d == d;
    if (!chained) op.snapshot.assign(d, d + n / 2);
    t->wgmma->push_back(op);
    if (!emu::g_copies_land_at_issue) return;
    // The last of the warpgroup's threads to issue it: the product may read its operands now.
    emu::thread_state *lanes = &emu::g_block->threads[(t - &emu::g_block->threads[0]) / 128 * 128];
    size_t i = t->wgmma->size() - 1;
    for (int lane = 0; lane < 128; lane++)
        if (!lanes[lane].wgmma || lanes[lane].wgmma->size() <= i) return;
    emu::wgmma_op &op0 = (*lanes[0].wgmma)[i];
    emu::wgmma_operands(lanes, i, op0.early_a, op0.early_b);
}

inline void weft_emulated_wgmma_commit() { emu::self()->wgmma_groups++; }

inline void weft_emulated_wgmma_wait(int pending_groups) {
    emu::thread_state *t = emu::self();
    t->wgmma_pending_allowed = pending_groups;
    if ((t->index.x & ~127u) + 128 > emu::g_block_dim.x)
        emu::fail("wgmma.wait_group in a block that is not whole warpgroups");
    emu::rendezvous(emu::OP_WGMMA_WAIT);
}

// cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 and its group instructions.
inline void weft_emulated_bulk_reduce_add(float *dst, const void *src, uint32_t bytes) {
    emu::smem_offset(src, bytes);
    if (bytes % 16 || (uintptr_t)dst % 16 || emu::smem_offset(src) % 16)
        emu::fail("cp.reduce.async.bulk: size and addresses must be multiples of 16 bytes");
    const emu::thread_state *t = emu::self();
    emu::g_bulk_reductions.push_back(
        {t, dst, static_cast<const float *>(src), bytes / 4, emu::g_bulk_groups[t], {}});
}
inline void weft_emulated_bulk_commit() { emu::g_bulk_groups[emu::self()]++; }
// Waits until at most `pending` of this thread's groups are in flight (read_only: have not yet
// read their source).
inline void weft_emulated_bulk_wait(int pending, bool read_only) {
    const emu::thread_state *t = emu::self();
    int older_than = emu::g_bulk_groups[t] - pending;
    std::vector<emu::bulk_reduction> later;
    for (emu::bulk_reduction &r : emu::g_bulk_reductions) {
        if (r.thread != t || r.group >= older_than) {
            later.push_back(std::move(r));
            continue;
        }
        if (r.snapshot.empty()) r.snapshot.assign(r.src, r.src + r.floats);
        if (read_only) {
            later.push_back(std::move(r));
            continue;
        }
        for (uint32_t i = 0; i < r.floats; i++) r.dst[i] += r.snapshot[i];
    }
    emu::g_bulk_reductions.swap(later);
}
