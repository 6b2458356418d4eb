// One step of the engine: the running sequences' uncached positions as one packed batch, a forward
// whose attention reads and writes the paged KV cache, and the tokens drawn from the last row of
// each sequence that is due one.
#include <string.h>

#include "rollout/internal.h"
#include "rollout/sampling.h"

// A step's sequences in the batch: index into e->seqs and the rows it adds.
typedef struct participant {
    int seq, rows;
} participant;

// ------------------------------------------------------------------------- device buffers ----

static void *grown(weft_backend *be, void *p, int *cap, int want, size_t each) {
    if (want <= *cap) return p;
    if (p) be->free(be, p);
    *cap = want * 2 > 64 ? want * 2 : 64;
    return be->alloc(be, each * (size_t)*cap);
}

void weft_rollout_step_buffers_free(weft_engine *e) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    // q_pos lives in slots' allocation, draw_tokens and draw_logprobs in draw_rows'.
    void *all[] = {b->slots, b->cu_q, b->tables, b->logits, b->draw_logits, b->draw_rows};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) be->free(be, all[i]);
    weft_free(b->host_logits);
    memset(b, 0, sizeof *b);
    weft_batch_free(&e->batch);
}

// ---------------------------------------------------------------------------- the provider ----

// The cache's side of attention for one forward: where each row's keys go and which blocks each
// sequence reads.
typedef struct paged_provider {
    weft_engine *e;
    const int32_t *slots; // (T) device
    weft_paged_layout layout;
    int H, KV, D;
} paged_provider;

static void attend(void *ctx, int layer, const void *q, const void *kv, void *out, float *lse) {
    paged_provider *p = ctx;
    weft_backend *be = p->e->be;
    const weft_kv_pool *pool = weft_kv_cache_pool(p->e->cache);
    size_t half = (size_t)p->layout.Tq * pool->width * weft_dtype_size(be->act_dtype);
    be->kv_store(be, pool, layer, p->slots, kv, (const char *)kv + half, p->layout.Tq);
    be->paged_attention(be, q, pool, layer, &p->layout, out, lse, p->H, p->KV, p->D);
}

// Uploads the step's slots, positions, sequence bounds and block tables (host arrays built here)
// and returns the provider reading them.
static paged_provider provider_for(weft_engine *e, const participant *part, int n) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    const weft_batch *batch = &e->batch;
    int bs = e->rc.block_size, max_blocks = 1;
    for (int j = 0; j < n; j++) {
        int blocks;
        weft_kv_seq_blocks(e->cache, e->seqs[part[j].seq].kv, &blocks);
        max_blocks = blocks > max_blocks ? blocks : max_blocks;
    }
    int32_t *slots = weft_alloc(sizeof(int32_t) * (batch->T + 1));
    int32_t *tables = weft_alloc(sizeof(int32_t) * n * max_blocks);
    for (int j = 0; j < n; j++) {
        int blocks;
        const int32_t *table = weft_kv_seq_blocks(e->cache, e->seqs[part[j].seq].kv, &blocks);
        memcpy(tables + (size_t)j * max_blocks, table, sizeof(int32_t) * blocks);
        for (int r = batch->cu_seqlens[j]; r < batch->cu_seqlens[j + 1]; r++) {
            int pos = batch->positions[r];
            slots[r] = table[pos / bs] * bs + pos % bs;
        }
    }
    b->slots = grown(be, b->slots, &b->rows_cap, batch->T, sizeof(int32_t) * 2);
    b->q_pos = b->slots + b->rows_cap; // one allocation holds both
    b->cu_q = grown(be, b->cu_q, &b->seqs_cap, n + 1, sizeof(int32_t));
    b->tables = grown(be, b->tables, &b->tables_cap, n * max_blocks, sizeof(int32_t));
    be->to_device(be, b->slots, slots, sizeof(int32_t) * batch->T);
    be->to_device(be, b->q_pos, batch->positions, sizeof(int32_t) * batch->T);
    be->to_device(be, b->cu_q, batch->cu_seqlens, sizeof(int32_t) * (n + 1));
    be->to_device(be, b->tables, tables, sizeof(int32_t) * n * max_blocks);
    weft_free(slots), weft_free(tables);
    const weft_model_config *c = &e->model->cfg;
    return (paged_provider){.e = e, .slots = b->slots, .H = c->num_heads, .KV = c->num_kv_heads,
                            .D = c->head_dim,
                            .layout = {.n_seqs = n, .Tq = batch->T, .max_blocks = max_blocks,
                                       .cu_q = b->cu_q, .q_pos = b->q_pos,
                                       .block_tables = b->tables}};
}

