#include "rollout/kv_cache.h"

#include <string.h>

typedef struct kv_seq {
    int32_t *blocks; // the block of each block_size positions
    int n, cap;
    bool live;
    // Prefix caching: blocks [0, published) are registered (by this sequence or another holding
    // the same content); the next one's parent is `parent` at its generation `parent_gen`.
    int published;
    int32_t parent;
    uint32_t parent_gen;
} kv_seq;

// The prefix index: full blocks whose keys and values are computed, registered under their
// content, which is their tokens and the registered block before them (its id and generation:
// a block taken again for other content gets a new generation, so what was registered under the
// old one is never found again). Lookups compare all of it: no hash collision can hand a
// sequence another prefix's keys. Its arrays cover the blocks taken so far (cap of them, grown as
// higher block ids are handed out): a pool reserved for the worst case costs host memory only
// for the blocks used, as the pool itself does.
typedef struct prefix_index {
    int cap;                  // blocks covered
    int lookahead;            // tokens after a block that its content includes
    int width;                // block_size + lookahead: the tokens compared
    int32_t *tokens;          // (cap, width) a registered block's, and those after it
    int32_t *parent;          // (cap) -1: the sequence's first block
    uint32_t *parent_gen;     // (cap)
    uint32_t *generation;     // (cap) bumped whenever the block is taken
    bool *registered;         // (cap)
    int32_t *bucket, *next;   // (about 2 cap) chains' heads, (cap) their links; -1 ends
    uint64_t mask;            // buckets - 1
    // Free registered blocks, least recently freed first: taken only when no plain free block is
    // left, so a prefix stays findable for as long as the pool allows.
    int32_t *lru_prev, *lru_next; // (cap)
    int32_t lru_head, lru_tail;
    long n_lru;
} prefix_index;

struct weft_kv_cache {
    weft_backend *be;
    weft_kv_pool pool;
    size_t block_bytes;
    int *holders;       // (n_blocks) sequences holding each block
    int32_t *free_list; // (n_blocks) a stack of free blocks holding no registered prefix
    long n_stack;       // blocks on that stack
    long n_free, peak_used, copies; // n_free: the stack's and the free registered blocks
    long shared, peak_shared; // blocks with more than one holder
    kv_seq *seqs;
    int n_seqs, seq_cap;
    prefix_index *prefixes; // NULL: prefix caching off
};

// ------------------------------------------------------------------------- prefix caching ----

static void prefixes_free(prefix_index *x) {
    if (!x) return;
    weft_free(x->tokens), weft_free(x->parent), weft_free(x->parent_gen);
    weft_free(x->generation), weft_free(x->registered), weft_free(x->bucket), weft_free(x->next);
    weft_free(x->lru_prev), weft_free(x->lru_next);
    weft_free(x);
}

void weft_kv_cache_enable_prefixes(weft_kv_cache *c, int lookahead) {
    if (c->prefixes) return;
    prefix_index *x = weft_alloc(sizeof *x);
    x->lookahead = lookahead, x->width = c->pool.block_size + lookahead;
    x->lru_head = x->lru_tail = -1;
    c->prefixes = x;
}

static void *grown(void *old, size_t old_bytes, size_t bytes) {
    void *p = weft_alloc(bytes);
    if (old) memcpy(p, old, old_bytes);
    weft_free(old);
    return p;
}

static uint64_t content_hash(int32_t parent, uint32_t parent_gen, const int32_t *tokens, int bs) {
    uint64_t h = ((uint64_t)(uint32_t)parent << 32 | parent_gen) ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < bs; i++) {
        h = (h ^ (uint32_t)tokens[i]) * 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return h;
}

