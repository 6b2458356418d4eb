// Speculative decoding with the model's own MTP modules (DESIGN.md sections 8 and 11).
//
// Module j (1-based) at position t reads h_{j-1}(t) and Emb(token t + j), exactly as in training,
// and its own decoder layer attends over module j's keys at positions <= t, kept in the KV cache's
// layers after the decoder's. With a sequence of N tokens whose last is not yet in the main cache,
// the drafts come from position t = N - 2: module 1 reads the token just drawn and drafts token N,
// module j reads draft j-1 and drafts token N + j - 1. Module j's keys are final only where its
// input token is an accepted one (positions <= N - 1 - j); its rows past that are recomputed next
// step with the tokens then known. So each module keeps its own count of final positions, and the
// one row of h_{j-1} it needs below what module j-1 computes next is kept on the device (the
// stash).
//
// Verification: one main forward over the last token and the k drafts gives p at each; draft x at
// depth i is accepted with probability min(1, p_i(x) / q_i(x)), else a token is drawn from
// max(0, p_i - q_i) normalized and the rest dropped; when all are accepted a bonus token is drawn
// from p_{k+1}. p and q are the processed distributions (temperature, top-k, top-p, min-p), so the
// tokens follow the policy's processed distribution exactly; greedy (both one-hot) accepts a draft
// exactly when it is the main model's choice. Every uniform comes from (seed, prompt, sample,
// position, kind), so outputs do not depend on batching, the pool or preemptions (drafts survive a
// preemption and are verified after the recompute).
//
// Where the backend verifies (verify_drafts, a GPU), all of it stays on the device: a drafting
// phase writes module j's head logits into rows (j - 1) n on of a drafts buffer and its drafts,
// drawn by sample_tokens, into the same rows of a token buffer, which the later modules and the
// next main forward read their input tokens from (token_from); the verification reads both, and
// the host learns the drafts only as the tokens emitted. The host's copy of a draft is a
// placeholder until then.
#include <math.h>
#include <string.h>

#include "core/fault.h"
#include "rollout/internal.h"

// ---------------------------------------------------------------------------- verification ----

// A token drawn with uniform u from max(0, p - q) normalized (V doubles, p and q processed
// distributions; p itself if p - q has no positive mass, which only rounding can give).
static int draw_residual(const double *p, const double *q, int V, double u) {
    double mass = 0;
    for (int i = 0; i < V; i++) mass += p[i] > q[i] ? p[i] - q[i] : 0;
    int token = -1;
    double cumulative = 0;
    for (int i = 0; i < V; i++) {
        double w = mass > 0 ? (p[i] > q[i] ? p[i] - q[i] : 0) / mass : p[i];
        if (w <= 0) continue;
        token = i;
        cumulative += w;
        if (u < cumulative) break;
    }
    WEFT_CHECK(token >= 0, "internal: speculative decoding's residual kept no token");
    return token;
}

int weft_rollout_verify(weft_engine *e, int i, const float *logits, int first_row, draw *out) {
    gen_seq *s = &e->seqs[i];
    int V = e->model->cfg.vocab_size, nd = s->n_drafts;
    uint64_t seed = (uint64_t)e->sc.seed, prompt = (uint64_t)s->prompt;
    uint64_t sample = (uint64_t)s->sample;
    double *p = e->verify_scratch, *q = p + V; // (2, V): p and q of one depth
    if (nd > 0) e->stats.verify_steps++;
    for (int d = 0; d < nd; d++) e->stats.drafted[d]++; // offered, whether reached or not
    for (int d = 0; d < nd; d++) {
        int position = s->len + d, x = s->tokens[position];
        weft_sampling_distribution(&e->sc, logits + (size_t)d * V, V, p, e->sampling_scratch);
        weft_sampling_distribution(&e->sc, s->draft_logits + (size_t)d * V, V, q,
                                   e->sampling_scratch);
        double u = weft_sampling_uniform(seed, prompt, sample, (uint64_t)position,
                                         WEFT_DRAW_ACCEPT);
        // A test's deliberately biased rule (every draft accepted) must fail the exactness test.
        bool accept = u * q[x] < p[x] ||
                      weft_fault_skip("SPECULATIVE_ACCEPT_TEST", 0, e->stats.verify_steps);
        if (accept) {
            out[d] = (draw){i, first_row + d, x, (float)log(p[x]), .depth = d, .verified = true};
            continue;
        }
        double v = weft_sampling_uniform(seed, prompt, sample, (uint64_t)position, WEFT_DRAW_TOKEN);
        int y = draw_residual(p, q, V, v);
        out[d] = (draw){i, first_row + d, y, (float)log(p[y]), .depth = -1, .verified = true};
        return d + 1;
    }
    draw bonus = {.seq = i, .row = first_row + nd, .depth = -1, .verified = nd > 0};
    bonus.token = weft_rollout_draw(e, s, logits + (size_t)nd * V, s->len + nd, WEFT_DRAW_TOKEN,
                                    &bonus.processed);
    out[nd] = bonus;
    return nd + 1;
}

