// One step of the engine: the running sequences' uncached positions (and drafts) as one packed
// batch, a forward whose attention reads and writes the paged KV cache, and the tokens drawn (or
// drafts verified) from the last rows of each sequence that is due one; with speculation, the MTP
// modules' passes that draft the next step's tokens.
#include <stdlib.h>
#include <string.h>

#include "rollout/internal.h"

// A step's sequences in the batch: index into e->seqs and the rows it adds.
typedef struct participant {
    int seq, rows;
} participant;

// ------------------------------------------------------------------------- device buffers ----

void *weft_rollout_grown(weft_backend *be, void *p, int *cap, int want, size_t each) {
    if (want <= *cap) return p;
    if (p) be->free(be, p);
    *cap = want * 2 > 64 ? want * 2 : 64;
    return be->alloc(be, each * (size_t)*cap);
}

// Host memory from the backend's host_alloc where `pinned` has one, else plain.
static void raw_free(weft_backend *pinned, void *p) {
    if (p && pinned && pinned->host_alloc) pinned->host_free(pinned, p);
    else weft_free(p);
}

// Byte offset of the normalizers after `rows` logits rows: 16-byte aligned.
static size_t normalizers_at(const weft_engine *e, int rows) {
    size_t bytes = weft_dtype_size(e->be->act_dtype) * e->model->cfg.vocab_size * (size_t)rows;
    return (bytes + 15) / 16 * 16;
}

void weft_rollout_logits_room(weft_engine *e, int rows) {
    step_buffers *b = &e->buf;
    size_t row = weft_dtype_size(e->be->act_dtype) * e->model->cfg.vocab_size;
    // rows * (row + 20) bytes hold the rows, the alignment's at most 15 and rows floats.
    b->logits = weft_rollout_grown(e->be, b->logits, &b->logits_cap, rows > 0 ? rows : 1,
                                   row + 20);
}

void weft_rollout_step_buffers_free(weft_engine *e) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    weft_rollout_graphs_free(e); // they hold the buffers' pointers
    // slots, q_pos, cu_q, cu_fresh and tables live in meta, the other draw_ arrays in draw_rows'.
    void *all[] = {b->meta,           b->logits,        b->draw_logits,   b->draw_rows,
                   b->hidden_main,    b->hidden_mtp[0], b->hidden_mtp[1], b->hidden_in,
                   b->gather_rows,    b->draft_q[0],    b->draft_q[1],    b->verify_io,
                   b->draft_tok[0],   b->draft_tok[1],  b->draft_feed};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) be->free(be, all[i]);
    for (int j = 0; j < WEFT_MAX_MTP; j++)
        if (b->stash[j]) be->free(be, b->stash[j]);
    if (b->stash_spare) be->free(be, b->stash_spare);
    raw_free(be, b->host_raw);
    weft_free(b->host_logits), weft_free(b->host_lse);
    memset(b, 0, sizeof *b);
    weft_batch_free(&e->batch);
    weft_batch_free(&e->draft_batch);
}

// ---------------------------------------------------------------------------- the provider ----

// Only where no row is a fresh sequence's (whose attention reads k and v from their parts).
static void split_store(void *ctx, int layer, void *fused, const weft_column_parts *parts,
                        const weft_rope_rows *rope) {
    paged_provider *p = ctx;
    weft_backend *be = p->e->be;
    be->split_store(be, fused, parts, p->layout.Tq, rope, weft_kv_cache_pool(p->e->cache), layer,
                    p->slots);
    p->stored_layer = layer;
}

// The q|k|v product and split_store in one backend op, where it has one for these rows.
static bool norm_product_store(void *ctx, int layer, const weft_norm_product *np, void *fused,
                               const weft_column_parts *parts, const weft_rope_rows *rope) {
    paged_provider *p = ctx;
    weft_backend *be = p->e->be;
    if (!be->norm_product_store ||
        !be->norm_product_store(be, np, fused, parts, rope, weft_kv_cache_pool(p->e->cache),
                                layer, p->slots))
        return false;
    p->stored_layer = layer;
    return true;
}

