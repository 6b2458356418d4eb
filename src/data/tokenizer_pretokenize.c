// data: the tokenizer's pre-tokenization: added-token extraction (leftmost-longest,
// single_word/lstrip/rstrip as in added_vocabulary.rs), normalization, and the pre-tokenizer steps
// (the pattern segmentation and split behaviors of normalizer.rs, ByteLevel of byte_level.rs),
// with the Oniguruma patterns of tokenizer.json run by PCRE2.
//
// The text travels through the pipeline as a list of pieces, each a byte range of a buffer or an
// already-final token id. Splitting steps only slice pieces; transforming steps (NFC, ByteLevel)
// write a new buffer.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "data/tokenizer_internal.h"

// ---------------------------------------------------------------------------------------------
// GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100..U+0143.

static uint16_t BYTE_CHAR[256];
static int16_t CHAR_BYTE[0x144];
static char BYTE_UTF8[256][2];
static uint8_t BYTE_UTF8_LEN[256];
static pthread_once_t byte_map_once = PTHREAD_ONCE_INIT;

static void byte_map_init(void) {
    for (int i = 0; i < 0x144; i++) CHAR_BYTE[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        BYTE_CHAR[b] = (uint16_t)(printable ? b : 256 + n++);
        CHAR_BYTE[BYTE_CHAR[b]] = (int16_t)b;
        char tmp[4];
        BYTE_UTF8_LEN[b] = (uint8_t)weft_tok_utf8_encode(BYTE_CHAR[b], tmp);
        memcpy(BYTE_UTF8[b], tmp, 2);
    }
}

void weft_tok_byte_level_init(void) { pthread_once(&byte_map_once, byte_map_init); }

int weft_tok_byte_of_char(uint32_t cp) { return cp < 0x144 ? CHAR_BYTE[cp] : -1; }

// ---------------------------------------------------------------------------------------------
// Regex: Oniguruma patterns (what `tokenizers` compiles) run by PCRE2

// Rewrites the escapes whose meaning differs between Oniguruma and PCRE2: \s \S (Oniguruma: the
// White_Space property; PCRE2 also counts U+180E), \w \W (Oniguruma: letters, marks, decimal
// digits, connector punctuation) and \h \H (Oniguruma: hexadecimal digits).
static char *onig_to_pcre2(const char *path, const char *pat, size_t n) {
    bytes out = {0};
    bool in_class = false;
    size_t class_start = 0;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char e = pat[++i];
            const char *rep = NULL;
            switch (e) {
            case 's': rep = "\\p{White_Space}"; break;
            case 'S': rep = "\\P{White_Space}"; break;
            case 'w': rep = in_class ? "\\p{L}\\p{M}\\p{Nd}\\p{Pc}" : "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]"; break;
            case 'h': rep = in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"; break;
            case 'W':
            case 'H':
                if (in_class)
                    weft_fatal("%s: regex \"%.*s\": \\%c inside a character class is not supported", path, (int)n, pat,
                               e);
                rep = e == 'W' ? "[^\\p{L}\\p{M}\\p{Nd}\\p{Pc}]" : "[^0-9a-fA-F]";
                break;
            case 'Q': {
                const char *end = strstr(pat + i + 1, "\\E");
                size_t stop = end ? (size_t)(end - pat) + 2 : n;
                weft_tok_bytes_put(&out, pat + i - 1, stop - (i - 1));
                i = stop - 1;
                continue;
            }
            default: break;
            }
            if (rep) weft_tok_bytes_put(&out, rep, strlen(rep));
            else weft_tok_bytes_put(&out, pat + i - 1, 2);
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            class_start = i;
        } else if (in_class && c == '[') {
            if (i + 1 < n && pat[i + 1] == ':') {
                const char *end = strstr(pat + i, ":]");
                if (end) {
                    size_t stop = (size_t)(end - pat) + 2;
                    weft_tok_bytes_put(&out, pat + i, stop - i);
                    i = stop - 1;
                    continue;
                }
            }
            weft_fatal("%s: regex \"%.*s\": nested character classes are not supported", path, (int)n, pat);
        } else if (in_class && c == '&' && i + 1 < n && pat[i + 1] == '&') {
            weft_fatal("%s: regex \"%.*s\": character class intersection (&&) is not supported", path, (int)n, pat);
        } else if (in_class && c == ']') {
            // A ']' right after '[' or '[^' is a literal member.
            bool first = i == class_start + 1 || (i == class_start + 2 && pat[class_start + 1] == '^');
            if (!first) in_class = false;
        }
        weft_tok_bytes_put(&out, &c, 1);
    }
    if (!out.p) weft_tok_bytes_put(&out, "", 0);
    return out.p;
}

