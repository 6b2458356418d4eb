// A forward over a document in two pieces, the second reading the first's keys and values from a
// key/value provider (the shape a KV cache has: earlier positions held outside the batch), gives
// the same logits and log-probs, bit for bit on the CPU, as one forward over the whole document.
// Several documents are packed in each piece, split at different places (one at its first
// token, one at its last), with MTP on and off, and the pieces are cut again into single rows,
// the way decoding runs.
#include "../testing.h"
#include "model/model.h"

#include <math.h>

enum { N_DOCS = 3, MAX_LAYERS = 8 };
static const int LENGTHS[N_DOCS] = {150, 9, 70}; // the first spans several attention tiles

// A contiguous KV cache: per layer, every document's rows so far, (2, rows, width) each. gather
// appends the batch's rows to the cache and hands attention the document's whole prefix.
typedef struct kv_cache {
    weft_backend *be;
    const weft_batch *batch;
    bool on; // off: attention reads the batch's own keys (the reference run)
    int layers, n_docs, width, capacity;
    int *len;       // (n_docs) rows cached per document before this batch
    float **k, **v; // (layers * n_docs) each (capacity, width)
} kv_cache;

static void cache_gather(void *ctx, int layer, const void *kv, void *kv_full, int width,
                         void *scratch) {
    kv_cache *c = ctx;
    const weft_batch *b = c->batch;
    const float *keys = kv, *values = keys + (size_t)b->T * width;
    float *full_k = kv_full, *full_v = full_k + (size_t)b->T_kv * width;
    for (int d = 0; d < b->n_docs; d++) {
        int rows = b->cu_seqlens[d + 1] - b->cu_seqlens[d], at = c->len[d];
        CHECK(at + rows <= c->capacity && b->cu_seqlens_kv[d + 1] - b->cu_seqlens_kv[d] == at + rows);
        float *ck = c->k[layer * c->n_docs + d], *cv = c->v[layer * c->n_docs + d];
        memcpy(ck + (size_t)at * width, keys + (size_t)b->cu_seqlens[d] * width, sizeof(float) * rows * width);
        memcpy(cv + (size_t)at * width, values + (size_t)b->cu_seqlens[d] * width, sizeof(float) * rows * width);
        memcpy(full_k + (size_t)b->cu_seqlens_kv[d] * width, ck, sizeof(float) * (at + rows) * width);
        memcpy(full_v + (size_t)b->cu_seqlens_kv[d] * width, cv, sizeof(float) * (at + rows) * width);
    }
}

static kv_cache cache_create(const weft_model *m) {
    int L = m->cfg.num_layers + m->cfg.num_mtp;
    kv_cache c = {.be = m->be, .layers = L, .n_docs = N_DOCS, .capacity = 256,
                  .width = m->cfg.num_kv_heads * m->cfg.head_dim};
    CHECK(L <= MAX_LAYERS);
    c.len = weft_alloc(sizeof(int) * N_DOCS);
    c.k = weft_alloc(sizeof(float *) * L * N_DOCS);
    c.v = weft_alloc(sizeof(float *) * L * N_DOCS);
    for (int i = 0; i < L * N_DOCS; i++) {
        c.k[i] = weft_alloc(sizeof(float) * c.capacity * c.width);
        c.v[i] = weft_alloc(sizeof(float) * c.capacity * c.width);
    }
    return c;
}

static void cache_free(kv_cache *c) {
    for (int i = 0; i < c->layers * c->n_docs; i++) weft_free(c->k[i]), weft_free(c->v[i]);
    weft_free(c->k), weft_free(c->v), weft_free(c->len);
}

typedef struct outputs {
    float *logits;                      // (T_total, V), rows by (document, position)
    float *logprobs[WEFT_MAX_HEADS];    // (T_total)
} outputs;

static int row_of(int doc, int pos) {
    int r = 0;
    for (int d = 0; d < doc; d++) r += LENGTHS[d];
    return r + pos;
}

// Runs positions [from[d], to[d]) of every document as one batch, after `from` rows of each have
// gone through the cache, and files the outputs by (document, position).
static void run_piece(weft_model *m, int32_t *const *tokens, const int *from, const int *to,
                      kv_cache *cache, outputs *o) {
    weft_backend *be = m->be;
    int heads = weft_model_heads(m), V = m->cfg.vocab_size;
    weft_batch b = {.mtp_depth = m->cfg.num_mtp};
    weft_batch_clear(&b);
    int docs[N_DOCS], n = 0;
    for (int d = 0; d < N_DOCS; d++) {
        if (to[d] <= from[d]) continue;
        int start = from[d];
        weft_batch_append_chunks(&b, tokens[d], NULL, LENGTHS[d], to[d], &start, 1, to[d] - from[d]);
        cache->len[n] = from[d];
        docs[n++] = d;
    }
    // The cache holds documents by their place in this batch: rotate the per-document rows in.
    float **k = weft_alloc(sizeof(float *) * cache->layers * N_DOCS), **v = weft_alloc(sizeof(float *) * cache->layers * N_DOCS);
    for (int l = 0; l < cache->layers; l++)
        for (int j = 0; j < n; j++)
            k[l * N_DOCS + j] = cache->k[l * N_DOCS + docs[j]], v[l * N_DOCS + j] = cache->v[l * N_DOCS + docs[j]];
    float **keep_k = cache->k, **keep_v = cache->v;
    cache->k = k, cache->v = v, cache->batch = &b;
    weft_kv_provider provider = {.ctx = cache, .gather = cache_gather};
    weft_pass_options pass = {.kv = cache->on ? &provider : NULL};
    weft_forward_outputs out = {.logits = be->alloc(be, sizeof(float) * b.T * V)};
    for (int h = 0; h < heads; h++) out.logprobs[h] = be->alloc(be, sizeof(float) * b.T);
    weft_model_forward(m, &b, false, &pass, &out);
    cache->k = keep_k, cache->v = keep_v;
    weft_free(k), weft_free(v);
    for (int j = 0; j < n; j++)
        for (int t = b.cu_seqlens[j]; t < b.cu_seqlens[j + 1]; t++) {
            int row = row_of(docs[j], b.positions[t]);
            memcpy(o->logits + (size_t)row * V, (float *)out.logits + (size_t)t * V, sizeof(float) * V);
            for (int h = 0; h < heads; h++) o->logprobs[h][row] = out.logprobs[h][t];
        }
    be->free(be, out.logits);
    for (int h = 0; h < heads; h++) be->free(be, out.logprobs[h]);
    weft_batch_free(&b);
}