// ---------------------------------------------------------------------------- the batch ----

// The sequences of this step and their rows, oldest first, within rollout.max_batch_tokens:
// blocks are reserved here (newer sequences preempted when the pool runs out).
static int choose_participants(weft_engine *e, participant *part) {
    int n = 0, budget = e->rc.max_batch_tokens;
    for (bool more = true; more;) { // oldest running sequence not yet placed, until none
        more = false;
        int best = -1;
        for (int i = 0; i < e->n_seqs; i++) {
            const gen_seq *s = &e->seqs[i];
            bool placed = false;
            for (int j = 0; j < n && !placed; j++) placed = part[j].seq == i;
            if (s->state == SEQ_RUNNING && !placed && (best < 0 || s->order < e->seqs[best].order))
                best = i;
        }
        if (best < 0 || budget == 0) break;
        int rows = e->seqs[best].len - e->seqs[best].cached;
        rows = rows < budget ? rows : budget;
        if (weft_rollout_reserve_rows(e, best, rows)) {
            part[n++] = (participant){best, rows};
            budget -= rows;
        }
        more = true;
    }
    return n;
}

static void build_batch(weft_engine *e, const participant *part, int n) {
    weft_batch *b = &e->batch;
    weft_batch_clear(b);
    for (int j = 0; j < n; j++) {
        const gen_seq *s = &e->seqs[part[j].seq];
        int start = s->cached;
        weft_batch_append_chunks(b, s->tokens, NULL, s->len, s->cached + part[j].rows, &start, 1,
                                 part[j].rows);
    }
}

// ------------------------------------------------------------------------------ drawing ----

// A token drawn for sample `seq` from logits row (V, host), and the row it came from (for the
// log-prob the trainer's op computes).
typedef struct draw {
    int seq, row;
    int32_t token;
    float processed;
} draw;

static draw draw_token(weft_engine *e, int seq, int row, const float *logits) {
    const gen_seq *s = &e->seqs[seq];
    double u = weft_sampling_uniform((uint64_t)e->sc.seed, (uint64_t)s->prompt,
                                     (uint64_t)s->sample, (uint64_t)s->len);
    double processed = 0;
    int V = e->model->cfg.vocab_size;
    int token = weft_sample_token(&e->sc, logits + (size_t)row * V, V, u, &processed,
                                  e->sampling_scratch);
    return (draw){seq, row, token, (float)processed};
}

// Each drawn token's log-prob under the model (temperature 1, no filter), by the backend's
// logprobs op on the logits rows it was drawn from: the op and the arithmetic the trainer uses.
static void base_logprobs(weft_engine *e, const draw *d, int n, float *out) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    int V = e->model->cfg.vocab_size, cap = b->draws_cap;
    int32_t *rows = weft_alloc(sizeof(int32_t) * n), *tokens = weft_alloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) rows[i] = d[i].row, tokens[i] = d[i].token;
    b->draw_rows = grown(be, b->draw_rows, &cap, n, sizeof(int32_t) * 3);
    if (cap != b->draws_cap) {
        if (b->draw_logits) be->free(be, b->draw_logits);
        b->draw_logits = be->alloc(be, weft_dtype_size(be->act_dtype) * (size_t)cap * V);
        b->draws_cap = cap;
    }
    b->draw_tokens = b->draw_rows + cap;
    b->draw_logprobs = (float *)(b->draw_rows + 2 * cap);
    be->to_device(be, b->draw_rows, rows, sizeof(int32_t) * n);
    be->to_device(be, b->draw_tokens, tokens, sizeof(int32_t) * n);
    be->embedding_forward(be, b->draw_rows, b->logits, b->draw_logits, n, V); // a row gather
    be->logprobs(be, b->draw_logits, b->draw_tokens, b->draw_logprobs, NULL, NULL, n, V);
    be->to_host(be, out, b->draw_logprobs, sizeof(float) * n);
    weft_free(rows), weft_free(tokens);
}