pcre2_code *weft_tok_regex_compile(const char *path, const char *pat, size_t n, bool literal) {
    char *p = literal ? NULL : onig_to_pcre2(path, pat, n);
    int err;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pat : p), literal ? n : strlen(p), opts, &err, &at, NULL);
    free(p);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        weft_fatal("%s: regex \"%.*s\" does not compile: %s (at offset %zu)", path, (int)n, pat, (char *)msg,
                   (size_t)at);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); // without JIT, pcre2_match interprets
    return re;
}

// ---------------------------------------------------------------------------------------------
// Segmentation by a pattern, and the split behaviors

static void seg_push(seg **v, size_t *n, size_t *cap, size_t a, size_t b, bool match) {
    GROW(*v, *cap, *n + 1);
    (*v)[(*n)++] = (seg){a, b, match};
}

// The segmentation of s[0..n) by re into alternating non-matches and matches, covering all of s,
// as `tokenizers`' Pattern::find_matches does over Oniguruma's find_iter: an empty match right
// where the previous match ended is skipped by advancing one character.
static void find_segments(enc *e, const pcre2_code *re, const char *s, size_t n) {
    e->n_seg = 0;
    size_t prev = 0, last_end = 0, last_match_end = 0;
    bool have_match = false;
    while (last_end <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !e->jit_stack) {
            // The default 32 KiB JIT stack is too small for this text: retry with a large one.
            e->jit_stack = pcre2_jit_stack_create(64 * 1024, 512 * 1024 * 1024, NULL);
            if (!e->jit_stack) weft_fatal("out of host memory creating a regex JIT stack");
            pcre2_jit_stack_assign(e->mctx, NULL, e->jit_stack);
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc == PCRE2_ERROR_MATCHLIMIT)
            weft_fatal("%s: a pre_tokenizer regex needs more than %d backtracking steps on a "
                       "%zu-byte piece of text (catastrophic backtracking, as in (a+)+$); fix the "
                       "pattern in tokenizer.json", e->t->path, WEFT_TOK_MATCH_LIMIT, n);
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            weft_fatal("%s: regex matching failed on a %zu-byte piece of text: %s", e->t->path, n, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms || ms < last_end) { // \K tricks: treat as an empty match at last_end
            ms = me = last_end;
        }
        if (ms == me && have_match && last_match_end == last_end) {
            if (last_end >= n) break;
            last_end += (size_t)weft_tok_utf8_seq_len((unsigned char)s[last_end]);
            continue;
        }
        last_end = me;
        last_match_end = me;
        have_match = true;
        if (prev != ms) seg_push(&e->seg, &e->n_seg, &e->cap_seg, prev, ms, false);
        seg_push(&e->seg, &e->n_seg, &e->cap_seg, ms, me, true);
        prev = me;
    }
    if (prev != n) seg_push(&e->seg, &e->n_seg, &e->cap_seg, prev, n, false);
}

// Applies a split behavior to e->seg, leaving the kept ranges in e->kept (normalizer.rs split).
static void apply_behavior(enc *e, int behavior, bool invert) {
    e->n_kept = 0;
    size_t n = e->n_seg;
    seg *s = e->seg;
    if (invert)
        for (size_t i = 0; i < n; i++) s[i].match = !s[i].match;
    bool prev_match = false;
    switch (behavior) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++) seg_push(&e->kept, &e->n_kept, &e->cap_kept, s[i].a, s[i].b, false);
        break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!s[i].match) seg_push(&e->kept, &e->n_kept, &e->cap_kept, s[i].a, s[i].b, false);
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            if (s[i].match == prev_match && e->n_kept) e->kept[e->n_kept - 1].b = s[i].b;
            else seg_push(&e->kept, &e->n_kept, &e->cap_kept, s[i].a, s[i].b, false);
            prev_match = s[i].match;
        }
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            if (s[i].match && !prev_match && e->n_kept) e->kept[e->n_kept - 1].b = s[i].b;
            else seg_push(&e->kept, &e->n_kept, &e->cap_kept, s[i].a, s[i].b, false);
            prev_match = s[i].match;
        }
        break;
    case SPLIT_MERGED_NEXT:
        for (size_t i = n; i-- > 0;) {
            if (s[i].match && !prev_match && e->n_kept) e->kept[e->n_kept - 1].a = s[i].a;
            else seg_push(&e->kept, &e->n_kept, &e->cap_kept, s[i].a, s[i].b, false);
            prev_match = s[i].match;
        }
        for (size_t i = 0, j = e->n_kept; i + 1 < j; i++, j--) {
            seg tmp = e->kept[i];
            e->kept[i] = e->kept[j - 1];
            e->kept[j - 1] = tmp;
        }
        break;
    }
}