static outputs outputs_alloc(const weft_model *m, int T) {
    outputs o = {.logits = weft_alloc(sizeof(float) * T * m->cfg.vocab_size)};
    for (int h = 0; h < weft_model_heads(m); h++) o.logprobs[h] = weft_alloc(sizeof(float) * T);
    return o;
}

static void outputs_free(outputs *o) {
    weft_free(o->logits);
    for (int h = 0; h < WEFT_MAX_HEADS; h++) weft_free(o->logprobs[h]);
}

static bool same_bits(const float *a, const float *b, size_t n) { return !memcmp(a, b, sizeof(float) * n); }

static void check_case(int mtp) {
    weft_backend *be = weft_backend_cpu_create();
    weft_model_config cfg = {.vocab_size = 97, .hidden_size = 64, .intermediate_size = 160,
                             .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 16,
                             .rope_theta = 1e4, .rms_norm_eps = 1e-6, .attention_bias = true,
                             .num_mtp = mtp, .mtp_loss_scale = 0.1};
    weft_model *m = weft_model_create(be, &cfg, &(weft_model_options){0});
    weft_model_init_random(m, 7 + mtp);
    weft_rng rng;
    weft_rng_seed(&rng, 99);
    int32_t *tokens[N_DOCS];
    int T = 0, V = cfg.vocab_size, heads = weft_model_heads(m);
    for (int d = 0; d < N_DOCS; d++) {
        tokens[d] = weft_alloc(sizeof(int32_t) * LENGTHS[d]);
        for (int i = 0; i < LENGTHS[d]; i++) tokens[d][i] = (int32_t)(weft_rng_next(&rng) % V);
        T += LENGTHS[d];
    }
    kv_cache cache = cache_create(m);
    int zero[N_DOCS] = {0}, split[N_DOCS] = {83, 1, 69};
    outputs whole = outputs_alloc(m, T), pieces = outputs_alloc(m, T), rows = outputs_alloc(m, T);
    run_piece(m, tokens, zero, LENGTHS, &cache, &whole);
    cache.on = true;
    run_piece(m, tokens, zero, split, &cache, &pieces);
    run_piece(m, tokens, split, LENGTHS, &cache, &pieces);
    // Decoding: the prefix, then one row per document per pass.
    int from[N_DOCS], to[N_DOCS];
    run_piece(m, tokens, zero, split, &cache, &rows);
    memcpy(from, split, sizeof from);
    for (bool more = true; more;) {
        more = false;
        for (int d = 0; d < N_DOCS; d++) to[d] = from[d] < LENGTHS[d] ? from[d] + 1 : from[d];
        run_piece(m, tokens, from, to, &cache, &rows);
        for (int d = 0; d < N_DOCS; d++) more = more || to[d] < LENGTHS[d], from[d] = to[d];
    }
    bool logits_same = same_bits(whole.logits, pieces.logits, (size_t)T * V);
    bool rows_same = same_bits(whole.logits, rows.logits, (size_t)T * V);
    for (int h = 0; h < heads; h++) {
        logits_same = logits_same && same_bits(whole.logprobs[h], pieces.logprobs[h], T);
        rows_same = rows_same && same_bits(whole.logprobs[h], rows.logprobs[h], T);
    }
    double worst = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) worst = fmax(worst, fabs(whole.logits[i] - pieces.logits[i]));
    printf("MTP depth %d: two pieces %s (max |diff| %.3g), one row at a time %s\n", mtp,
           logits_same ? "bit-identical" : "DIFFER", worst, rows_same ? "bit-identical" : "DIFFER");
    CHECK(logits_same && rows_same);
    outputs_free(&whole), outputs_free(&pieces), outputs_free(&rows);
    cache_free(&cache);
    for (int d = 0; d < N_DOCS; d++) weft_free(tokens[d]);
    weft_model_free(m);
    weft_backend_destroy(be);
}

int main(void) {
    check_case(0);
    check_case(2);
    printf("ok\n");
    return 0;
}