// lse (H, rows) is written per part, each (H, its rows): nothing reads it in a forward-only pass.
static void attend(void *ctx, int layer, const void *q, const void *kv, void *out, float *lse) {
    paged_provider *p = ctx;
    weft_backend *be = p->e->be;
    const weft_kv_pool *pool = weft_kv_cache_pool(p->e->cache);
    int T = p->layout.Tq + p->fresh.Tq, paged = p->layout.Tq;
    size_t esz = weft_dtype_size(be->act_dtype), half = (size_t)T * pool->width * esz;
    const char *k = kv, *v = k + half;
    if (p->stored_layer != layer) be->kv_store(be, pool, layer, p->slots, k, v, T);
    if (paged > 0) be->paged_attention(be, q, pool, layer, &p->layout, out, lse, p->H, p->KV, p->D);
    if (p->fresh.Tq == 0) return;
    size_t q_row = (size_t)p->H * p->D * esz, kv_row = (size_t)pool->width * esz;
    be->attention_forward(be, (const char *)q + paged * q_row, k + paged * kv_row,
                          v + paged * kv_row, &p->fresh, (char *)out + paged * q_row,
                          lse + (size_t)p->H * paged, p->H, p->KV, p->D);
}

// The first of the batch's last sequences that are fresh: rows at positions 0, 1, .. on. None
// where the engine is batch-invariant: the training attention's bits for a row depend on where
// its document lies in the packed batch, the pool's on the row's own keys alone.
static int first_fresh(const weft_engine *e, const weft_batch *batch, int n) {
    int j = n;
    if (e->invariant) return n;
    while (j > 0) {
        int r0 = batch->cu_seqlens[j - 1];
        bool fresh = true;
        for (int r = r0; r < batch->cu_seqlens[j] && fresh; r++)
            fresh = batch->positions[r] == r - r0;
        if (!fresh) break;
        j--;
    }
    return j;
}

// Sequence seq's block table, or a padding row's (seq < 0): block 0, read and never written.
static const int32_t *table_of(const weft_engine *e, int seq, int *blocks) {
    static const int32_t padding_table[1] = {0};
    if (seq >= 0) return weft_kv_seq_blocks(e->cache, e->seqs[seq].kv, blocks);
    *blocks = 1;
    return padding_table;
}

weft_kv_provider weft_rollout_provider(weft_engine *e, const weft_batch *batch, const int *seqs,
                                       int n, paged_provider *storage) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    int bs = e->rc.block_size, max_blocks = 1;
    for (int j = 0; j < n; j++) {
        int blocks;
        table_of(e, seqs[j], &blocks);
        max_blocks = blocks > max_blocks ? blocks : max_blocks;
    }
    max_blocks = weft_rollout_table_width(e, max_blocks);
    // Everything the step's attention reads goes up in one copy: slots (T), q_pos (T), cu_q
    // (n + 1), cu_fresh (fresh + 1), tables (n, max_blocks).
    int T = batch->T, j0 = first_fresh(e, batch, n), T0 = batch->cu_seqlens[j0], n_fresh = n - j0;
    int words = 2 * T + (n + 1) + (n_fresh + 1) + n * max_blocks;
    int32_t *meta = weft_arena_alloc(&e->step_scratch, sizeof(int32_t) * words);
    int32_t *slots = meta, *q_pos = meta + T;
    int32_t *cu_q = q_pos + T, *cu_fresh = cu_q + n + 1, *tables = cu_fresh + n_fresh + 1;
    memcpy(q_pos, batch->positions, sizeof(int32_t) * T);
    memcpy(cu_q, batch->cu_seqlens, sizeof(int32_t) * (n + 1));
    for (int j = 0; j <= n_fresh; j++) cu_fresh[j] = batch->cu_seqlens[j0 + j] - T0;
    for (int j = 0; j < n; j++) {
        int blocks;
        const int32_t *table = table_of(e, seqs[j], &blocks);
        memcpy(tables + (size_t)j * max_blocks, table, sizeof(int32_t) * blocks);
        for (int r = batch->cu_seqlens[j]; r < batch->cu_seqlens[j + 1]; r++) {
            int pos = batch->positions[r];
            WEFT_CHECK(pos / bs < blocks, "internal: position %d has no KV block", pos);
            slots[r] = seqs[j] < 0 ? -1 : table[pos / bs] * bs + pos % bs;
        }
    }
    b->meta = weft_rollout_grown(be, b->meta, &b->meta_cap, words, sizeof(int32_t));
    be->to_device(be, b->meta, meta, sizeof(int32_t) * words);
    b->slots = b->meta, b->q_pos = b->meta + T, b->cu_q = b->q_pos + T;
    b->cu_fresh = b->cu_q + n + 1, b->tables = b->cu_fresh + n_fresh + 1;
    const weft_model_config *c = &e->model->cfg;
    *storage = (paged_provider){.e = e, .slots = b->slots, .H = c->num_heads,
                                .KV = c->num_kv_heads, .D = c->head_dim,
                                .layout = {.n_seqs = j0, .Tq = T0, .max_blocks = max_blocks,
                                           .cu_q = b->cu_q, .q_pos = b->q_pos,
                                           .block_tables = b->tables},
                                .fresh = {.n_docs = n_fresh, .Tq = batch->T - T0,
                                          .Tkv = batch->T - T0, .cu_q = b->cu_fresh,
                                          .cu_kv = b->cu_fresh, .q_pos = b->q_pos + T0},
                                .stored_layer = -1};
    return (weft_kv_provider){.ctx = storage, .attend = attend,
                              .split_store = n_fresh == 0 ? split_store : NULL,
                              .norm_product_store = n_fresh == 0 ? norm_product_store : NULL};
}