// The index made to cover block b (and at least twice the blocks it covered), its chains rebuilt
// over the larger bucket table.
static void prefixes_cover(weft_kv_cache *c, int32_t b) {
    prefix_index *x = c->prefixes;
    if (b < x->cap) return;
    size_t was = (size_t)x->cap, cap = was * 2 > (size_t)b + 1 ? was * 2 : (size_t)b + 1;
    if (cap < 64) cap = 64;
    if (cap > (size_t)c->pool.n_blocks) cap = (size_t)c->pool.n_blocks;
    size_t bs = (size_t)x->width, buckets = 1;
    x->tokens = grown(x->tokens, sizeof(int32_t) * was * bs, sizeof(int32_t) * cap * bs);
    x->parent = grown(x->parent, sizeof(int32_t) * was, sizeof(int32_t) * cap);
    x->next = grown(x->next, sizeof(int32_t) * was, sizeof(int32_t) * cap);
    x->lru_prev = grown(x->lru_prev, sizeof(int32_t) * was, sizeof(int32_t) * cap);
    x->lru_next = grown(x->lru_next, sizeof(int32_t) * was, sizeof(int32_t) * cap);
    x->parent_gen = grown(x->parent_gen, sizeof(uint32_t) * was, sizeof(uint32_t) * cap);
    x->generation = grown(x->generation, sizeof(uint32_t) * was, sizeof(uint32_t) * cap);
    x->registered = grown(x->registered, sizeof(bool) * was, sizeof(bool) * cap);
    while (buckets < 2 * cap) buckets <<= 1;
    weft_free(x->bucket);
    x->bucket = weft_alloc(sizeof(int32_t) * buckets);
    memset(x->bucket, 0xff, sizeof(int32_t) * buckets); // -1: empty
    x->mask = buckets - 1;
    x->cap = (int)cap;
    for (int32_t r = 0; r < x->cap; r++) {
        if (!x->registered[r]) continue;
        int32_t *head = &x->bucket[content_hash(x->parent[r], x->parent_gen[r],
                                                x->tokens + (size_t)r * bs, (int)bs) & x->mask];
        x->next[r] = *head;
        *head = r;
    }
}

// The registered block holding `tokens` after block parent of generation parent_gen, or -1.
static int32_t find_registered(const weft_kv_cache *c, int32_t parent, uint32_t parent_gen,
                               const int32_t *tokens) {
    const prefix_index *x = c->prefixes;
    int bs = x->width;
    if (x->cap == 0) return -1;
    for (int32_t b = x->bucket[content_hash(parent, parent_gen, tokens, bs) & x->mask]; b >= 0;
         b = x->next[b])
        if (x->parent[b] == parent && x->parent_gen[b] == parent_gen &&
            memcmp(x->tokens + (size_t)b * bs, tokens, sizeof(int32_t) * bs) == 0)
            return b;
    return -1;
}

static int32_t *chain_of(const weft_kv_cache *c, int32_t b) {
    const prefix_index *x = c->prefixes;
    int bs = x->width;
    return &x->bucket[content_hash(x->parent[b], x->parent_gen[b], x->tokens + (size_t)b * bs,
                                   bs) & x->mask];
}

static void register_block(weft_kv_cache *c, int32_t b, int32_t parent, uint32_t parent_gen,
                           const int32_t *tokens) {
    prefix_index *x = c->prefixes;
    int bs = x->width;
    memcpy(x->tokens + (size_t)b * bs, tokens, sizeof(int32_t) * bs);
    x->parent[b] = parent, x->parent_gen[b] = parent_gen;
    int32_t *head = chain_of(c, b);
    x->next[b] = *head;
    *head = b;
    x->registered[b] = true;
}

static void unregister_block(weft_kv_cache *c, int32_t b) {
    prefix_index *x = c->prefixes;
    int32_t *link = chain_of(c, b);
    while (*link != b) link = &x->next[*link];
    *link = x->next[b];
    x->registered[b] = false;
}

// The free registered blocks: freed at the tail, evicted at the head.
static void lru_push(prefix_index *x, int32_t b) {
    x->lru_prev[b] = x->lru_tail, x->lru_next[b] = -1;
    if (x->lru_tail >= 0) x->lru_next[x->lru_tail] = b;
    else x->lru_head = b;
    x->lru_tail = b;
    x->n_lru++;
}

static void lru_remove(prefix_index *x, int32_t b) {
    int32_t prev = x->lru_prev[b], next = x->lru_next[b];
    if (prev >= 0) x->lru_next[prev] = next;
    else x->lru_head = next;
    if (next >= 0) x->lru_prev[next] = prev;
    else x->lru_tail = prev;
    x->n_lru--;
}

void weft_kv_cache_forget_prefixes(weft_kv_cache *c) {
    prefix_index *x = c->prefixes;
    if (!x) return;
    while (x->lru_head >= 0) {
        int32_t b = x->lru_head;
        lru_remove(x, b);
        c->free_list[c->n_stack++] = b;
    }
    if (x->cap > 0) {
        memset(x->bucket, 0xff, sizeof(int32_t) * (x->mask + 1));
        memset(x->registered, 0, sizeof(bool) * (size_t)x->cap);
    }
    for (int s = 0; s < c->n_seqs; s++) c->seqs[s].published = 0, c->seqs[s].parent = -1;
}

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
    c->n_free = c->n_stack = n_blocks;
    return c;
}

