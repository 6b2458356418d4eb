// data: the tokenizer's BPE merge of one piece (models/bpe/model.rs merge_word and word.rs
// merge_all of `tokenizers`): a min-heap on (rank, position) with stale-entry checks, so even merge
// lists whose ranks are not monotone give the same ids; byte fallback and unk_token as there.
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "data/tokenizer_internal.h"

static bool heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(enc *e, size_t *n, heap_ent x) {
    GROW(e->heap, e->cap_heap, *n + 1);
    heap_ent *h = e->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&x, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = x;
}

static heap_ent heap_pop(enc *e, size_t *n) {
    heap_ent *h = e->heap, top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const heap_ent *best = &x;
        if (l < *n && heap_less(&h[l], best)) m = l, best = &h[l];
        if (r < *n && heap_less(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = x;
    return top;
}

static void sym_add(enc *e, size_t *n, int32_t c, uint32_t len) {
    GROW(e->sym, e->cap_sym, *n + 1);
    int32_t i = (int32_t)*n;
    if (i > 0) e->sym[i - 1].next = i;
    e->sym[i] = (sym){c, i - 1, -1, len};
    (*n)++;
}

static int32_t unk_id_or_die(const weft_tokenizer *t) {
    if (t->unk_id < 0)
        weft_fatal("%s: the text needs unk_token \"%s\", which is not in the vocab", t->path, t->unk_token);
    return t->unk_id;
}

// The word's characters as symbols: their vocab ids, else their bytes' fallback ids, else unk
// (one per run of such characters under fuse_unk). Returns the number of symbols.
static size_t word_symbols(enc *e, const char *s, size_t n) {
    const weft_tokenizer *t = e->t;
    size_t ns = 0;
    bool have_unk = false;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        int l = weft_tok_utf8_seq_len((unsigned char)s[i]);
        int32_t id = weft_tok_smap_get(&t->vocab, s + i, (size_t)l);
        if (id >= 0) {
            if (have_unk) sym_add(e, &ns, unk, unk_len), have_unk = false;
            sym_add(e, &ns, id, (uint32_t)l);
        } else {
            bool done = false;
            if (t->byte_fallback) {
                done = true;
                for (int k = 0; k < l; k++) done = done && t->fallback_id[(unsigned char)s[i + (size_t)k]] >= 0;
                if (done)
                    for (int k = 0; k < l; k++) sym_add(e, &ns, t->fallback_id[(unsigned char)s[i + (size_t)k]], 1);
            }
            if (!done && t->unk_token) {
                if (have_unk && t->fuse_unk) {
                    unk_len += (uint32_t)l;
                } else {
                    if (have_unk) sym_add(e, &ns, unk, unk_len);
                    unk = unk_id_or_die(t), unk_len = (uint32_t)l, have_unk = true;
                }
            }
            // Without unk_token or byte fallback, `tokenizers` drops the character.
        }
        i += (size_t)l;
    }
    if (have_unk) sym_add(e, &ns, unk, unk_len);
    return ns;
}

// Merges the first ns symbols of e->sym, lowest rank first; merged-away symbols get len 0.
static void merge_symbols(enc *e, size_t ns) {
    const weft_tokenizer *t = e->t;
    sym *y = e->sym;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const merge_slot *m = weft_tok_merge_get(&t->merges, y[i].c, y[i + 1].c);
        if (m) heap_push(e, &nh, (heap_ent){m->rank, (uint32_t)i, m->id});
    }
    while (nh) {
        heap_ent top = heap_pop(e, &nh);
        y = e->sym;
        sym *cur = &y[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t next_pos = cur->next;
        sym right = y[next_pos];
        const merge_slot *m = weft_tok_merge_get(&t->merges, cur->c, right.c);
        if (!m || m->id != top.id) continue; // stale entry
        cur->c = top.id;
        cur->len += right.len;
        cur->next = right.next;
        y[next_pos].len = 0;
        if (right.next >= 0) y[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const merge_slot *mp = weft_tok_merge_get(&t->merges, y[cur->prev].c, cur->c);
            if (mp) heap_push(e, &nh, (heap_ent){mp->rank, (uint32_t)cur->prev, mp->id});
        }
        y = e->sym;
        cur = &y[top.pos];
        if (cur->next >= 0) {
            const merge_slot *mn = weft_tok_merge_get(&t->merges, cur->c, y[cur->next].c);
            if (mn) heap_push(e, &nh, (heap_ent){mn->rank, top.pos, mn->id});
        }
    }
}

static void bpe_word(enc *e, const char *s, size_t n, i32vec *out) {
    const weft_tokenizer *t = e->t;
    if (t->ignore_merges) {
        int32_t id = weft_tok_smap_get(&t->vocab, s, n);
        if (id >= 0) {
            weft_tok_i32_push(out, id);
            return;
        }
    }
    size_t ns = word_symbols(e, s, n);
    merge_symbols(e, ns);
    for (size_t i = 0; i < ns; i++)
        if (e->sym[i].len) weft_tok_i32_push(out, e->sym[i].c);
}

void weft_tok_bpe_piece(enc *e, const char *s, size_t n, i32vec *out) {
    if ((e->cache_n + 1) * 2 > e->cache_cap) {
        cache_slot *old = e->cache;
        size_t old_cap = e->cache_cap;
        e->cache_cap = old_cap ? old_cap * 2 : 256;
        e->cache = weft_tok_xrealloc(NULL, e->cache_cap * sizeof *e->cache);
        memset(e->cache, 0, e->cache_cap * sizeof *e->cache);
        for (size_t i = 0; i < old_cap; i++) {
            if (!old[i].s) continue;
            size_t j = old[i].h & (e->cache_cap - 1);
            while (e->cache[j].s) j = (j + 1) & (e->cache_cap - 1);
            e->cache[j] = old[i];
        }
        free(old);
    }
    uint64_t h = weft_tok_hash_bytes(s, n);
    size_t j = h & (e->cache_cap - 1);
    while (e->cache[j].s) {
        cache_slot *c = &e->cache[j];
        if (c->h == h && c->len == n && memcmp(c->s, s, n) == 0) {
            for (uint32_t k = 0; k < c->n; k++) weft_tok_i32_push(out, e->cache_ids.p[c->off + k]);
            return;
        }
        j = (j + 1) & (e->cache_cap - 1);
    }
    size_t before = out->n;
    bpe_word(e, s, n, out);
    cache_slot *c = &e->cache[j];
    *c = (cache_slot){s, n, h, (uint32_t)e->cache_ids.n, (uint32_t)(out->n - before)};
    for (size_t k = before; k < out->n; k++) weft_tok_i32_push(&e->cache_ids, out->p[k]);
    e->cache_n++;
}