// ---------------------------------------------------------------------------- the batch ----

// Rows sequence s takes within `budget`: all it has pending when they fit, else a chunk of its
// prompt; a chunk stops short of the last token when drafts wait, since they are verified only
// beside it. 0: it waits for the next step.
static int rows_within(const gen_seq *s, int budget) {
    int pending = weft_rollout_pending_rows(s);
    if (pending <= budget) return pending;
    int uncached = s->len - s->cached;
    if (s->n_drafts > 0) uncached--;
    return uncached < budget ? uncached : budget;
}

// The sequences of this step and their rows, oldest first, within rollout.max_batch_tokens:
// blocks are reserved here (newer sequences preempted when the pool runs out). Sorted once: a
// scan for the oldest per participant costs the host more than a GPU's decode step once an RL
// batch holds thousands of samples.
static int choose_participants(weft_engine *e, participant *part) {
    int n = 0, budget = e->rc.max_batch_tokens, running;
    int *line = weft_rollout_in_line(e, SEQ_RUNNING, &running);
    for (int k = 0; k < running && budget > 0; k++) {
        int i = line[k];
        if (e->seqs[i].state != SEQ_RUNNING) continue; // preempted for an older one
        // A sample whose in-flight token reaches its length limit is done whatever the token.
        if (e->seqs[i].in_flight > 0 && e->seqs[i].len >= weft_rollout_token_limit(e, &e->seqs[i]))
            continue;
        int rows = rows_within(&e->seqs[i], budget);
        if (rows == 0) continue;
        bool last = rows == weft_rollout_pending_rows(&e->seqs[i]);
        int spare = last ? weft_rollout_fork_spare(e, e->seqs[i].sample, e->seqs[i].len) : 0;
        if (weft_rollout_reserve_rows(e, i, rows, spare)) {
            part[n++] = (participant){i, rows};
            budget -= rows;
        }
    }
    return n;
}

static void build_batch(weft_engine *e, const participant *part, int n) {
    weft_batch *b = &e->batch;
    weft_batch_clear(b);
    for (int j = 0; j < n; j++) {
        const gen_seq *s = &e->seqs[part[j].seq];
        int start = s->cached, end = s->cached + part[j].rows;
        weft_batch_append_chunks(b, s->tokens, NULL, end, end, &start, 1, part[j].rows);
    }
}

// -------------------------------------------------------------------------------- a step ----

// A step's main forward: its provider, options and outputs, set up (the provider's metadata
// uploaded) before it runs.
typedef struct main_pass {
    paged_provider storage;
    weft_kv_provider kv;
    weft_pass_options pass;
    weft_forward_outputs out;
} main_pass;