// ------------------------------------------------------------------------------- drafting ----

// Rows of one pass for one sequence: positions [lo, hi] (none when hi < lo), whose outputs sit at
// rows row0 + position of the pass's output buffer.
typedef struct rows_span {
    int row0, lo, hi;
} rows_span;

// Module j's rows for sequence s this phase: from its first non-final position to the last whose
// inputs are known (h_{j-1} computed, token t + j accepted), or drafting, to t = cached - 1 (the
// row that drafts).
static rows_span module_rows(const gen_seq *s, int j, bool drafts) {
    int known = s->cached - 1 < s->len - 1 - j ? s->cached - 1 : s->len - 1 - j;
    return (rows_span){.lo = s->mtp_cached[j - 1], .hi = drafts ? s->cached - 1 : known};
}

// How many drafts sequence s makes next: k, fewer near its token limit.
static int drafts_wanted(const weft_engine *e, const gen_seq *s) {
    int left = weft_rollout_token_limit(e, s) - s->len, k = e->rc.speculative_tokens;
    return left < k ? (left > 0 ? left : 0) : k;
}

// Grows a (rows, C) device buffer keeping its first `keep` rows (as weft_rollout_grown sizes: a
// free makes the host wait for the device).
static void *grow_rows(weft_backend *be, void *p, int *cap, int want, int keep, size_t row) {
    if (want <= *cap) return p;
    int rows = want * 2 > 64 ? want * 2 : 64;
    void *bigger = be->alloc(be, row * (size_t)rows);
    if (p && keep > 0) be->copy(be, bigger, p, row * (size_t)keep);
    if (p) be->free(be, p);
    *cap = rows;
    return bigger;
}

// A phase's state: the sequences, what each module's pass computes for them, and where the last
// pass's outputs (the next module's h_{j-1}) are.
typedef struct phase {
    const int *seqs;
    int n;
    bool drafting;
    rows_span *prev; // (n) the producer's rows per sequence
    void *producer;  // (T_prod + stash rows, C) device
    int T_prod;
    // Drafting on the device: module j's head rows go to rows (j - 1) n on of q_out, its drafts
    // to the same rows of tok_out.
    void *q_out;
    int32_t *tok_out;
} phase;

// The module's input h_{j-1} (T, C) into hidden_in: rows of the producer, or of its stash (first
// gathered after the producer's T_prod rows). One upload holds both gathers' rows.
static void gather_inputs(weft_engine *e, phase *ph, int j, const rows_span *r, int T) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    int C = e->model->cfg.hidden_size;
    size_t row = weft_dtype_size(be->act_dtype) * C;
    int32_t *idx = weft_arena_alloc(&e->step_scratch, sizeof(int32_t) * (T + ph->n + 1));
    int32_t *stashed = idx + T; // (n_stash) rows of the stash buffer
    int t = 0, n_stash = 0;
    for (int i = 0; i < ph->n; i++) {
        gen_seq *s = &e->seqs[ph->seqs[i]];
        for (int p = r[i].lo; p <= r[i].hi; p++) {
            if (p >= ph->prev[i].lo && p <= ph->prev[i].hi) {
                idx[t++] = ph->prev[i].row0 + p;
                continue;
            }
            WEFT_CHECK(p == s->stash_pos[j - 1], "internal: MTP module %d needs position %d, which "
                       "module %d neither computed nor kept", j, p, j - 1);
            stashed[n_stash] = s->stash_row[j - 1];
            idx[t++] = ph->T_prod + n_stash++;
        }
    }
    b->gather_rows = weft_rollout_grown(be, b->gather_rows, &b->gather_cap, T + n_stash,
                                        sizeof(int32_t));
    be->to_device(be, b->gather_rows, idx, sizeof(int32_t) * (T + n_stash));
    if (n_stash > 0)
        be->embedding_forward(be, b->gather_rows + T, b->stash[j - 1],
                              (char *)ph->producer + row * ph->T_prod, n_stash, C);
    be->embedding_forward(be, b->gather_rows, ph->producer, b->hidden_in, T, C);
}

