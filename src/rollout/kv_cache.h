// rollout: the paged KV cache (DESIGN.md section 11). A pool of fixed-size blocks on the device
// (backend.h's weft_kv_pool) and, per sequence, the table of blocks holding its positions. The n
// samples of one prompt share the prompt's blocks through reference counts; a sample about to
// write into a block it shares gets its own copy first (copy on write), so only the partly filled
// last block is ever copied. The pool exists between weft_kv_cache_create and _free: the RL loop
// frees it while training runs (sleep) and makes it again to generate (wake).
#pragma once
#include "backend/backend.h"

typedef struct weft_kv_cache weft_kv_cache;

typedef struct weft_kv_cache_stats {
    long blocks_total, blocks_used, blocks_shared, blocks_free;
    long peak_used;    // the most blocks in use at once
    long peak_shared;  // the most blocks shared at once
    long copies;       // blocks copied on write
    size_t pool_bytes; // device bytes the pool holds
} weft_kv_cache_stats;

// A pool of n_blocks blocks of block_size positions for `layers` layers of key/value rows of
// `width` elements (kv heads x head dim).
weft_kv_cache *weft_kv_cache_create(weft_backend *be, int layers, int width, int block_size,
                                    long n_blocks);
void weft_kv_cache_free(weft_kv_cache *c);
// The pool's size in bytes for a given block count, and blocks that fit in `bytes`.
size_t weft_kv_cache_block_bytes(const weft_backend *be, int layers, int width, int block_size);
const weft_kv_pool *weft_kv_cache_pool(const weft_kv_cache *c);
int weft_kv_cache_block_size(const weft_kv_cache *c);
weft_kv_cache_stats weft_kv_cache_stats_now(const weft_kv_cache *c);

// Prefix caching: full blocks whose keys and values are final are registered by content (their
// tokens, the `lookahead` tokens after them and everything before them) and found again by
// sequences starting with the same tokens, which then compute only what follows. Freed, such a
// block stays findable until the pool needs it (least recently freed first). A block's keys must
// depend on no token past its lookahead (MTP module j's keys read the token j positions on: a
// lookahead of the modules' count), and the weights must not change while prefixes are kept:
// forget them first.
void weft_kv_cache_enable_prefixes(weft_kv_cache *c, int lookahead);
void weft_kv_cache_forget_prefixes(weft_kv_cache *c);

// Sequences: handles >= 0. A new sequence holds no position.
int weft_kv_seq_new(weft_kv_cache *c);
// A new sequence holding the same positions as src, its blocks shared.
int weft_kv_seq_fork(weft_kv_cache *c, int src);
// Makes room for positions [0, len) (len never shrinks) and, for every block positions
// [from, len) fall in, its own copy (positions below from are only read). False, changing
// nothing, when the free blocks do not suffice.
bool weft_kv_seq_reserve(weft_kv_cache *c, int seq, int from, int len);
// Blocks weft_kv_seq_reserve(c, seq, from, len) would take from the free list.
long weft_kv_seq_blocks_needed(const weft_kv_cache *c, int seq, int from, int len);
// Keeps only the blocks positions [0, len) fall in, giving the rest back (speculative decoding's
// rejected positions).
void weft_kv_seq_truncate(weft_kv_cache *c, int seq, int len);
// A sequence holding no block takes the longest run of registered blocks that holds its
// tokens[0, k * block_size) within max_positions (with their lookahead within its n_tokens
// tokens); returns the positions it now holds (k * block_size; 0 without prefix caching).
int weft_kv_seq_match_prefix(weft_kv_cache *c, int seq, const int32_t *tokens, int n_tokens,
                             int max_positions);
// Registers the sequence's full blocks within positions [0, final_positions), whose keys and
// values are final (computed from its n_tokens tokens, which hold each one's lookahead).
void weft_kv_seq_publish(weft_kv_cache *c, int seq, const int32_t *tokens, int n_tokens,
                         int final_positions);
// Gives the sequence's blocks back (a shared block stays with its other holders).
void weft_kv_seq_release(weft_kv_cache *c, int seq);
// The sequence's block table (host; valid until its next reserve or release) and length.
const int32_t *weft_kv_seq_blocks(const weft_kv_cache *c, int seq, int *n_blocks);
long weft_kv_cache_free_blocks(const weft_kv_cache *c);