// The main forward over the batch's sequences seqs[0, n) makes logits of its head_rows (n_rows
// of them: the due sequences' last 1 + n_drafts rows), and (speculating) every row's hidden
// state.
static void main_pass_setup(weft_engine *e, const int *seqs, int n, const int32_t *head_rows,
                            int n_rows, main_pass *mp) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    int C = e->model->cfg.hidden_size;
    weft_rollout_logits_room(e, n_rows);
    mp->kv = weft_rollout_provider(e, &e->batch, seqs, n, &mp->storage);
    mp->pass = (weft_pass_options){.kv = &mp->kv};
    if (e->verify_on_device) // the drafts waiting for verification are on the device alone
        weft_rollout_feed_drafts(e, &e->batch, seqs, n, 0, b->draft_tok[b->draft_q_cur],
                                 &mp->pass);
    mp->out = (weft_forward_outputs){.logits = b->logits, .rows = head_rows, .n_rows = n_rows,
                                     .skip_mtp = true};
    if (e->rc.speculative_tokens > 0) {
        size_t row = weft_dtype_size(be->act_dtype) * C;
        b->hidden_main = weft_rollout_grown(be, b->hidden_main, &b->hidden_main_cap,
                                            e->batch.T + e->n_seqs, row);
        mp->out.hidden = b->hidden_main;
    }
}

// Host buffers kept from step to step: fresh pages cost faults. Pinned by the backend `pinned`
// where it pins (the bus's speed for downloads, two to three times pageable's); NULL: plain.
static void *host_room(weft_backend *pinned, void *p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return p;
    raw_free(pinned, p);
    *cap = bytes;
    return pinned && pinned->host_alloc ? pinned->host_alloc(pinned, bytes) : weft_alloc(bytes);
}

// The rows' logits and, right after them, their normalizers in one download: the host waits for
// the device once, not again for the drawn tokens' base log-probs.
static void logits_and_normalizers_to_host(weft_engine *e, int n_rows) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    size_t n = (size_t)n_rows * e->model->cfg.vocab_size, at = normalizers_at(e, n_rows);
    be->log_normalizers(be, b->logits, (float *)((char *)b->logits + at), n_rows,
                        e->model->cfg.vocab_size);
    size_t bytes = at + sizeof(float) * n_rows;
    b->host_raw = host_room(be, b->host_raw, &b->host_raw_cap, bytes);
    be->to_host(be, b->host_raw, b->logits, bytes);
    const uint16_t *raw = b->host_raw;
    for (size_t i = 0; i < n; i++) b->host_logits[i] = weft_f32_from_bf16(raw[i]);
    b->host_lse = host_room(NULL, b->host_lse, &b->host_lse_cap, sizeof(float) * n_rows);
    memcpy(b->host_lse, (char *)b->host_raw + at, sizeof(float) * n_rows);
    b->host_lse_rows = n_rows;
}

// The main forward's first n_rows logits rows into the host buffer, for draws on the host.
static void logits_to_host(weft_engine *e, int n_rows) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    size_t V = (size_t)e->model->cfg.vocab_size;
    b->host_lse_rows = 0;
    if (n_rows <= 0) return;
    b->host_logits =
        host_room(NULL, b->host_logits, &b->host_logits_cap, sizeof(float) * n_rows * V);
    if (be->log_normalizers && be->act_dtype == WEFT_BF16) // the op's logits are bf16
        logits_and_normalizers_to_host(e, n_rows);
    else
        be->to_f32(be, b->host_logits, b->logits, be->act_dtype, (size_t)n_rows * V);
}

// The main forward, and the logits into the host buffer unless drawn on the device.
static void main_forward(weft_engine *e, const participant *part, int n, const due_seqs *due,
                         const int32_t *head_rows, bool host_logits) {
    main_pass mp;
    int *seqs = weft_arena_alloc(&e->step_scratch, sizeof(int) * n);
    for (int j = 0; j < n; j++) seqs[j] = part[j].seq;
    main_pass_setup(e, seqs, n, head_rows, due->rows, &mp);
    weft_model_forward(e->model, &e->batch, false, &mp.pass, &mp.out);
    if (host_logits) logits_to_host(e, due->rows);
}