// Module j's stash rebuilt: the rows (n_new of them) just kept from the producer's rows `fresh`,
// then every other live sequence's kept row (those not renewed), from the old stash. The
// rows stay on the device: nothing of them comes to the host.
static void restash(weft_engine *e, phase *ph, int j, const int32_t *fresh, const int *who,
                    int n_new) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    int C = e->model->cfg.hidden_size;
    size_t row = weft_dtype_size(be->act_dtype) * C;
    bool *renewed = weft_arena_alloc(&e->step_scratch, (size_t)e->n_seqs + 1);
    int32_t *idx = weft_arena_alloc(&e->step_scratch, sizeof(int32_t) * (e->n_seqs + n_new + 1));
    memcpy(idx, fresh, sizeof(int32_t) * n_new);
    for (int i = 0; i < n_new; i++) {
        renewed[ph->seqs[who[i]]] = true;
        e->seqs[ph->seqs[who[i]]].stash_row[j - 1] = i;
    }
    int n = n_new;
    for (int i = 0; i < e->n_seqs; i++) {
        gen_seq *s = &e->seqs[i];
        if (renewed[i] || s->state == SEQ_DONE || s->stash_pos[j - 1] < 0) continue;
        idx[n] = s->stash_row[j - 1];
        s->stash_row[j - 1] = n++;
    }
    b->stash_spare = weft_rollout_grown(be, b->stash_spare, &b->stash_spare_cap, n, row);
    b->gather_rows = weft_rollout_grown(be, b->gather_rows, &b->gather_cap, n, sizeof(int32_t));
    be->to_device(be, b->gather_rows, idx, sizeof(int32_t) * n);
    be->embedding_forward(be, b->gather_rows, ph->producer, b->stash_spare, n_new, C);
    if (n > n_new)
        be->embedding_forward(be, b->gather_rows + n_new, b->stash[j - 1],
                              (char *)b->stash_spare + row * n_new, n - n_new, C);
    void *old = b->stash[j - 1];
    int old_cap = b->stash_cap[j - 1];
    b->stash[j - 1] = b->stash_spare, b->stash_cap[j - 1] = b->stash_spare_cap;
    b->stash_spare = old, b->stash_spare_cap = old_cap;
}

// After module j's pass: its final positions, and the producer's row it will start from next time
// when the producer will not compute it again (kept in module j's stash).
static void keep_stash(weft_engine *e, phase *ph, int j, const rows_span *r) {
    int32_t *idx = weft_arena_alloc(&e->step_scratch, sizeof(int32_t) * (ph->n + 1));
    int *who = weft_arena_alloc(&e->step_scratch, sizeof(int) * (ph->n + 1)), n = 0;
    for (int i = 0; i < ph->n; i++) {
        gen_seq *s = &e->seqs[ph->seqs[i]];
        int known = module_rows(s, j, false).hi;
        int last = r[i].hi < known ? r[i].hi : known;
        if (r[i].hi >= r[i].lo && last + 1 > s->mtp_cached[j - 1]) s->mtp_cached[j - 1] = last + 1;
        int next = s->mtp_cached[j - 1];
        int producer_next = j == 1 ? s->cached : s->mtp_cached[j - 2];
        if (next >= producer_next) s->stash_pos[j - 1] = -1;
        else if (next >= ph->prev[i].lo && next <= ph->prev[i].hi)
            idx[n] = ph->prev[i].row0 + next, who[n++] = i, s->stash_pos[j - 1] = next;
        else WEFT_CHECK(s->stash_pos[j - 1] == next, "internal: MTP module %d will need "
                        "position %d of module %d, which is not kept", j, next, j - 1);
    }
    if (n > 0) restash(e, ph, j, idx, who, n);
}

