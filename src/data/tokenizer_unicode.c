// data: the tokenizer's UTF-8 handling and its Unicode normalization (NFC).
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_internal.h"

// ---------------------------------------------------------------------------------------------
// UTF-8

int weft_tok_utf8_seq_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

uint32_t weft_tok_utf8_decode(const char *s, int *len) {
    const unsigned char *u = (const unsigned char *)s;
    int n = weft_tok_utf8_seq_len(u[0]);
    *len = n;
    switch (n) {
    case 1: return u[0];
    case 2: return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    case 3: return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    default:
        return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 |
               (u[3] & 0x3F);
    }
}

uint32_t weft_tok_utf8_decode_before(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    int len;
    return weft_tok_utf8_decode(s + i, &len);
}

int weft_tok_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// Length of the well-formed UTF-8 sequence at s[i..n), or -k when only its first k bytes form a
// valid prefix (the "maximal subpart" that one U+FFFD replaces; k >= 1).
static int utf8_valid_at(const unsigned char *s, size_t i, size_t n) {
    unsigned char c = s[i];
    if (c < 0x80) return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else return -1;
    int k = 1;
    for (int j = 1; j <= need; j++) {
        if (i + (size_t)j >= n) return -k;
        unsigned char b = s[i + (size_t)j];
        if (b < (j == 1 ? lo : 0x80) || b > (j == 1 ? hi : 0xBF)) return -k;
        k++;
    }
    return k;
}

char *weft_tok_utf8_sanitize(const char *s, size_t n, size_t *out_n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int k = utf8_valid_at(u, i, n);
        if (k < 0) break;
        i += (size_t)k;
    }
    if (i == n) return NULL;
    bytes out = {0};
    weft_tok_bytes_put(&out, s, i);
    while (i < n) {
        int k = utf8_valid_at(u, i, n);
        if (k > 0) {
            weft_tok_bytes_put(&out, s + i, (size_t)k);
            i += (size_t)k;
        } else {
            weft_tok_bytes_put(&out, "\xEF\xBF\xBD", 3);
            i += (size_t)-k;
        }
    }
    *out_n = out.n;
    return out.p;
}

bool weft_tok_is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// ---------------------------------------------------------------------------------------------
// NFC: canonical decomposition, canonical ordering, canonical composition (UAX #15), with the
// Unicode tables of unicode_tables_generated.c. Text whose bytes are all below 0xCC (code points
// below U+0300, all of them NFC-stable starters) is copied unchanged.

enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7 };
enum { HANGUL_LN = 19, HANGUL_VN = 21, HANGUL_TN = 28, HANGUL_NN = 21 * 28, HANGUL_SN = 19 * 21 * 28 };

typedef struct nfc_pair {
    uint64_t key; // first << 21 | second
    uint32_t composite;
} nfc_pair;

static nfc_pair *nfc_pairs;
static size_t n_nfc_pairs;
static pthread_once_t nfc_once = PTHREAD_ONCE_INIT;

static int cmp_pair(const void *x, const void *y) {
    uint64_t a = ((const nfc_pair *)x)->key, b = ((const nfc_pair *)y)->key;
    return a < b ? -1 : a > b;
}

static void nfc_init(void) {
    size_t n = weft_tok_nfc_decomp_count;
    nfc_pairs = weft_tok_xrealloc(NULL, n * sizeof *nfc_pairs);
    for (size_t i = 0; i < n; i++) {
        const uint32_t *d = weft_tok_nfc_decomp[i];
        if (d[2] & 0x80000000u)
            nfc_pairs[n_nfc_pairs++] = (nfc_pair){(uint64_t)d[1] << 21 | (d[2] & 0x7FFFFFFFu), d[0]};
    }
    qsort(nfc_pairs, n_nfc_pairs, sizeof *nfc_pairs, cmp_pair);
}

static uint8_t ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = weft_tok_nfc_ccc_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < weft_tok_nfc_ccc[mid][0]) hi = mid;
        else if (cp > weft_tok_nfc_ccc[mid][1]) lo = mid + 1;
        else return (uint8_t)weft_tok_nfc_ccc[mid][2];
    }
    return 0;
}