// Whether every participant decodes, on a backend that records graphs: its rows are its last
// token and drafts (no prompt chunk, no recomputation, no sequence at position 0), every one is
// due, none is a prompt about to fork.
static bool decodes_alone(const weft_engine *e, const participant *part, int n,
                          const due_seqs *due) {
    if (!e->be->capture_begin || due->n != n) return false;
    for (int j = 0; j < n; j++) {
        const gen_seq *s = &e->seqs[part[j].seq];
        if (s->sample < 0 || part[j].rows != 1 + s->n_drafts ||
            e->batch.positions[e->batch.cu_seqlens[j]] == 0)
            return false;
    }
    return true;
}

typedef struct decode_work {
    main_pass *mp;
    int n_draws; // drawn on the device, 0: on the host
} decode_work;

static void decode_device_work(weft_engine *e, void *ctx) {
    decode_work *w = ctx;
    weft_model_forward(e->model, &e->batch, false, &w->mp->pass, &w->mp->out);
    if (w->n_draws > 0) weft_rollout_sample_on_device(e, w->n_draws);
}

// Padding rows of a decode step: one-row documents of token 0 at position 1 (position 0 would
// make them fresh sequences, attending over their own keys).
static void pad_batch(weft_engine *e, int rows) {
    static const int32_t zeros[2] = {0, 0};
    for (int j = 0; j < rows; j++) {
        int start = 1;
        weft_batch_append_chunks(&e->batch, zeros, NULL, 2, 2, &start, 1, 1);
    }
}

// Each batch row's token source: the draw of the step in flight that gives participant j's token
// (-1: the batch holds it, and for the padding). One row per participant, as in every decode step
// whose draws are on the device.
static int32_t *feed_of(weft_engine *e, const participant *part, int n, int rows) {
    int32_t *feed = weft_arena_alloc(&e->step_scratch, sizeof(int32_t) * rows);
    for (int r = 0; r < rows; r++)
        feed[r] = r < n ? weft_rollout_fed_from(&e->seqs[part[r].seq]) : -1;
    return feed;
}

// A decode step: the batch padded (weft_rollout_decode_rows; padding rows are one-row documents
// after the participants, with a head row and, drawing on the device, a draw each), every upload
// first (the batch, the provider's metadata, the draws' rows and numbers), then the forward (and
// the device draws) as device work alone, which graphs.c records or replays; then one download of
// the draws (speculation's verified on the device after it), or of the logits the host draws
// from (the CPU).
static int decode_step(weft_engine *e, const participant *part, int n, const due_seqs *due,
                       const int32_t *due_rows, int *took, bool ahead) {
    bool on_device = weft_rollout_draws_on_device(e);
    int T = e->batch.T, pads = weft_rollout_decode_rows(e, T) - T;
    int n_docs = n + pads, n_head = due->rows + pads, n_draws = on_device ? due->n + pads : 0;
    pad_batch(e, pads);
    weft_arena *scratch = &e->step_scratch;
    int *seqs = weft_arena_alloc(scratch, sizeof(int) * n_docs);
    int32_t *head_rows = weft_arena_alloc(scratch, sizeof(int32_t) * n_head);
    draw *d = weft_arena_alloc(scratch, sizeof(draw) * n_draws);
    for (int j = 0; j < n_docs; j++) seqs[j] = j < n ? part[j].seq : -1;
    for (int r = 0; r < n_head; r++) head_rows[r] = r < due->rows ? due_rows[r] : T + r - due->rows;
    for (int k = 0; k < n_draws; k++)
        d[k] = k < due->n ? (draw){.seq = due->seq[k], .row = due->first_row[k], .depth = -1}
                          : (draw){.seq = -1, .row = due->rows + k - due->n, .depth = -1};
    main_pass mp;
    main_pass_setup(e, seqs, n_docs, head_rows, n_head, &mp);
    if (n_draws > 0)
        weft_rollout_upload_draws(e, d, n_draws, ahead ? feed_of(e, part, n, n_draws) : NULL);
    if (ahead && e->in_flight >= 0) { // rows whose token the step in flight draws
        mp.pass.token_source = e->buf.draw_tokens;
        mp.pass.token_from = e->buf.draw_feed;
    }
    weft_model_upload_inputs(e->model, &e->batch, &mp.pass, &mp.out);
    mp.pass.uploaded = true;
    decode_work work = {.mp = &mp, .n_draws = n_draws};
    weft_rollout_run_graphed(e, e->batch.T, n_docs, mp.storage.layout.max_blocks,
                             decode_device_work, &work);
    if (ahead) {
        weft_rollout_queue_ahead(e, d, n_draws);
        return 0; // no drafts to make: nothing reads took
    }
    int still;
    if (on_device) {
        still = weft_rollout_finish_draws(e, d, due->n, took); // the padding's draws are dropped
    } else if (e->verify_on_device) {
        still = weft_rollout_draw_tokens(e, due, NULL, took);
    } else {
        logits_to_host(e, due->rows);
        still = weft_rollout_draw_tokens(e, due, e->buf.host_logits, took);
    }
    return still;
}