// ---------------------------------------------------------------------------------------------
// Pieces

// Empty text pieces are dropped, as PreTokenizedString::split does.
static void plist_text(plist *l, size_t off, size_t len) {
    if (!len) return;
    GROW(l->p, l->cap, l->n + 1);
    l->p[l->n++] = (piece){off, len, -1};
}

static void plist_token(plist *l, int32_t id) {
    GROW(l->p, l->cap, l->n + 1);
    l->p[l->n++] = (piece){0, 0, id};
}

// A list that will slice the same buffer as `in` (the buffer moves over; in->p stays for reading).
static plist plist_slicing(plist *in) {
    plist out = {0};
    out.buf = in->buf;
    in->buf = (bytes){0};
    return out;
}

void weft_tok_plist_free(plist *l) {
    free(l->buf.p);
    free(l->p);
}

// What a step makes of the text piece s[0..n), appended to out; off: where the piece starts in the
// buffer that out slices, for steps that slice.
typedef void (*text_step)(enc *e, const void *arg, const char *s, size_t n, size_t off, plist *out);

// Runs a step on every text piece of `in`; added tokens pass through. A slicing step's output
// slices in's buffer, any other step's output has a buffer of its own.
static plist apply_step(enc *e, plist *in, bool slicing, text_step step, const void *arg) {
    plist out = slicing ? plist_slicing(in) : (plist){0};
    const char *buf = slicing ? out.buf.p : in->buf.p;
    for (size_t i = 0; i < in->n; i++) {
        const piece *p = &in->p[i];
        if (p->id >= 0) plist_token(&out, p->id);
        else step(e, arg, buf + p->off, p->len, p->off, &out);
    }
    weft_tok_plist_free(in);
    return out;
}

// ---------------------------------------------------------------------------------------------
// Added tokens (added_vocabulary.rs find_matches)

static bool is_word_char(enc *e, uint32_t cp) {
    char u[4];
    int n = weft_tok_utf8_encode(cp, u);
    return pcre2_match(e->t->word_re, (PCRE2_SPTR)u, (size_t)n, 0, PCRE2_NO_UTF_CHECK, e->md, e->mctx) >= 0;
}

static int match_added_at(const match_set *m, const char *s, size_t n, size_t pos) {
    int c = (unsigned char)s[pos];
    for (int j = m->start[c]; j < m->start[c + 1]; j++)
        if (m->len[j] <= n - pos && memcmp(s + pos, m->s[j], m->len[j]) == 0) return j;
    return -1;
}

static void split_added(enc *e, const void *arg, const char *s, size_t n, size_t base, plist *out) {
    const weft_tokenizer *t = e->t;
    const match_set *m = arg;
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        int j = match_added_at(m, s, n, pos);
        if (j < 0) {
            pos++;
            continue;
        }
        const added_token *tok = &t->added[m->tok[j]];
        size_t start = pos, stop = pos + m->len[j];
        pos = stop;
        if (tok->single_word) {
            bool start_space = start == 0 || !is_word_char(e, weft_tok_utf8_decode_before(s, start));
            int l;
            bool stop_space = stop == n || !is_word_char(e, weft_tok_utf8_decode(s + stop, &l));
            if (!start_space || !stop_space) continue;
        }
        if (tok->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t k = ns - 1;
                while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
                int l;
                if (!weft_tok_is_white_space(weft_tok_utf8_decode(s + k, &l))) break;
                ns = k;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (tok->rstrip) {
            int l;
            while (stop < n && weft_tok_is_white_space(weft_tok_utf8_decode(s + stop, &l))) stop += (size_t)l;
        }
        if (start_offset < start) plist_text(out, base + start_offset, start - start_offset);
        plist_token(out, tok->id);
        start_offset = stop;
    }
    if (start_offset < n) plist_text(out, base + start_offset, n - start_offset);
}

static plist extract_added(enc *e, const match_set *m, plist *in) {
    if (!m->n) return *in;
    return apply_step(e, in, true, split_added, m);
}

typedef struct match_entry {
    const char *s;
    size_t len;
    int32_t tok;
} match_entry;

