// data: the byte-level tokenizer and byte-level BPE read from Hugging Face tokenizer.json files:
// loading, and the entry points of tokenizer.h.
//
// The BPE path reimplements the `tokenizers` encode pipeline step by step, with the same
// semantics at every step (see tokenizer.h for the list): added-token extraction, normalization
// and pre-tokenization (tokenizer_pretokenize.c), then the BPE merge of each piece
// (tokenizer_bpe.c).
#include "data/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "data/tokenizer_internal.h"

#define MAX_TOKEN_ID (1 << 26) // ids must be below this (larger vocabularies do not exist)

// The GPT-2 regex that the ByteLevel pre-tokenizer uses when use_regex is true.
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// Rust regex's \w (what added tokens with single_word test against): Alphabetic, marks, decimal
// numbers, connector punctuation and the joiners.
static const char WORD_CHAR_PATTERN[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";


// ---------------------------------------------------------------------------------------------
// Encode / decode

static void enc_init(enc *e, const weft_tokenizer *t) {
    memset(e, 0, sizeof *e);
    e->t = t;
    e->md = pcre2_match_data_create(1, NULL);
    e->mctx = pcre2_match_context_create(NULL);
    if (!e->md || !e->mctx) weft_fatal("out of host memory creating a regex match context");
    // A pattern from the file may backtrack catastrophically ((a+)+$ doubles its time with
    // every character): the match limit turns that into an error (find_segments) instead of a
    // hang. Ten million steps per match leave every real tokenizer's patterns far below it.
    pcre2_set_match_limit(e->mctx, WEFT_TOK_MATCH_LIMIT);
    pcre2_set_depth_limit(e->mctx, UINT32_MAX);
    pcre2_set_heap_limit(e->mctx, 4u * 1024 * 1024); // KiB: 4 GiB
}

static void enc_free(enc *e) {
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    if (e->jit_stack) pcre2_jit_stack_free(e->jit_stack);
    free(e->seg);
    free(e->kept);
    free(e->sym);
    free(e->heap);
    free(e->cache);
    free(e->cache_ids.p);
    free(e->scratch.p);
}

static int32_t *finish_ids(i32vec *v, int *n_out) {
    if (v->n > (size_t)INT32_MAX) weft_fatal("text too long: %zu tokens", v->n);
    int32_t *ids = weft_alloc(v->n * sizeof *ids);
    if (v->n) memcpy(ids, v->p, v->n * sizeof *ids);
    *n_out = (int)v->n;
    free(v->p);
    return ids;
}

static int32_t *encode_bytes(const char *text, size_t len, int *n_out) {
    static const char EOT[] = "<|endoftext|>";
    const size_t eot_len = sizeof EOT - 1;
    i32vec v = {0};
    for (size_t i = 0; i < len;) {
        if (text[i] == '<' && len - i >= eot_len && memcmp(text + i, EOT, eot_len) == 0) {
            weft_tok_i32_push(&v, 256);
            i += eot_len;
        } else {
            weft_tok_i32_push(&v, (unsigned char)text[i++]);
        }
    }
    return finish_ids(&v, n_out);
}

int32_t *weft_tokenizer_encode(const weft_tokenizer *t, const char *text, size_t len, int *n_out) {
    if (t->bytes_only) return encode_bytes(text, len, n_out);
    size_t clean_len = 0;
    char *clean = weft_tok_utf8_sanitize(text, len, &clean_len);
    if (clean) text = clean, len = clean_len;

    enc e;
    enc_init(&e, t);
    plist l = weft_tok_pretokenize(&e, text, len);
    free(clean);
    i32vec ids = {0};
    for (size_t i = 0; i < l.n; i++) {
        if (l.p[i].id >= 0) weft_tok_i32_push(&ids, l.p[i].id);
        else weft_tok_bpe_piece(&e, l.buf.p + l.p[i].off, l.p[i].len, &ids);
    }
    weft_tok_plist_free(&l);
    enc_free(&e);
    return finish_ids(&ids, n_out);
}

char *weft_tokenizer_decode(const weft_tokenizer *t, const int32_t *ids, int n, size_t *len_out) {
    bytes out = {0};
    weft_tok_bytes_put(&out, "", 0);
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0) weft_fatal("%s: cannot decode token id %d: ids are not negative", t->path, id);
        // An id no token has (a model's vocabulary padded past its tokenizer's, as Qwen2.5's
        // 152064 rows for 151665 tokens) decodes to nothing, as in Hugging Face's decode: a
        // sampled one must not end a generation.
        if (id >= t->vocab_size || (!t->bytes_only && t->dec_len[id] == EMPTY32)) continue;
        if (t->bytes_only) {
            if (id == 256) weft_tok_bytes_put(&out, "<|endoftext|>", 13);
            else weft_tok_bytes_put(&out, &(char){(char)id}, 1);
        } else {
            weft_tok_bytes_put(&out, t->dec.p + t->dec_off[id], t->dec_len[id]);
        }
    }
    char *s = weft_alloc(out.n + 1);
    memcpy(s, out.p, out.n + 1);
    if (len_out) *len_out = out.n;
    free(out.p);
    return s;
}