bool weft_rollout_step(weft_engine *e) {
    weft_arena *scratch = &e->step_scratch;
    weft_arena_reset(scratch);
    bool ahead = weft_rollout_async_ready(e);
    if (!ahead) weft_rollout_settle(e); // every token known before the rows are chosen
    participant *part = weft_arena_alloc(scratch, sizeof(participant) * (size_t)e->n_seqs);
    int n = choose_participants(e, part);
    if (n == 0) { // only samples at their length limit, whose last token is in flight
        if (e->in_flight < 0) return false;
        weft_rollout_settle(e);
        return true;
    }
    build_batch(e, part, n);
    // Sequences whose rows reach their last token (and drafts) are due: the head runs on those
    // rows only. The rest (prompt chunks, and prompts about to fork) feed the MTP modules first.
    int cap = e->batch.T + 1;
    int32_t *head_rows = weft_arena_alloc(scratch, sizeof(int32_t) * cap);
    due_seqs due = {.seq = weft_arena_alloc(scratch, sizeof(int) * n),
                    .first_row = weft_arena_alloc(scratch, sizeof(int) * n)};
    int *before = weft_arena_alloc(scratch, sizeof(int) * n), n_before = 0;
    for (int j = 0; j < n; j++) {
        gen_seq *s = &e->seqs[part[j].seq];
        s->main_row0 = e->batch.cu_seqlens[j] - s->cached;
        s->main_lo = s->cached, s->main_hi = s->cached + part[j].rows - 1;
        s->cached += part[j].rows;
        e->stats.computed_positions += part[j].rows;
        bool is_due = s->cached == s->len + s->n_drafts;
        if (!is_due || s->sample < 0) before[n_before++] = part[j].seq;
        if (!is_due) continue;
        due.seq[due.n] = part[j].seq, due.first_row[due.n] = due.rows;
        for (int r = s->n_drafts; r >= 0; r--) head_rows[due.rows++] = e->batch.cu_seqlens[j + 1] - 1 - r;
        due.n++;
    }
    e->stats.forwards++;
    if (n > e->stats.peak_batch) e->stats.peak_batch = n;
    size_t forks = 0; // the samples this step's prompts fork
    for (int k = 0; k < due.n; k++) forks += e->seqs[due.seq[k]].sample < 0 ? (size_t)e->sc.n : 0;
    int *took = weft_arena_alloc(scratch, sizeof(int) * (e->n_seqs + forks + 1)), n_took = 0;
    bool speculating = e->rc.speculative_tokens > 0;
    int *members = weft_arena_alloc(scratch, sizeof(int) * n);
    for (int j = 0; j < n; j++) members[j] = part[j].seq;
    if (decodes_alone(e, part, n, &due)) {
        n_took = decode_step(e, part, n, &due, head_rows, took, ahead);
    } else {
        WEFT_CHECK(!ahead, "internal: a step queued ahead of the host is not a decode step");
        bool on_device = weft_rollout_draws_on_device(e) || e->verify_on_device;
        main_forward(e, part, n, &due, head_rows, !on_device);
        if (speculating) weft_rollout_draft(e, before, n_before, false);
        weft_rollout_publish(e, members, n); // a prompt forks its samples as it draws
        const float *logits = on_device ? NULL : e->buf.host_logits;
        if (due.n > 0) n_took = weft_rollout_draw_tokens(e, &due, logits, took);
    }
    if (speculating) weft_rollout_draft(e, took, n_took, true);
    weft_rollout_publish(e, members, n);
    return true;
}