static int cmp_match(const void *x, const void *y) {
    const match_entry *a = x, *b = y;
    unsigned char ca = (unsigned char)a->s[0], cb = (unsigned char)b->s[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->tok < b->tok ? -1 : a->tok > b->tok;
}

void weft_tok_match_set_build(const weft_tokenizer *t, match_set *m, bool normalized) {
    int n = 0;
    for (int i = 0; i < t->n_added; i++) n += t->added[i].normalized == normalized;
    match_entry *e = weft_tok_xrealloc(NULL, (size_t)(n + 1) * sizeof *e);
    int k = 0;
    for (int i = 0; i < t->n_added; i++) {
        const added_token *a = &t->added[i];
        if (a->normalized == normalized) e[k++] = (match_entry){a->match, a->match_len, i};
    }
    qsort(e, (size_t)n, sizeof *e, cmp_match);
    m->n = n;
    m->tok = weft_tok_xrealloc(NULL, (size_t)(n + 1) * sizeof *m->tok);
    m->s = weft_tok_xrealloc(NULL, (size_t)(n + 1) * sizeof *m->s);
    m->len = weft_tok_xrealloc(NULL, (size_t)(n + 1) * sizeof *m->len);
    for (int i = 0; i < n; i++) m->tok[i] = e[i].tok, m->s[i] = e[i].s, m->len[i] = e[i].len;
    int j = 0;
    for (int c = 0; c < 256; c++) {
        while (j < n && (unsigned char)m->s[j][0] < c) j++;
        m->start[c] = j;
    }
    m->start[256] = n;
    free(e);
}

void weft_tok_match_set_free(match_set *m) {
    free(m->tok);
    free(m->s);
    free(m->len);
}

// ---------------------------------------------------------------------------------------------
// Normalization and pre-tokenization

static void normalize_nfc(enc *e, const void *arg, const char *s, size_t n, size_t off, plist *out) {
    size_t start = out->buf.n;
    weft_tok_nfc_append(s, n, &out->buf);
    plist_text(out, start, out->buf.n - start);
}

static void split_step(enc *e, const void *arg, const char *s, size_t n, size_t off, plist *out) {
    const pretok_step *st = arg;
    find_segments(e, st->re, s, n);
    apply_behavior(e, st->behavior, st->invert);
    for (size_t k = 0; k < e->n_kept; k++) plist_text(out, off + e->kept[k].a, e->kept[k].b - e->kept[k].a);
}

static void byte_level_map(const char *s, size_t n, plist *out) {
    size_t off = out->buf.n;
    GROW(out->buf.p, out->buf.cap, out->buf.n + 2 * n + 1);
    char *d = out->buf.p + out->buf.n;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        *d++ = BYTE_UTF8[b][0];
        if (BYTE_UTF8_LEN[b] == 2) *d++ = BYTE_UTF8[b][1];
    }
    out->buf.n = (size_t)(d - out->buf.p);
    out->buf.p[out->buf.n] = '\0';
    plist_text(out, off, out->buf.n - off);
}

static void byte_level_step(enc *e, const void *arg, const char *s, size_t n, size_t off, plist *out) {
    const pretok_step *st = arg;
    if (st->add_prefix_space && s[0] != ' ') {
        e->scratch.n = 0;
        weft_tok_bytes_put(&e->scratch, " ", 1);
        weft_tok_bytes_put(&e->scratch, s, n);
        s = e->scratch.p;
        n++;
    }
    if (!st->re) {
        byte_level_map(s, n, out);
        return;
    }
    find_segments(e, st->re, s, n);
    for (size_t k = 0; k < e->n_seg; k++)
        if (e->seg[k].b > e->seg[k].a) byte_level_map(s + e->seg[k].a, e->seg[k].b - e->seg[k].a, out);
}

plist weft_tok_pretokenize(enc *e, const char *text, size_t len) {
    const weft_tokenizer *t = e->t;
    plist l = {0};
    weft_tok_bytes_put(&l.buf, text, len);
    plist_text(&l, 0, len);
    l = extract_added(e, &t->raw_set, &l);
    if (t->nfc) l = apply_step(e, &l, false, normalize_nfc, NULL);
    l = extract_added(e, &t->normalized_set, &l);
    for (int s = 0; s < t->n_steps; s++) {
        const pretok_step *st = &t->steps[s];
        bool slicing = st->kind == STEP_SPLIT;
        l = apply_step(e, &l, slicing, slicing ? split_step : byte_level_step, st);
    }
    return l;
}