char *weft_tokenizer_decode_text(const weft_tokenizer *t, const int32_t *ids, int n, size_t *len_out) {
    size_t len;
    char *raw = weft_tokenizer_decode(t, ids, n, &len), *valid = weft_tok_utf8_sanitize(raw, len, &len);
    if (valid) { // into weft_alloc'd memory, like every string this returns
        weft_free(raw);
        raw = weft_alloc(len + 1);
        memcpy(raw, valid, len), raw[len] = '\0';
        free(valid);
    }
    if (len_out) *len_out = len;
    return raw;
}

int weft_tokenizer_vocab_size(const weft_tokenizer *t) { return t->vocab_size; }
int weft_tokenizer_eos_id(const weft_tokenizer *t) { return t->eos_id; }

weft_tokenizer *weft_tokenizer_byte_level(void) {
    weft_tokenizer *t = weft_alloc(sizeof *t);
    t->bytes_only = true;
    t->path = weft_strdup("byte-level tokenizer");
    t->vocab_size = 257;
    t->eos_id = 256;
    snprintf(t->eos_source, sizeof t->eos_source, "its fixed <|endoftext|>");
    return t;
}

void weft_tokenizer_free(weft_tokenizer *t) {
    if (!t) return;
    weft_tok_smap_free(&t->vocab);
    free(t->merges.slot);
    free(t->unk_token);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content), free(t->added[i].match);
    free(t->added);
    weft_tok_match_set_free(&t->raw_set);
    weft_tok_match_set_free(&t->normalized_set);
    if (t->word_re) pcre2_code_free(t->word_re);
    for (int i = 0; i < t->n_steps; i++)
        if (t->steps[i].re && t->steps[i].re != t->gpt2_re) pcre2_code_free(t->steps[i].re);
    free(t->steps);
    if (t->gpt2_re) pcre2_code_free(t->gpt2_re);
    free(t->dec_off);
    free(t->dec_len);
    free(t->dec.p);
    weft_free(t->path);
    weft_free(t);
}

// ---------------------------------------------------------------------------------------------
// Loading tokenizer.json

static const char *type_of(const char *path, json_t *obj, const char *what) {
    const char *type = json_string_value(json_object_get(obj, "type"));
    if (!json_is_object(obj) || !type) weft_fatal("%s: %s has no \"type\"", path, what);
    return type;
}

static bool get_bool(const char *path, json_t *obj, const char *key, bool dflt, const char *what) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return dflt;
    if (!json_is_boolean(v)) weft_fatal("%s: %s \"%s\" must be true or false", path, what, key);
    return json_is_true(v);
}