// Draws the depth-j draft of each sequence that has a head row (has_head) from its logits (the
// module's n_heads head rows, in the phase's order): on the host, which keeps each draft's row
// (its q), or on the device, where the rows stay in the phase's q_out.
static void take_drafts(weft_engine *e, phase *ph, int j, const bool *has_head, int n_heads) {
    weft_backend *be = e->be;
    int V = e->model->cfg.vocab_size, k = 0, row0 = (j - 1) * ph->n;
    float *host = NULL;
    draw *d = weft_arena_alloc(&e->step_scratch, sizeof(draw) * n_heads);
    if (ph->q_out) {
        for (int i = 0; i < ph->n; i++)
            if (has_head[i]) d[k] = (draw){.seq = ph->seqs[i], .row = row0 + k}, k++;
        weft_rollout_draw_drafts_on_device(e, ph->q_out, d, n_heads, j, ph->tok_out + row0);
    } else {
        host = weft_arena_stage(&e->step_scratch, sizeof(float) * (size_t)n_heads * V);
        be->to_f32(be, host, e->buf.logits, be->act_dtype, (size_t)n_heads * V);
    }
    k = 0;
    for (int i = 0; i < ph->n; i++) {
        gen_seq *s = &e->seqs[ph->seqs[i]];
        if (!has_head[i]) continue;
        int position = s->len + j - 1;
        if (ph->q_out) {
            s->q_row[j - 1] = d[k++].row;
            s->tokens[position] = 0; // known on the device alone
        } else {
            const float *z = host + (size_t)k++ * V;
            memcpy(s->draft_logits + (size_t)(j - 1) * V, z, sizeof(float) * V);
            s->tokens[position] = weft_rollout_draw(e, s, z, position, WEFT_DRAW_DRAFT, NULL);
        }
        s->n_drafts = j;
    }
}

// Module j's pass over the phase's sequences.
static void module_pass(weft_engine *e, phase *ph, int j) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    int C = e->model->cfg.hidden_size, V = e->model->cfg.vocab_size;
    size_t row = weft_dtype_size(be->act_dtype) * C;
    weft_arena *scratch = &e->step_scratch;
    rows_span *r = weft_arena_alloc(scratch, sizeof(rows_span) * ph->n);
    int *docs = weft_arena_alloc(scratch, sizeof(int) * ph->n), n_docs = 0, n_heads = 0;
    int32_t *heads = weft_arena_alloc(scratch, sizeof(int32_t) * (ph->n + 1));
    bool *has_head = weft_arena_alloc(scratch, sizeof(bool) * ph->n);
    weft_batch *batch = &e->draft_batch;
    weft_batch_clear(batch);
    for (int i = 0; i < ph->n; i++) {
        gen_seq *s = &e->seqs[ph->seqs[i]];
        bool drafts = ph->drafting && j <= drafts_wanted(e, s);
        r[i] = module_rows(s, j, drafts);
        r[i].row0 = batch->T - r[i].lo;
        has_head[i] = drafts && r[i].hi >= r[i].lo;
        if (r[i].hi < r[i].lo) continue;
        int start = r[i].lo, rows = r[i].hi - r[i].lo + 1;
        weft_batch_append_chunks(batch, s->tokens + j, NULL, r[i].hi + 1, r[i].hi + 1, &start, 1,
                                 rows);
        docs[n_docs++] = ph->seqs[i];
        if (has_head[i]) heads[n_heads++] = batch->T - 1;
    }
    int T = batch->T;
    if (T > 0) {
        b->hidden_in = grow_rows(be, b->hidden_in, &b->hidden_in_cap, T + ph->n, 0, row);
        void **out_buf = &b->hidden_mtp[j & 1];
        *out_buf = grow_rows(be, *out_buf, &b->hidden_mtp_cap[j & 1], T + ph->n, 0, row);
        gather_inputs(e, ph, j, r, T);
        if (!ph->q_out) weft_rollout_logits_room(e, n_heads);
        paged_provider storage;
        weft_kv_provider kv = weft_rollout_provider(e, batch, docs, n_docs, &storage);
        size_t logits_row = weft_dtype_size(be->act_dtype) * (size_t)V;
        void *logits = ph->q_out ? (char *)ph->q_out + logits_row * (j - 1) * ph->n : b->logits;
        weft_forward_outputs out = {.logits = logits, .hidden = *out_buf, .rows = heads,
                                    .n_rows = n_heads};
        weft_pass_options pass = {.kv = &kv};
        if (ph->q_out) weft_rollout_feed_drafts(e, batch, docs, n_docs, j, ph->tok_out, &pass);
        weft_model_draft_forward(e->model, j, batch, b->hidden_in, &pass, &out);
        if (n_heads > 0) take_drafts(e, ph, j, has_head, n_heads);
    }
    keep_stash(e, ph, j, r);
    memcpy(ph->prev, r, sizeof(rows_span) * ph->n);
    ph->producer = b->hidden_mtp[j & 1];
    ph->T_prod = T;
}