void weft_kv_cache_free(weft_kv_cache *c) {
    if (!c) return;
    for (int s = 0; s < c->n_seqs; s++) weft_free(c->seqs[s].blocks);
    weft_free(c->seqs);
    c->be->free(c->be, c->pool.data);
    weft_free(c->holders);
    weft_free(c->free_list);
    prefixes_free(c->prefixes);
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
    c->seqs[s].n = c->seqs[s].published = 0;
    c->seqs[s].parent = -1, c->seqs[s].parent_gen = 0;
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
    kv_seq *to = &c->seqs[dst];
    to->published = from->published, to->parent = from->parent, to->parent_gen = from->parent_gen;
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
    int32_t b;
    if (c->n_stack > 0) {
        b = c->free_list[--c->n_stack];
    } else { // the least recently freed prefix goes
        b = c->prefixes->lru_head;
        lru_remove(c->prefixes, b);
        unregister_block(c, b);
    }
    c->n_free--;
    if (c->prefixes) { // what was registered under it is stale
        prefixes_cover(c, b);
        c->prefixes->generation[b]++;
    }
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
    if (left > 0) return;
    prefix_index *x = c->prefixes;
    if (x && block < x->cap && x->registered[block]) lru_push(x, block); // still findable
    else c->free_list[c->n_stack++] = block;
    c->n_free++;
}

void weft_kv_seq_truncate(weft_kv_cache *c, int seq, int len) {
    kv_seq *q = seq_of(c, seq);
    int keep = (len + c->pool.block_size - 1) / c->pool.block_size;
    WEFT_CHECK(q->published <= keep, "internal: KV cache blocks registered as a prefix were cut");
    while (q->n > keep) drop_block(c, q->blocks[--q->n]);
}

void weft_kv_seq_release(weft_kv_cache *c, int seq) {
    kv_seq *q = seq_of(c, seq);
    // Last block first: a prefix's later blocks are evicted before its earlier ones, which
    // every longer match needs.
    for (int i = q->n - 1; i >= 0; i--) drop_block(c, q->blocks[i]);
    q->n = 0;
    q->live = false;
}

const int32_t *weft_kv_seq_blocks(const weft_kv_cache *c, int seq, int *n_blocks) {
    const kv_seq *q = seq_of(c, seq);
    *n_blocks = q->n;
    return q->blocks;
}

// ----------------------------------------------------------------- prefixes of a sequence ----

int weft_kv_seq_match_prefix(weft_kv_cache *c, int seq, const int32_t *tokens, int n_tokens,
                             int max_positions) {
    kv_seq *q = seq_of(c, seq);
    if (!c->prefixes || q->n > 0) return 0;
    prefix_index *x = c->prefixes;
    int bs = c->pool.block_size;
    while ((q->n + 1) * bs <= max_positions && (q->n + 1) * bs + x->lookahead <= n_tokens) {
        int32_t b = find_registered(c, q->parent, q->parent_gen, tokens + (size_t)q->n * bs);
        if (b < 0) break;
        if (c->holders[b] == 0) lru_remove(x, b), c->n_free--;
        if (++c->holders[b] == 2) c->shared++;
        seq_push(q, b);
        q->parent = b, q->parent_gen = x->generation[b];
    }
    q->published = q->n;
    long used = c->pool.n_blocks - c->n_free;
    if (used > c->peak_used) c->peak_used = used;
    if (c->shared > c->peak_shared) c->peak_shared = c->shared;
    return q->n * bs;
}

void weft_kv_seq_publish(weft_kv_cache *c, int seq, const int32_t *tokens, int n_tokens,
                         int final_positions) {
    if (!c->prefixes) return;
    kv_seq *q = seq_of(c, seq);
    prefix_index *x = c->prefixes;
    int bs = c->pool.block_size;
    for (; q->published < q->n && (q->published + 1) * bs <= final_positions &&
           (q->published + 1) * bs + x->lookahead <= n_tokens;
         q->published++) {
        const int32_t *t = tokens + (size_t)q->published * bs;
        int32_t b = q->blocks[q->published];
        // The same content computed twice (by sequences that ran side by side) is registered
        // once; the later sequence's next blocks hang under the first's.
        int32_t same = find_registered(c, q->parent, q->parent_gen, t);
        if (same < 0) {
            WEFT_CHECK(!x->registered[b], "internal: a KV cache block registered as another "
                       "prefix was written");
            register_block(c, b, q->parent, q->parent_gen, t);
            same = b;
        }
        q->parent = same, q->parent_gen = x->generation[same];
    }
}