static void parse_normalizer(weft_tokenizer *t, json_t *n) {
    if (!n || json_is_null(n)) return;
    const char *type = type_of(t->path, n, "normalizer");
    if (!strcmp(type, "NFC")) {
        t->nfc = true;
    } else if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) weft_fatal("%s: normalizer Sequence has no \"normalizers\" array", t->path);
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) parse_normalizer(t, item);
    } else {
        weft_fatal("%s: normalizer \"%s\" is not supported (weft supports no normalizer or NFC)", t->path, type);
    }
}

static void add_step(weft_tokenizer *t, pretok_step st) {
    t->steps = weft_tok_xrealloc(t->steps, (size_t)(t->n_steps + 1) * sizeof *t->steps);
    t->steps[t->n_steps++] = st;
}

static void parse_pre_tokenizer(weft_tokenizer *t, json_t *p) {
    if (!p || json_is_null(p)) return;
    const char *path = t->path, *type = type_of(path, p, "pre_tokenizer");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list)) weft_fatal("%s: pre_tokenizer Sequence has no \"pretokenizers\" array", path);
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) parse_pre_tokenizer(t, item);
    } else if (!strcmp(type, "ByteLevel")) {
        pretok_step st = {.kind = STEP_BYTE_LEVEL};
        st.add_prefix_space = get_bool(path, p, "add_prefix_space", true, "ByteLevel");
        if (get_bool(path, p, "use_regex", true, "ByteLevel")) {
            if (!t->gpt2_re) t->gpt2_re = weft_tok_regex_compile(path, GPT2_PATTERN, strlen(GPT2_PATTERN), false);
            st.re = t->gpt2_re;
        }
        add_step(t, st);
    } else if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        json_t *src = json_is_string(rx) ? rx : lit;
        if (!json_is_string(src))
            weft_fatal("%s: Split pre_tokenizer needs \"pattern\": {\"Regex\": ...} or {\"String\": ...}", path);
        const char *behavior = json_string_value(json_object_get(p, "behavior"));
        static const char *const NAMES[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
        pretok_step st = {.kind = STEP_SPLIT, .behavior = -1};
        for (int i = 0; i < 5 && behavior; i++)
            if (!strcmp(behavior, NAMES[i])) st.behavior = i;
        if (st.behavior < 0)
            weft_fatal("%s: Split pre_tokenizer behavior \"%s\" is not one of Removed, Isolated, "
                       "MergedWithPrevious, MergedWithNext, Contiguous",
                       path, behavior ? behavior : "(missing)");
        st.invert = get_bool(path, p, "invert", false, "Split");
        st.re = weft_tok_regex_compile(path, json_string_value(src), json_string_length(src), src == lit);
        add_step(t, st);
    } else if (!strcmp(type, "Digits")) {
        bool individual = get_bool(path, p, "individual_digits", false, "Digits");
        pretok_step st = {.kind = STEP_SPLIT, .behavior = individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS};
        st.re = weft_tok_regex_compile(path, "\\p{N}", 5, false); // Rust char::is_numeric
        add_step(t, st);
    } else {
        weft_fatal("%s: pre_tokenizer \"%s\" is not supported (weft supports ByteLevel, Split, Digits and "
                   "Sequence)",
                   path, type);
    }
}

static void check_decoder(const char *path, json_t *d) {
    if (!d || json_is_null(d)) weft_fatal("%s: no decoder; weft needs the ByteLevel decoder", path);
    const char *type = type_of(path, d, "decoder");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(d, "decoders");
        if (!json_is_array(list) || !json_array_size(list))
            weft_fatal("%s: decoder Sequence has no \"decoders\" array", path);
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) check_decoder(path, item);
    } else if (strcmp(type, "ByteLevel") != 0) {
        weft_fatal("%s: decoder \"%s\" is not supported (weft supports ByteLevel)", path, type);
    }
}

