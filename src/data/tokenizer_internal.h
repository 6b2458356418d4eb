// data: what the tokenizer's source files share, and nothing else includes.
//
// tokenizer.c              loading tokenizer.json, and the entry points of tokenizer.h
// tokenizer_maps.c         growable arrays, the vocabulary and merge hash maps
// tokenizer_unicode.c      UTF-8 and NFC, with the tables of unicode_tables_generated.c
// tokenizer_pretokenize.c  regexes, added-token extraction, normalization and pre-tokenization
// tokenizer_bpe.c          the BPE merge of one piece
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

#define EMPTY32 UINT32_MAX
// Backtracking steps one regex match may take (pcre2_set_match_limit) before encoding fails.
#define WEFT_TOK_MATCH_LIMIT 10000000

// ---------------------------------------------------------------------------------------------
// Growable arrays (tokenizer_maps.c)

void *weft_tok_xrealloc(void *p, size_t n);

#define GROW(ptr, cap, need)                                                                                           \
    do {                                                                                                               \
        if ((size_t)(need) > (cap)) {                                                                                  \
            size_t nc_ = (cap) ? (cap) : 16;                                                                           \
            while (nc_ < (size_t)(need)) nc_ *= 2;                                                                     \
            (ptr) = weft_tok_xrealloc((ptr), nc_ * sizeof *(ptr));                                                     \
            (cap) = nc_;                                                                                               \
        }                                                                                                              \
    } while (0)

typedef struct bytes {
    char *p;
    size_t n, cap;
} bytes;

typedef struct i32vec {
    int32_t *p;
    size_t n, cap;
} i32vec;

void weft_tok_bytes_put(bytes *b, const void *s, size_t n);
void weft_tok_i32_push(i32vec *v, int32_t x);
uint64_t weft_tok_hash_bytes(const void *s, size_t n);

// ---------------------------------------------------------------------------------------------
// String -> id map (the vocabulary), open addressing; keys live in one arena.

typedef struct smap_slot {
    uint64_t h;
    uint32_t off, len; // len == EMPTY32: free slot
    int32_t val;
} smap_slot;

typedef struct smap {
    smap_slot *slot;
    size_t cap, n;
    bytes keys;
} smap;

int32_t weft_tok_smap_get(const smap *m, const char *k, size_t n); // -1: absent
// Sets k -> v; returns the previous value, or -1 if k was new.
int32_t weft_tok_smap_set(smap *m, const char *k, size_t n, int32_t v);
void weft_tok_smap_free(smap *m);

// ---------------------------------------------------------------------------------------------
// (left id, right id) -> (rank, merged id)

typedef struct merge_slot {
    uint64_t key; // UINT64_MAX: free slot
    uint32_t rank;
    int32_t id;
} merge_slot;

typedef struct merge_map {
    merge_slot *slot;
    size_t cap, n;
} merge_map;

const merge_slot *weft_tok_merge_get(const merge_map *m, int32_t a, int32_t b); // NULL: no merge
// Later duplicates of a pair overwrite earlier ones, as collecting into a HashMap does.
void weft_tok_merge_set(merge_map *m, int32_t a, int32_t b, uint32_t rank, int32_t id);

// ---------------------------------------------------------------------------------------------
// UTF-8 and NFC (tokenizer_unicode.c)

int weft_tok_utf8_seq_len(unsigned char c);
// Decodes one code point of valid UTF-8.
uint32_t weft_tok_utf8_decode(const char *s, int *len);
// The code point that ends just before s[end] (end > 0, valid UTF-8).
uint32_t weft_tok_utf8_decode_before(const char *s, size_t end);
int weft_tok_utf8_encode(uint32_t cp, char *out);
// NULL when s is valid UTF-8; otherwise a malloc'd copy with each maximal invalid subpart
// replaced by U+FFFD (Python's errors="replace").
char *weft_tok_utf8_sanitize(const char *s, size_t n, size_t *out_n);
bool weft_tok_is_white_space(uint32_t c);
// Appends the NFC form of valid UTF-8 s[0..n) to out.
void weft_tok_nfc_append(const char *s, size_t n, bytes *out);

// The tables of unicode_tables_generated.c (scripts/generate_unicode_tables.py writes it).
extern const uint32_t weft_tok_nfc_decomp[][3];
extern const size_t weft_tok_nfc_decomp_count;
extern const uint32_t weft_tok_nfc_ccc[][3];
extern const size_t weft_tok_nfc_ccc_count;

// ---------------------------------------------------------------------------------------------
// The tokenizer

enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { STEP_SPLIT, STEP_BYTE_LEVEL };

typedef struct pretok_step {
    int kind;
    pcre2_code *re; // STEP_SPLIT: its pattern; STEP_BYTE_LEVEL: the GPT-2 regex or NULL
    int behavior;
    bool invert, add_prefix_space;
} pretok_step;