bool weft_rollout_feed_drafts(weft_engine *e, const weft_batch *batch, const int *seqs, int n,
                              int offset, const int32_t *tokens, weft_pass_options *pass) {
    int32_t *feed = weft_arena_alloc(&e->step_scratch, sizeof(int32_t) * (batch->T + 1));
    bool any = false;
    for (int i = 0; i < n; i++) {
        const gen_seq *s = seqs[i] >= 0 ? &e->seqs[seqs[i]] : NULL;
        for (int r = batch->cu_seqlens[i]; r < batch->cu_seqlens[i + 1]; r++) {
            int draft = s ? batch->positions[r] + offset - s->len : -1;
            feed[r] = draft >= 0 ? s->q_row[draft] : -1;
            any |= draft >= 0;
        }
    }
    if (!any) return false;
    step_buffers *b = &e->buf;
    b->draft_feed = weft_rollout_grown(e->be, b->draft_feed, &b->draft_feed_cap, batch->T,
                                       sizeof(int32_t));
    e->be->to_device(e->be, b->draft_feed, feed, sizeof(int32_t) * batch->T);
    pass->token_source = tokens, pass->token_from = b->draft_feed;
    return true;
}

// Drafting on the device: the buffers this phase's drafts go to (the spares of draft_q and
// draft_tok), (k n + carried) rows: k n for the phase's n sequences, by depth, then those of the
// drafts still waiting from an earlier phase (a preempted sequence's, verified once it runs
// again), gathered from the current buffers, into ph's q_out and tok_out. The phase's end makes
// them current.
static void next_drafts_buffers(weft_engine *e, phase *ph) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    int k = e->rc.speculative_tokens, V = e->model->cfg.vocab_size, n = ph->n, carried = 0;
    int32_t *from = weft_arena_alloc(&e->step_scratch, sizeof(int32_t) * (e->n_seqs * k + 1));
    for (int i = 0; i < e->n_seqs; i++) {
        gen_seq *s = &e->seqs[i];
        if (s->state == SEQ_DONE) continue;
        for (int d = 0; d < s->n_drafts; d++) {
            from[carried] = s->q_row[d];
            s->q_row[d] = k * n + carried++;
        }
    }
    int next = b->draft_q_cur ^ 1, cur = b->draft_q_cur;
    b->draft_q[next] = weft_rollout_grown(be, b->draft_q[next], &b->draft_q_cap[next],
                                          k * n + carried, weft_dtype_size(be->act_dtype) * V);
    b->draft_tok[next] = weft_rollout_grown(be, b->draft_tok[next], &b->draft_tok_cap[next],
                                            k * n + carried, sizeof(int32_t));
    if (carried > 0) {
        b->gather_rows = weft_rollout_grown(be, b->gather_rows, &b->gather_cap, carried,
                                            sizeof(int32_t));
        be->to_device(be, b->gather_rows, from, sizeof(int32_t) * carried);
        size_t row = weft_dtype_size(be->act_dtype) * (size_t)V;
        be->embedding_forward(be, b->gather_rows, b->draft_q[cur],
                              (char *)b->draft_q[next] + row * k * n, carried, V);
        be->take_tokens(be, b->draft_tok[next] + k * n, b->draft_tok[cur], b->gather_rows,
                        carried);
    }
    ph->q_out = b->draft_q[next], ph->tok_out = b->draft_tok[next];
}

void weft_rollout_draft(weft_engine *e, const int *seqs, int n, bool drafting) {
    if (n == 0) return;
    double t0 = weft_now_seconds();
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    size_t row = weft_dtype_size(be->act_dtype) * e->model->cfg.hidden_size;
    // Room after the main forward's rows for the stashed rows module 1 reads.
    b->hidden_main = grow_rows(be, b->hidden_main, &b->hidden_main_cap, e->batch.T + n,
                               e->batch.T, row);
    phase ph = {.seqs = seqs, .n = n, .drafting = drafting,
                .prev = weft_arena_alloc(&e->step_scratch, sizeof(rows_span) * n),
                .producer = b->hidden_main,
                .T_prod = e->batch.T};
    bool on_device = drafting && e->verify_on_device;
    if (on_device) next_drafts_buffers(e, &ph);
    for (int i = 0; i < n; i++) {
        const gen_seq *s = &e->seqs[seqs[i]];
        ph.prev[i] = (rows_span){s->main_row0, s->main_lo, s->main_hi};
    }
    // Drafts only propose: verification keeps the output the policy's whatever they are, so
    // their products may read the weights at half the bytes.
    bool rounded = e->rc.draft_bf16 && be->round_fixed_weights;
    if (rounded) be->round_fixed_weights(be, true);
    for (int j = 1; j <= e->rc.speculative_tokens; j++) module_pass(e, &ph, j);
    if (rounded) be->round_fixed_weights(be, false);
    if (on_device) b->draft_q_cur ^= 1;
    e->stats.draft_seconds += weft_now_seconds() - t0;
}