static int32_t get_id(const char *path, json_t *v, const char *what, const char *name) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_TOKEN_ID)
        weft_fatal("%s: %s \"%s\" needs an integer id in [0, %d)", path, what, name, MAX_TOKEN_ID);
    return (int32_t)json_integer_value(v);
}

// A merge's rank is its index in the list; both its tokens and their concatenation must be in the
// vocab.
static void parse_merges(weft_tokenizer *t, json_t *merges) {
    const char *path = t->path;
    bytes joined = {0};
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t la, lb;
        char *line = NULL;
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                weft_fatal("%s: merge %zu \"%s\" is not two tokens separated by one space", path, i, s);
            line = strdup(s);
            if (!line) weft_fatal("out of host memory");
            a = line, la = (size_t)(sp - s), b = line + la + 1, lb = strlen(b);
            line[la] = '\0';
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)), la = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1)), lb = json_string_length(json_array_get(m, 1));
        } else {
            weft_fatal("%s: merge %zu is neither a \"a b\" string nor an [a, b] pair of strings", path, i);
        }
        joined.n = 0;
        weft_tok_bytes_put(&joined, a, la);
        weft_tok_bytes_put(&joined, b, lb);
        int32_t ia = weft_tok_smap_get(&t->vocab, a, la), ib = weft_tok_smap_get(&t->vocab, b, lb);
        int32_t ij = weft_tok_smap_get(&t->vocab, joined.p, joined.n);
        if (ia < 0 || ib < 0 || ij < 0)
            weft_fatal("%s: merge %zu (\"%s\" \"%s\") uses token \"%s\", which is not in the vocab", path, i, a, b,
                       ia < 0   ? a
                       : ib < 0 ? b
                                : joined.p);
        weft_tok_merge_set(&t->merges, ia, ib, (uint32_t)i, ij);
        free(line);
    }
    free(joined.p);
}

static void parse_model(weft_tokenizer *t, json_t *model) {
    const char *path = t->path;
    if (!json_is_object(model)) weft_fatal("%s: no \"model\" object", path);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE") != 0)
        weft_fatal("%s: model type \"%s\" is not supported (weft reads byte-level BPE tokenizers only)", path, type);
    if (!type && !merges) weft_fatal("%s: model has no \"type\" (weft reads byte-level BPE tokenizers only)", path);
    if (!json_is_object(vocab)) weft_fatal("%s: BPE model has no \"vocab\" object", path);
    if (!json_is_array(merges)) weft_fatal("%s: BPE model has no \"merges\" array", path);

    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        weft_fatal("%s: BPE dropout is not supported (set \"dropout\" to null)", path);
    static const char *const AFFIXES[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, AFFIXES[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            weft_fatal("%s: BPE %s is not supported by weft's byte-level BPE", path, AFFIXES[i]);
    }
    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) weft_fatal("%s: BPE unk_token must be a string or null", path);
        t->unk_token = strdup(json_string_value(unk));
        if (!t->unk_token) weft_fatal("out of host memory");
    }
    t->fuse_unk = get_bool(path, model, "fuse_unk", false, "BPE");
    t->byte_fallback = get_bool(path, model, "byte_fallback", false, "BPE");
    t->ignore_merges = get_bool(path, model, "ignore_merges", false, "BPE");

    const char *key;
    json_t *v;
    int32_t max_id = -1;
    json_object_foreach(vocab, key, v) {
        int32_t id = get_id(path, v, "vocab entry", key);
        weft_tok_smap_set(&t->vocab, key, strlen(key), id);
        if (id > max_id) max_id = id;
    }
    t->vocab_size = max_id + 1;
    t->unk_id = t->unk_token ? weft_tok_smap_get(&t->vocab, t->unk_token, strlen(t->unk_token)) : -1;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->fallback_id[b] = weft_tok_smap_get(&t->vocab, name, strlen(name));
    }
    parse_merges(t, merges);
}