typedef struct added_token {
    char *content, *match; // match: the content as matched (NFC'd when normalized under NFC)
    size_t len, match_len;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} added_token;

// Added tokens to match, sorted by first byte and then by length, longest first.
typedef struct match_set {
    int n;
    int32_t *tok; // indices into weft_tokenizer.added
    const char **s;
    size_t *len;
    int start[257]; // entries starting with byte b are [start[b], start[b + 1])
} match_set;

enum { WEFT_TOK_TEMPLATE_MAX = 8 }; // special tokens a post_processor may put on either side

struct weft_tokenizer {
    bool bytes_only;
    char *path;
    int vocab_size, eos_id;
    char eos_source[160]; // which file named the eos, for the start-up line

    smap vocab;
    merge_map merges;
    char *unk_token; // NULL: none
    int32_t unk_id;  // -1: unk_token is not in the vocab
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t fallback_id[256]; // "<0xAB>" ids, -1 when missing

    bool nfc;
    added_token *added;
    int n_added;
    match_set raw_set, normalized_set; // by the added tokens' `normalized` flag
    pcre2_code *word_re;               // for single_word; NULL when no token needs it

    pretok_step *steps;
    int n_steps;
    pcre2_code *gpt2_re;

    uint32_t *dec_off, *dec_len; // bytes of each id in dec; dec_len EMPTY32: no token
    bytes dec;

    // The post_processor's special tokens before and after a text (tokenizer_template.c).
    int n_prefix, n_suffix;
    int32_t prefix[WEFT_TOK_TEMPLATE_MAX], suffix[WEFT_TOK_TEMPLATE_MAX];
};

// Reads tokenizer.json's "post_processor" into t->prefix / t->suffix (t->vocab_size known).
void weft_tok_parse_post_processor(weft_tokenizer *t, json_t *post_processor);

// ---------------------------------------------------------------------------------------------
// Per-call encoding state (the tokenizer itself stays read-only)

typedef struct seg {
    size_t a, b;
    bool match;
} seg;

typedef struct sym {
    int32_t c, prev, next;
    uint32_t len; // 0: merged into its left neighbour
} sym;

typedef struct heap_ent {
    uint32_t rank, pos;
    int32_t id;
} heap_ent;

typedef struct cache_slot {
    const char *s; // NULL: free
    size_t len;
    uint64_t h;
    uint32_t off, n; // ids in enc.cache_ids
} cache_slot;

typedef struct enc {
    const weft_tokenizer *t;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    seg *seg;
    size_t n_seg, cap_seg;
    seg *kept;
    size_t n_kept, cap_kept;
    sym *sym;
    size_t cap_sym;
    heap_ent *heap;
    size_t cap_heap;
    cache_slot *cache;
    size_t cache_cap, cache_n;
    i32vec cache_ids;
    bytes scratch;
} enc;

// ---------------------------------------------------------------------------------------------
// Pieces: the text travels through the pipeline as a list of them.

typedef struct piece {
    size_t off, len;
    int32_t id; // >= 0: an added token, final; -1: text buf[off, off + len)
} piece;

typedef struct plist {
    bytes buf;
    piece *p;
    size_t n, cap;
} plist;

// ---------------------------------------------------------------------------------------------
// Pre-tokenization (tokenizer_pretokenize.c)

// An Oniguruma pattern (or, literal, a plain string) compiled for PCRE2; weft_fatal when it does
// not compile.
pcre2_code *weft_tok_regex_compile(const char *path, const char *pat, size_t n, bool literal);
// Sets t->eos_id from the files in dir beside the tokenizer.json (tokenizer_config.json's
// eos_token, else generation_config.json's or config.json's eos_token_id), else from the token's
// usual spellings; -1 if none (tokenizer_files.c).
void weft_tok_resolve_eos(weft_tokenizer *t, const char *dir);
// GPT-2's bytes_to_unicode, which ByteLevel maps bytes through. Call once before the other two.
void weft_tok_byte_level_init(void);
// The byte that code point cp stands for under bytes_to_unicode, or -1.
int weft_tok_byte_of_char(uint32_t cp);
// The match set of the added tokens whose `normalized` flag is `normalized`.
void weft_tok_match_set_build(const weft_tokenizer *t, match_set *m, bool normalized);
void weft_tok_match_set_free(match_set *m);
// Valid UTF-8 text through added-token extraction, normalization and the pre-tokenizer steps:
// the pieces to give to BPE, and added tokens.
plist weft_tok_pretokenize(enc *e, const char *text, size_t len);
void weft_tok_plist_free(plist *l);

// ---------------------------------------------------------------------------------------------
// BPE (tokenizer_bpe.c)

// Appends the ids of one pre-tokenized piece, through the per-call cache of pieces already seen.
void weft_tok_bpe_piece(enc *e, const char *s, size_t n, i32vec *out);
