#include "rollout/kv_cache.h"

#include <string.h>

typedef struct kv_seq {
    int32_t *blocks; // the block of each block_size positions
    int n, cap;
    bool live;
} kv_seq;

struct weft_kv_cache {
    weft_backend *be;
    weft_kv_pool pool;
    size_t block_bytes;
    int *holders;      // (n_blocks) sequences holding each block
    int32_t *free_list; // (n_blocks) a stack of free blocks
    long n_free, peak_used, copies;
    long shared, peak_shared; // blocks with more than one holder
    kv_seq *seqs;
    int n_seqs, seq_cap;
};

size_t weft_kv_cache_block_bytes(const weft_backend *be, int layers, int width, int block_size) {
    return (size_t)layers * 2 * block_size * width * weft_dtype_size(be->act_dtype);
}

weft_kv_cache *weft_kv_cache_create(weft_backend *be, int layers, int width, int block_size,
                                    long n_blocks) {
    WEFT_CHECK(block_size >= 1 && n_blocks >= 1 && n_blocks < (1L << 31),
               "rollout: a KV cache of %ld blocks of %d positions cannot be made; raise "
               "rollout.kv_cache_tokens (or rollout.kv_cache_fraction)", n_blocks, block_size);
    weft_kv_cache *c = weft_alloc(sizeof *c);
    c->be = be;
    c->block_bytes = weft_kv_cache_block_bytes(be, layers, width, block_size);
    c->pool = (weft_kv_pool){.data = be->alloc(be, c->block_bytes * (size_t)n_blocks),
                             .n_blocks = (int)n_blocks, .layers = layers,
                             .block_size = block_size, .width = width};
    c->holders = weft_alloc(sizeof(int) * n_blocks);
    c->free_list = weft_alloc(sizeof(int32_t) * n_blocks);
    // Lowest blocks first off the stack: a fresh pool hands out 0, 1, 2, ...
    for (long b = 0; b < n_blocks; b++) c->free_list[b] = (int32_t)(n_blocks - 1 - b);
    c->n_free = n_blocks;
    return c;
}

void weft_kv_cache_free(weft_kv_cache *c) {
    if (!c) return;
    for (int s = 0; s < c->n_seqs; s++) weft_free(c->seqs[s].blocks);
    weft_free(c->seqs);
    c->be->free(c->be, c->pool.data);
    weft_free(c->holders);
    weft_free(c->free_list);
    weft_free(c);
}

const weft_kv_pool *weft_kv_cache_pool(const weft_kv_cache *c) { return &c->pool; }
int weft_kv_cache_block_size(const weft_kv_cache *c) { return c->pool.block_size; }
long weft_kv_cache_free_blocks(const weft_kv_cache *c) { return c->n_free; }

weft_kv_cache_stats weft_kv_cache_stats_now(const weft_kv_cache *c) {
    weft_kv_cache_stats s = {.blocks_total = c->pool.n_blocks, .blocks_free = c->n_free,
                             .blocks_used = c->pool.n_blocks - c->n_free,
                             .peak_used = c->peak_used, .copies = c->copies,
                             .blocks_shared = c->shared, .peak_shared = c->peak_shared,
                             .pool_bytes = c->block_bytes * (size_t)c->pool.n_blocks};
    return s;
}

// ------------------------------------------------------------------------------ sequences ----

static kv_seq *seq_of(const weft_kv_cache *c, int seq) {
    WEFT_CHECK(seq >= 0 && seq < c->n_seqs && c->seqs[seq].live,
               "internal: KV cache sequence %d does not exist", seq);
    return &c->seqs[seq];
}

int weft_kv_seq_new(weft_kv_cache *c) {
    int s = 0;
    while (s < c->n_seqs && c->seqs[s].live) s++;
    if (s == c->n_seqs) {
        c->seqs = weft_grow(c->seqs, c->n_seqs, &c->seq_cap, sizeof(kv_seq), 64);
        c->seqs[c->n_seqs++] = (kv_seq){0};
    }
    c->seqs[s].live = true;
    c->seqs[s].n = 0;
    return s;
}

static void seq_push(kv_seq *q, int32_t block) {
    q->blocks = weft_grow(q->blocks, q->n, &q->cap, sizeof(int32_t), 16);
    q->blocks[q->n++] = block;
}

int weft_kv_seq_fork(weft_kv_cache *c, int src) {
    int dst = weft_kv_seq_new(c); // may move the table: look src up after
    const kv_seq *from = seq_of(c, src);
    for (int i = 0; i < from->n; i++) {
        seq_push(&c->seqs[dst], from->blocks[i]);
        if (++c->holders[from->blocks[i]] == 2) c->shared++;
    }
    if (c->shared > c->peak_shared) c->peak_shared = c->shared;
    return dst;
}

// The blocks [first, last) a write of positions [from, len) touches.
static void written_blocks(const weft_kv_cache *c, int from, int len, int *first, int *last) {
    int bs = c->pool.block_size;
    *first = from / bs;
    *last = (len + bs - 1) / bs;
}

long weft_kv_seq_blocks_needed(const weft_kv_cache *c, int seq, int from, int len) {
    const kv_seq *q = seq_of(c, seq);
    int first, last;
    written_blocks(c, from, len, &first, &last);
    long needed = last > q->n ? last - q->n : 0;
    for (int b = first; b < q->n && b < last; b++) needed += c->holders[q->blocks[b]] > 1;
    return needed;
}

static int32_t take_block(weft_kv_cache *c) {
    int32_t b = c->free_list[--c->n_free];
    c->holders[b] = 1;
    long used = c->pool.n_blocks - c->n_free;
    if (used > c->peak_used) c->peak_used = used;
    return b;
}

bool weft_kv_seq_reserve(weft_kv_cache *c, int seq, int from, int len) {
    if (weft_kv_seq_blocks_needed(c, seq, from, len) > c->n_free) return false;
    kv_seq *q = seq_of(c, seq);
    int first, last;
    written_blocks(c, from, len, &first, &last);
    for (int b = first; b < q->n && b < last; b++) {
        int32_t old = q->blocks[b];
        if (c->holders[old] == 1) continue;
        int32_t mine = take_block(c); // copy on write: the other holders keep `old`
        char *data = c->pool.data;
        c->be->copy(c->be, data + c->block_bytes * mine, data + c->block_bytes * old,
                    c->block_bytes);
        if (--c->holders[old] == 1) c->shared--;
        q->blocks[b] = mine;
        c->copies++;
    }
    while (q->n < last) seq_push(q, take_block(c));
    return true;
}

static void drop_block(weft_kv_cache *c, int32_t block) {
    int left = --c->holders[block];
    if (left == 1) c->shared--;
    if (left == 0) c->free_list[c->n_free++] = block;
}

void weft_kv_seq_truncate(weft_kv_cache *c, int seq, int len) {
    kv_seq *q = seq_of(c, seq);
    int keep = (len + c->pool.block_size - 1) / c->pool.block_size;
    while (q->n > keep) drop_block(c, q->blocks[--q->n]);
}

void weft_kv_seq_release(weft_kv_cache *c, int seq) {
    kv_seq *q = seq_of(c, seq);
    for (int i = 0; i < q->n; i++) drop_block(c, q->blocks[i]);
    q->n = 0;
    q->live = false;
}

const int32_t *weft_kv_seq_blocks(const weft_kv_cache *c, int seq, int *n_blocks) {
    const kv_seq *q = seq_of(c, seq);
    *n_blocks = q->n;
    return q->blocks;
}