static void parse_added_tokens(weft_tokenizer *t, json_t *list) {
    const char *path = t->path;
    if (!list || json_is_null(list)) return;
    if (!json_is_array(list)) weft_fatal("%s: \"added_tokens\" must be an array", path);
    t->added = weft_tok_xrealloc(NULL, (json_array_size(list) + 1) * sizeof *t->added);
    size_t i;
    json_t *a;
    json_array_foreach(list, i, a) {
        json_t *content = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_string(content))
            weft_fatal("%s: added token %zu has no \"content\" string", path, i);
        if (json_string_length(content) == 0) continue; // `tokenizers` ignores empty tokens
        added_token tok = {0};
        tok.len = json_string_length(content);
        tok.content = weft_tok_xrealloc(NULL, tok.len + 1);
        memcpy(tok.content, json_string_value(content), tok.len + 1);
        tok.special = get_bool(path, a, "special", false, "added token");
        tok.single_word = get_bool(path, a, "single_word", false, "added token");
        tok.lstrip = get_bool(path, a, "lstrip", false, "added token");
        tok.rstrip = get_bool(path, a, "rstrip", false, "added token");
        tok.normalized = get_bool(path, a, "normalized", !tok.special, "added token");
        // A token the model's vocab already has keeps that id, as AddedVocabulary does.
        int32_t in_vocab = weft_tok_smap_get(&t->vocab, tok.content, tok.len);
        tok.id = in_vocab >= 0 ? in_vocab : get_id(path, json_object_get(a, "id"), "added token", tok.content);
        t->added[t->n_added++] = tok;
    }
}

// The ByteLevel decoder: a token whose characters all come from bytes_to_unicode decodes to those
// bytes, any other token to its own UTF-8.
static void build_decoder(weft_tokenizer *t) {
    size_t V = (size_t)t->vocab_size;
    const char **tok = weft_tok_xrealloc(NULL, (V + 1) * sizeof *tok);
    size_t *tok_len = weft_tok_xrealloc(NULL, (V + 1) * sizeof *tok_len);
    for (size_t i = 0; i < V; i++) tok[i] = NULL;
    for (size_t i = 0; i < t->vocab.cap; i++) {
        const smap_slot *s = &t->vocab.slot[i];
        if (s->len == EMPTY32) continue;
        // An id given to two tokens decodes as the shorter (then bytewise smaller) one, whatever
        // the hash order (`tokenizers` keeps an arbitrary one).
        const char *k = t->vocab.keys.p + s->off;
        if (tok[s->val]) {
            size_t ol = tok_len[s->val];
            int c = memcmp(k, tok[s->val], s->len < ol ? s->len : ol);
            if (s->len > ol || (s->len == ol && c >= 0)) continue;
        }
        tok[s->val] = k, tok_len[s->val] = s->len;
    }
    for (int i = 0; i < t->n_added; i++) { // added tokens win, as in AddedVocabulary::id_to_token
        tok[t->added[i].id] = t->added[i].content;
        tok_len[t->added[i].id] = t->added[i].len;
    }
    t->dec_off = weft_tok_xrealloc(NULL, (V + 1) * sizeof *t->dec_off);
    t->dec_len = weft_tok_xrealloc(NULL, (V + 1) * sizeof *t->dec_len);
    for (size_t id = 0; id < V; id++) {
        if (!tok[id]) {
            t->dec_len[id] = EMPTY32;
            continue;
        }
        const char *s = tok[id];
        size_t n = tok_len[id], start = t->dec.n;
        bool all_bytes = true;
        for (size_t i = 0; i < n && all_bytes;) {
            int l;
            int byte = weft_tok_byte_of_char(weft_tok_utf8_decode(s + i, &l));
            if (byte < 0) all_bytes = false;
            else weft_tok_bytes_put(&t->dec, &(char){(char)byte}, 1);
            i += (size_t)l;
        }
        if (!all_bytes) {
            t->dec.n = start;
            weft_tok_bytes_put(&t->dec, s, n);
        }
        t->dec_off[id] = (uint32_t)start;
        t->dec_len[id] = (uint32_t)(t->dec.n - start);
    }
    free(tok);
    free(tok_len);
}

