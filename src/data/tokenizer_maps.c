// data: the tokenizer's growable arrays and hash maps (the vocabulary and the merges).
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "data/tokenizer_internal.h"

// ---------------------------------------------------------------------------------------------
// Growable arrays

void *weft_tok_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) weft_fatal("out of host memory allocating %zu bytes", n);
    return q;
}

void weft_tok_bytes_put(bytes *b, const void *s, size_t n) {
    GROW(b->p, b->cap, b->n + n + 1);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void weft_tok_i32_push(i32vec *v, int32_t x) {
    GROW(v->p, v->cap, v->n + 1);
    v->p[v->n++] = x;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t weft_tok_hash_bytes(const void *s, size_t n) {
    const unsigned char *p = s;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return mix64(h ^ n);
}

// ---------------------------------------------------------------------------------------------
// String -> id map

static smap_slot *smap_find(const smap *m, const char *k, size_t n, uint64_t h) {
    size_t i = h & (m->cap - 1);
    for (;;) {
        smap_slot *s = &m->slot[i];
        if (s->len == EMPTY32) return s;
        if (s->h == h && s->len == n && memcmp(m->keys.p + s->off, k, n) == 0) return s;
        i = (i + 1) & (m->cap - 1);
    }
}

static void smap_rehash(smap *m, size_t cap) {
    smap_slot *old = m->slot;
    size_t old_cap = m->cap;
    m->slot = weft_tok_xrealloc(NULL, cap * sizeof *m->slot);
    m->cap = cap;
    for (size_t i = 0; i < cap; i++) m->slot[i].len = EMPTY32;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].len == EMPTY32) continue;
        size_t j = old[i].h & (cap - 1);
        while (m->slot[j].len != EMPTY32) j = (j + 1) & (cap - 1);
        m->slot[j] = old[i];
    }
    free(old);
}

int32_t weft_tok_smap_get(const smap *m, const char *k, size_t n) {
    if (!m->cap) return -1;
    const smap_slot *s = smap_find(m, k, n, weft_tok_hash_bytes(k, n));
    return s->len == EMPTY32 ? -1 : s->val;
}

int32_t weft_tok_smap_set(smap *m, const char *k, size_t n, int32_t v) {
    if ((m->n + 1) * 2 > m->cap) smap_rehash(m, m->cap ? m->cap * 2 : 1024);
    uint64_t h = weft_tok_hash_bytes(k, n);
    smap_slot *s = smap_find(m, k, n, h);
    int32_t prev = -1;
    if (s->len == EMPTY32) {
        s->h = h;
        s->off = (uint32_t)m->keys.n;
        s->len = (uint32_t)n;
        weft_tok_bytes_put(&m->keys, k, n);
        m->n++;
    } else {
        prev = s->val;
    }
    s->val = v;
    return prev;
}

void weft_tok_smap_free(smap *m) {
    free(m->slot);
    free(m->keys.p);
}

// ---------------------------------------------------------------------------------------------
// (left id, right id) -> (rank, merged id)

static uint64_t merge_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static merge_slot *merge_find(const merge_map *m, uint64_t key) {
    size_t i = mix64(key) & (m->cap - 1);
    while (m->slot[i].key != UINT64_MAX && m->slot[i].key != key) i = (i + 1) & (m->cap - 1);
    return &m->slot[i];
}

const merge_slot *weft_tok_merge_get(const merge_map *m, int32_t a, int32_t b) {
    if (!m->cap) return NULL;
    const merge_slot *s = merge_find(m, merge_key(a, b));
    return s->key == UINT64_MAX ? NULL : s;
}

void weft_tok_merge_set(merge_map *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    if ((m->n + 1) * 2 > m->cap) {
        merge_slot *old = m->slot;
        size_t old_cap = m->cap, cap = m->cap ? m->cap * 2 : 1024;
        m->slot = weft_tok_xrealloc(NULL, cap * sizeof *m->slot);
        m->cap = cap;
        for (size_t i = 0; i < cap; i++) m->slot[i].key = UINT64_MAX;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].key != UINT64_MAX) *merge_find(m, old[i].key) = old[i];
        free(old);
    }
    merge_slot *s = merge_find(m, merge_key(a, b));
    if (s->key == UINT64_MAX) m->n++;
    s->key = merge_key(a, b);
    s->rank = rank;
    s->id = id;
}