// Draws a token for every sequence due one (a prompt's prefill forks its samples first), then
// appends them with their log-probs.
static void draw_tokens(weft_engine *e, const int *due, int n_due, const float *logits) {
    int cap = n_due * e->sc.n, n = 0;
    draw *d = weft_alloc(sizeof(draw) * (cap > 0 ? cap : 1));
    for (int k = 0; k < n_due; k++) {
        if (e->seqs[due[k]].sample >= 0) {
            d[n++] = draw_token(e, due[k], k, logits);
            continue;
        }
        int first = weft_rollout_fork_samples(e, due[k]);
        for (int s = 0; s < e->sc.n; s++) d[n++] = draw_token(e, first + s, k, logits);
    }
    float *logp = weft_alloc(sizeof(float) * (n > 0 ? n : 1));
    base_logprobs(e, d, n, logp);
    for (int i = 0; i < n; i++) {
        gen_seq *s = &e->seqs[d[i].seq];
        s->logprobs[s->len] = logp[i], s->processed[s->len] = d[i].processed;
        s->tokens[s->len++] = d[i].token; // room was made at creation: prompt + max_tokens
        weft_rollout_after_token(e, d[i].seq);
    }
    weft_free(d), weft_free(logp);
}

// -------------------------------------------------------------------------------- a step ----

bool weft_rollout_step(weft_engine *e) {
    participant *part = weft_alloc(sizeof(participant) * (e->n_seqs > 0 ? e->n_seqs : 1));
    int n = choose_participants(e, part);
    if (n == 0) {
        weft_free(part);
        return false;
    }
    build_batch(e, part, n);
    // Sequences whose rows reach their last token are due a new one: the head runs there only.
    int32_t *rows = weft_alloc(sizeof(int32_t) * n);
    int *due = weft_alloc(sizeof(int) * n), n_due = 0;
    for (int j = 0; j < n; j++) {
        gen_seq *s = &e->seqs[part[j].seq];
        s->cached += part[j].rows;
        if (s->cached == s->len) rows[n_due] = e->batch.cu_seqlens[j + 1] - 1, due[n_due++] = part[j].seq;
    }
    weft_backend *be = e->be;
    int V = e->model->cfg.vocab_size;
    e->buf.logits = grown(be, e->buf.logits, &e->buf.logits_cap, n_due > 0 ? n_due : 1,
                          weft_dtype_size(be->act_dtype) * V);
    paged_provider provider = provider_for(e, part, n);
    weft_kv_provider kv = {.ctx = &provider, .attend = attend};
    weft_pass_options pass = {.kv = &kv};
    weft_forward_outputs out = {.logits = e->buf.logits, .rows = rows, .n_rows = n_due,
                                .skip_mtp = true};
    weft_model_forward(e->model, &e->batch, false, &pass, &out);
    e->stats.forwards++;
    if (n > e->stats.peak_batch) e->stats.peak_batch = n;
    if (n_due > 0) {
        step_buffers *b = &e->buf;
        if (b->host_logits_cap < (size_t)n_due * V) { // kept: fresh pages every step cost faults
            weft_free(b->host_logits);
            b->host_logits_cap = (size_t)n_due * V;
            b->host_logits = weft_alloc(sizeof(float) * b->host_logits_cap);
        }
        be->to_f32(be, b->host_logits, b->logits, be->act_dtype, (size_t)n_due * V);
        draw_tokens(e, due, n_due, b->host_logits);
    }
    weft_free(part), weft_free(rows), weft_free(due);
    return true;
}