// The token (vocab entry or added token) holding id, for messages.
static const char *token_with_id(const weft_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) return t->added[i].content;
    for (size_t i = 0; i < t->vocab.cap; i++)
        if (t->vocab.slot[i].len != EMPTY32 && t->vocab.slot[i].val == id)
            return t->vocab.keys.p + t->vocab.slot[i].off;
    return "?";
}

// Tables indexed by id (the decoder's) take memory for every id up to the largest: ids may leave
// gaps (added tokens placed past the model's vocab), but not millions of them, or a 500-byte file
// could claim gigabytes. The bound is twice the tokens the file defines plus 65536.
static void check_id_range(const weft_tokenizer *t) {
    size_t defined = t->vocab.n + (size_t)t->n_added, bound = 2 * defined + 65536;
    if ((size_t)t->vocab_size <= bound) return;
    int32_t id = t->vocab_size - 1;
    weft_fatal("%s: token \"%.64s\" has id %d, but the file defines only %zu tokens (ids must be "
               "below %zu); fix the id or the file", t->path, token_with_id(t, id), id, defined, bound);
}

weft_tokenizer *weft_tokenizer_load(const char *path) {
    weft_tok_byte_level_init();
    size_t len;
    char *text = weft_read_file(path, &len);
    if (!text) weft_fatal("%s: cannot read tokenizer file: %s", path, strerror(errno));
    json_error_t err;
    json_t *root = json_loadb(text, len, 0, &err);
    weft_free(text);
    if (!root) weft_fatal("%s: invalid JSON at line %d, column %d: %s", path, err.line, err.column, err.text);
    if (!json_is_object(root)) weft_fatal("%s: not a tokenizer.json (the top level is not an object)", path);

    weft_tokenizer *t = weft_alloc(sizeof *t);
    t->path = weft_strdup(path);
    t->eos_id = -1;
    parse_model(t, json_object_get(root, "model"));
    parse_normalizer(t, json_object_get(root, "normalizer"));
    parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"));
    bool has_byte_level = false;
    for (int i = 0; i < t->n_steps; i++) has_byte_level |= t->steps[i].kind == STEP_BYTE_LEVEL;
    if (!has_byte_level)
        weft_fatal("%s: the pre_tokenizer has no ByteLevel step (weft reads byte-level BPE tokenizers only)", path);
    check_decoder(path, json_object_get(root, "decoder"));
    parse_added_tokens(t, json_object_get(root, "added_tokens"));

    bool need_word_re = false;
    for (int i = 0; i < t->n_added; i++) {
        added_token *a = &t->added[i];
        if (a->id >= t->vocab_size) t->vocab_size = a->id + 1;
        need_word_re |= a->single_word;
        // Normalized tokens are matched in their normalized form, in the normalized text.
        bytes m = {0};
        if (a->normalized && t->nfc) weft_tok_nfc_append(a->content, a->len, &m);
        else weft_tok_bytes_put(&m, a->content, a->len);
        a->match = m.p, a->match_len = m.n;
    }
    check_id_range(t);
    weft_tok_parse_post_processor(t, json_object_get(root, "post_processor"));
    json_decref(root);
    if (need_word_re) t->word_re = weft_tok_regex_compile(path, WORD_CHAR_PATTERN, strlen(WORD_CHAR_PATTERN), false);
    weft_tok_match_set_build(t, &t->raw_set, false);
    weft_tok_match_set_build(t, &t->normalized_set, true);
    build_decoder(t);

    char *dir = weft_strdup(path), *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    weft_tok_resolve_eos(t, slash ? (dir[0] ? dir : "/") : ".");
    weft_free(dir);
    return t;
}