static void decompose(uint32_t cp, i32vec *out) {
    if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_SN) {
        uint32_t s = cp - HANGUL_S, t = s % HANGUL_TN;
        weft_tok_i32_push(out, (int32_t)(HANGUL_L + s / HANGUL_NN));
        weft_tok_i32_push(out, (int32_t)(HANGUL_V + s % HANGUL_NN / HANGUL_TN));
        if (t) weft_tok_i32_push(out, (int32_t)(HANGUL_T + t));
        return;
    }
    if (cp >= 0xC0) {
        size_t lo = 0, hi = weft_tok_nfc_decomp_count;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (weft_tok_nfc_decomp[mid][0] < cp) lo = mid + 1;
            else hi = mid;
        }
        if (lo < weft_tok_nfc_decomp_count && weft_tok_nfc_decomp[lo][0] == cp) {
            decompose(weft_tok_nfc_decomp[lo][1], out);
            uint32_t second = weft_tok_nfc_decomp[lo][2] & 0x7FFFFFFFu;
            if (second) decompose(second, out);
            return;
        }
    }
    weft_tok_i32_push(out, (int32_t)cp);
}

static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_LN && b >= HANGUL_V && b < HANGUL_V + HANGUL_VN)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_VN + (b - HANGUL_V)) * HANGUL_TN;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_SN && (a - HANGUL_S) % HANGUL_TN == 0 && b > HANGUL_T &&
        b < HANGUL_T + HANGUL_TN)
        return a + (b - HANGUL_T);
    uint64_t key = (uint64_t)a << 21 | b;
    size_t lo = 0, hi = n_nfc_pairs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (nfc_pairs[mid].key < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < n_nfc_pairs && nfc_pairs[lo].key == key ? nfc_pairs[lo].composite : 0;
}

// A stable sort of c[a..b) by combining class (all non-zero). Short runs, the normal case, by
// insertion; long ones by counting sort over the 255 classes, so a document of nothing but
// combining marks costs linear time instead of quadratic.
static void sort_run(uint32_t *c, uint8_t *cc, size_t a, size_t b) {
    if (b - a <= 32) {
        for (size_t k = a + 1; k < b; k++)
            for (size_t j = k; j > a && cc[j - 1] > cc[j]; j--) {
                uint32_t tc = c[j];
                c[j] = c[j - 1], c[j - 1] = tc;
                uint8_t tk = cc[j];
                cc[j] = cc[j - 1], cc[j - 1] = tk;
            }
        return;
    }
    size_t start[257] = {0};
    for (size_t k = a; k < b; k++) start[cc[k] + 1]++;
    for (int v = 1; v < 257; v++) start[v] += start[v - 1];
    uint32_t *sorted = weft_tok_xrealloc(NULL, (b - a) * sizeof *sorted);
    for (size_t k = a; k < b; k++) sorted[start[cc[k]]++] = c[k];
    memcpy(c + a, sorted, (b - a) * sizeof *sorted);
    free(sorted);
    for (size_t k = a; k < b; k++) cc[k] = ccc_of(c[k]);
}

// Canonical ordering: a stable sort of each run of non-starters by combining class.
static void canonical_order(uint32_t *c, uint8_t *cc, size_t n) {
    for (size_t k = 0; k < n;) {
        if (cc[k] == 0) {
            k++;
            continue;
        }
        size_t end = k;
        while (end < n && cc[end] != 0) end++;
        sort_run(c, cc, k, end);
        k = end;
    }
}

void weft_tok_nfc_append(const char *s, size_t n, bytes *out) {
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0xCC) i++;
    if (i == n) {
        weft_tok_bytes_put(out, s, n);
        return;
    }
    pthread_once(&nfc_once, nfc_init);
    i32vec d = {0};
    for (i = 0; i < n;) {
        int l;
        decompose(weft_tok_utf8_decode(s + i, &l), &d);
        i += (size_t)l;
    }
    uint32_t *c = (uint32_t *)d.p;
    uint8_t *cc = weft_tok_xrealloc(NULL, d.n + 1);
    for (size_t k = 0; k < d.n; k++) cc[k] = ccc_of(c[k]);
    canonical_order(c, cc, d.n);
    // Canonical composition.
    size_t m = 0;
    if (d.n) {
        size_t starter = 0;
        int last = cc[0] ? 256 : 0;
        m = 1;
        for (size_t k = 1; k < d.n; k++) {
            uint32_t comp = compose(c[starter], c[k]);
            if (comp && (last < cc[k] || last == 0)) {
                c[starter] = comp;
                continue;
            }
            if (cc[k] == 0) starter = m;
            last = cc[k];
            c[m] = c[k];
            cc[m] = cc[k];
            m++;
        }
    }
    char u[4];
    for (size_t k = 0; k < m; k++) weft_tok_bytes_put(out, u, (size_t)weft_tok_utf8_encode(c[k], u));
    free(cc);
    free(d.p);
}
