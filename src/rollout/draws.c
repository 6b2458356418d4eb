// Drawing a step's tokens from the main forward's logits: on the host (the CPU backend, which
// reads the logits in place) or on the device (backend sample_tokens, any filter, and with
// speculation verify_drafts: a token and two log-probs per draw come back instead of the logits
// rows); then appending them with their log-probs.
#include <string.h>

#include "core/fault.h"
#include "rollout/internal.h"

int weft_rollout_draw(weft_engine *e, const gen_seq *s, const float *logits, int position,
                      weft_draw_kind kind, float *processed) {
    double u = weft_sampling_uniform((uint64_t)e->sc.seed, (uint64_t)s->prompt,
                                     (uint64_t)s->sample, (uint64_t)position, kind);
    double logp = 0;
    int token = weft_sample_token(&e->sc, logits, e->model->cfg.vocab_size, u, &logp,
                                  e->sampling_scratch);
    if (processed) *processed = (float)logp;
    return token;
}

static draw draw_token(weft_engine *e, int seq, int row, const float *logits) {
    const gen_seq *s = &e->seqs[seq];
    draw d = {.seq = seq, .row = row, .depth = -1};
    d.token = weft_rollout_draw(e, s, logits + (size_t)row * e->model->cfg.vocab_size, s->len,
                                WEFT_DRAW_TOKEN, &d.processed);
    return d;
}

// Device room for n draws: (draws_cap) rows, the rows' token sources (feed), then the draws'
// uniform numbers (one upload sends the three), then tokens, log-probs and processed log-probs
// (one download reads the three). draws_cap is even, so the doubles stay aligned.
static void draw_buffers(weft_engine *e, int n) {
    step_buffers *b = &e->buf;
    int cap = b->draws_cap;
    b->draw_rows = weft_rollout_grown(e->be, b->draw_rows, &cap, n,
                                      sizeof(int32_t) * 5 + sizeof(double));
    if (cap == b->draws_cap) return;
    b->draws_cap = cap;
    b->draw_feed = b->draw_rows + cap;
    b->draw_u = (double *)(b->draw_rows + 2 * cap);
    b->draw_tokens = b->draw_rows + 4 * cap;
    b->draw_logprobs = (float *)(b->draw_rows + 5 * cap);
    b->draw_processed = (float *)(b->draw_rows + 6 * cap);
}

// The base log-probs (temperature 1, no filter) of tokens drawn on the host, by the backend's
// logprobs op on the logits rows they were drawn from, gathered: the op and the arithmetic the
// trainer uses. Or its bits without a trip to the device: from the rows' normalizers, where they
// came down with the logits.
static void base_logprobs(weft_engine *e, const draw *d, int n, float *out) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    int V = e->model->cfg.vocab_size;
    if (b->host_lse_rows > 0) {
        for (int i = 0; i < n; i++) {
            WEFT_CHECK(d[i].row < b->host_lse_rows, "internal: draw row %d has no normalizer",
                       d[i].row);
            out[i] = -(b->host_lse[d[i].row] - b->host_logits[(size_t)d[i].row * V + d[i].token]);
        }
        return;
    }
    int32_t *rows = weft_alloc(sizeof(int32_t) * n), *tokens = weft_alloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) rows[i] = d[i].row, tokens[i] = d[i].token;
    draw_buffers(e, n);
    b->draw_logits = weft_rollout_grown(be, b->draw_logits, &b->draw_logits_cap, n,
                                        weft_dtype_size(be->act_dtype) * (size_t)V);
    be->to_device(be, b->draw_rows, rows, sizeof(int32_t) * n);
    be->to_device(be, b->draw_tokens, tokens, sizeof(int32_t) * n);
    be->embedding_forward(be, b->draw_rows, b->logits, b->draw_logits, n, V); // a row gather
    be->logprobs(be, b->draw_logits, b->draw_tokens, b->draw_logprobs, NULL, NULL, n, V);
    be->to_host(be, out, b->draw_logprobs, sizeof(float) * n);
    weft_free(rows), weft_free(tokens);
}

bool weft_rollout_draws_on_device(const weft_engine *e) {
    return e->be->sample_tokens && e->rc.speculative_tokens == 0;
}

// A sequence's uniform number of `kind` at `position`.
static double uniform_at(const weft_engine *e, const gen_seq *s, int position,
                         weft_draw_kind kind) {
    return weft_sampling_uniform((uint64_t)e->sc.seed, (uint64_t)s->prompt, (uint64_t)s->sample,
                                 (uint64_t)position, kind);
}

// The draws' rows, feed and uniform numbers (kind, at each sequence's len + offset) up.
static void upload_draws_at(weft_engine *e, const draw *d, int n, const int32_t *feed,
                            weft_draw_kind kind, int offset) {
    step_buffers *b = &e->buf;
    draw_buffers(e, n);
    int cap = b->draws_cap;
    size_t bytes = sizeof(int32_t) * 2 * cap + sizeof(double) * n;
    int32_t *rows = weft_alloc(bytes);
    double *u = (double *)(rows + 2 * cap);
    for (int i = 0; i < n; i++) {
        rows[i] = d[i].row;
        rows[cap + i] = feed ? feed[i] : -1;
        if (d[i].seq < 0) continue; // a padding row's draw, dropped
        const gen_seq *s = &e->seqs[d[i].seq];
        u[i] = uniform_at(e, s, s->len + offset, kind);
    }
    e->be->to_device(e->be, b->draw_rows, rows, bytes);
    weft_free(rows);
}

void weft_rollout_upload_draws(weft_engine *e, const draw *d, int n, const int32_t *feed) {
    upload_draws_at(e, d, n, feed, WEFT_DRAW_TOKEN, 0);
}

static weft_draw_filters filters_of(const weft_sampling_config *c) {
    return (weft_draw_filters){.top_k = c->top_k, .top_p = c->top_p, .min_p = c->min_p};
}

// The uploaded draws from rows of `logits`, their tokens into `tokens` and their log-probs into
// the draw buffers, in one launch, which reads the rows in place.
static void sample_rows(weft_engine *e, const void *logits, int n, int32_t *tokens) {
    step_buffers *b = &e->buf;
    weft_draw_filters filters = filters_of(&e->sc);
    e->be->sample_tokens(e->be, logits, b->draw_rows, b->draw_u, n, e->model->cfg.vocab_size,
                         (float)e->sc.temperature, &filters, tokens, b->draw_logprobs,
                         b->draw_processed);
}

void weft_rollout_sample_on_device(weft_engine *e, int n) {
    sample_rows(e, e->buf.logits, n, e->buf.draw_tokens);
}

// The device's draws into d[0, n) and their base log-probs into logp: one download.
static void download_draws(weft_engine *e, draw *d, int n, float *logp) {
    step_buffers *b = &e->buf;
    int cap = b->draws_cap;
    int32_t *out = weft_alloc(sizeof(int32_t) * 3 * cap);
    e->be->to_host(e->be, out, b->draw_tokens, sizeof(int32_t) * 3 * cap); // tokens, logp, proc.
    for (int i = 0; i < n; i++) {
        d[i].token = out[i];
        memcpy(&logp[i], &out[cap + i], sizeof(float));
        memcpy(&d[i].processed, &out[2 * cap + i], sizeof(float));
    }
    weft_free(out);
}

// The draws d[0, n) of the sequences due a token (a prompt's prefill forks its samples first;
// drafts are verified against the host's logits), seq and row set, and their tokens where the
// host draws them. Returns n.
static int collect_draws(weft_engine *e, const due_seqs *due, const float *logits, draw *d) {
    bool on_device = logits == NULL;
    int n = 0;
    for (int k = 0; k < due->n; k++) {
        int i = due->seq[k], row = due->first_row[k];
        bool fork = e->seqs[i].sample < 0;
        if (!fork && !on_device) {
            n += weft_rollout_verify(e, i, logits + (size_t)row * e->model->cfg.vocab_size, row,
                                     d + n);
            continue;
        }
        int first = fork ? weft_rollout_fork_samples(e, i) : i, samples = fork ? e->sc.n : 1;
        for (int s = 0; s < samples; s++)
            d[n++] = on_device ? (draw){.seq = first + s, .row = row, .depth = -1}
                               : draw_token(e, first + s, row, logits);
    }
    return n;
}

void weft_rollout_draw_drafts_on_device(weft_engine *e, const void *logits, const draw *d,
                                        int n, int depth, int32_t *tokens) {
    if (n == 0) return;
    upload_draws_at(e, d, n, NULL, WEFT_DRAW_DRAFT, depth - 1);
    sample_rows(e, logits, n, tokens);
}

// Appends the drawn tokens with their log-probs. Returns the sequences that took a token and
// still run (the next step's drafters) in *took.
static int append_draws(weft_engine *e, const draw *d, int n, const float *logp, int *took) {
    int n_took = 0;
    for (int i = 0; i < n; i++) {
        gen_seq *s = &e->seqs[d[i].seq];
        if (s->state != SEQ_RUNNING) continue; // finished at an earlier accepted draft
        if (n_took == 0 || took[n_took - 1] != d[i].seq) took[n_took++] = d[i].seq;
        s->logprobs[s->len] = logp[i], s->processed[s->len] = d[i].processed;
        s->tokens[s->len++] = d[i].token; // room was made at creation
        // Speculation's counts are of tokens emitted: none past a stop.
        if (d[i].depth >= 0) e->stats.accepted[d[i].depth]++;
        e->stats.verified_tokens += d[i].verified;
        weft_rollout_after_token(e, d[i].seq);
    }
    int still = 0;
    for (int i = 0; i < n_took; i++) {
        gen_seq *s = &e->seqs[took[i]];
        if (s->state != SEQ_RUNNING) continue;
        // Every token but the last is in the cache; rejected drafts' positions are dropped.
        s->cached = s->len - 1, s->n_drafts = 0;
        weft_kv_seq_truncate(e->cache, s->kv, s->cached);
        took[still++] = took[i];
    }
    return still;
}

int weft_rollout_finish_draws(weft_engine *e, draw *d, int n, int *took) {
    float *logp = weft_alloc(sizeof(float) * (n > 0 ? n : 1));
    download_draws(e, d, n, logp);
    int still = append_draws(e, d, n, logp, took);
    weft_free(logp);
    return still;
}

// ------------------------------------------------------------- speculation on the device ----

// One sequence's verification on the device: its first target row and its drafts (none for a
// sample just forked, which draws its first token).
typedef struct draft_check {
    int seq, row, n_drafts;
} draft_check;

// The checks of the due sequences (a prompt's samples forked first).
static draft_check *draft_checks(weft_engine *e, const due_seqs *due, int *n) {
    int cap = 1;
    for (int j = 0; j < due->n; j++) cap += e->seqs[due->seq[j]].sample < 0 ? e->sc.n : 1;
    draft_check *c = weft_arena_alloc(&e->step_scratch, sizeof(draft_check) * cap);
    *n = 0;
    for (int j = 0; j < due->n; j++) {
        int i = due->seq[j], row = due->first_row[j];
        if (e->seqs[i].sample >= 0) {
            c[(*n)++] = (draft_check){i, row, e->seqs[i].n_drafts};
            continue;
        }
        int first = weft_rollout_fork_samples(e, i);
        for (int s = 0; s < e->sc.n; s++) c[(*n)++] = (draft_check){first + s, row, 0};
    }
    return c;
}

// Check m's row of verify_drafts' index (2 + k) and numbers (2k + 1), counting what it offers.
static void check_inputs(weft_engine *e, draft_check c, int32_t *ix, double *u) {
    const gen_seq *s = &e->seqs[c.seq];
    int k = e->rc.speculative_tokens, nd = c.n_drafts;
    if (nd > 0) e->stats.verify_steps++;
    // A test's deliberately biased rule (every draft accepted) must fail the exactness test.
    bool any = nd > 0 && weft_fault_skip("SPECULATIVE_ACCEPT_TEST", 0, e->stats.verify_steps);
    ix[0] = c.row, ix[1] = nd;
    for (int d = 0; d < k; d++) {
        bool offered = d < nd;
        e->stats.drafted[d] += offered; // offered, whether reached or not
        ix[2 + d] = offered ? s->q_row[d] : 0;
        u[d] = !offered ? 0 : any ? -1.0 : uniform_at(e, s, s->len + d, WEFT_DRAW_ACCEPT);
        u[k + d] = offered ? uniform_at(e, s, s->len + d, WEFT_DRAW_TOKEN) : 0;
    }
    u[2 * k] = uniform_at(e, s, s->len + nd, WEFT_DRAW_TOKEN);
}

// verify_drafts' buffers for n checks of k drafts, as byte offsets into one allocation: the
// numbers (n, 2k + 1) from 0 and index (n, 2 + k) go up; count (n), then tokens, log-probs and
// processed log-probs (n, k + 1) each come down.
typedef struct check_layout {
    size_t index, count, tokens, logprob, processed, end;
} check_layout;

static check_layout layout_of(size_t n, int k) {
    check_layout l = {.index = n * sizeof(double) * (2 * k + 1)};
    l.count = l.index + n * sizeof(int32_t) * (2 + k);
    l.tokens = l.count + n * sizeof(int32_t);
    l.logprob = l.tokens + n * sizeof(int32_t) * (k + 1);
    l.processed = l.logprob + n * sizeof(float) * (k + 1);
    l.end = l.processed + n * sizeof(float) * (k + 1);
    return l;
}

#define AT(base, offset, type) ((type *)((char *)(base) + (offset)))

// The emitted tokens of the checks c[0, n) (host copies of verify_drafts' outputs at l) as draws,
// appended.
static int append_checked(weft_engine *e, const draft_check *c, int n, const void *host,
                          check_layout l, int *took) {
    int k = e->rc.speculative_tokens, n_draws = 0;
    const int32_t *count = AT(host, l.count, int32_t), *tokens = AT(host, l.tokens, int32_t);
    const float *logprob = AT(host, l.logprob, float), *processed = AT(host, l.processed, float);
    draw *d = weft_alloc(sizeof(draw) * n * (k + 1));
    float *logp = weft_alloc(sizeof(float) * n * (k + 1));
    for (int m = 0; m < n; m++) {
        WEFT_CHECK(count[m] >= 1 && count[m] <= c[m].n_drafts + 1, "internal: the device's "
                   "verification emitted %d tokens for %d drafts", count[m], c[m].n_drafts);
        for (int t = 0; t < count[m]; t++, n_draws++) {
            size_t at = (size_t)m * (k + 1) + t;
            d[n_draws] = (draw){c[m].seq, c[m].row + t, tokens[at], processed[at],
                                .depth = t < count[m] - 1 ? t : -1,
                                .verified = c[m].n_drafts > 0};
            logp[n_draws] = logprob[at];
        }
    }
    int still = append_draws(e, d, n_draws, logp, took);
    weft_free(d), weft_free(logp);
    return still;
}

// Speculation's tokens drawn on the device: every due sequence's drafts checked against its rows
// of the main forward's logits and the rows of draft_q they were drawn from (verify_drafts), in
// one launch; one upload of the checks, one download of what each emits: the step's one wait.
static int verify_on_device(weft_engine *e, const due_seqs *due, int *took) {
    weft_backend *be = e->be;
    step_buffers *b = &e->buf;
    int k = e->rc.speculative_tokens, n;
    draft_check *c = draft_checks(e, due, &n);
    check_layout l = layout_of((size_t)n, k); // the buffer holds verify_cap checks: n fit
    b->verify_io = weft_rollout_grown(be, b->verify_io, &b->verify_cap, n, layout_of(1, k).end);
    void *host = weft_arena_alloc(&e->step_scratch, l.end), *dev = b->verify_io;
    for (int m = 0; m < n; m++)
        check_inputs(e, c[m], AT(host, l.index, int32_t) + (size_t)m * (2 + k),
                     (double *)host + (size_t)m * (2 * k + 1));
    be->to_device(be, dev, host, l.count);
    weft_draw_filters filters = filters_of(&e->sc);
    int cur = b->draft_q_cur;
    be->verify_drafts(be, b->logits, b->draft_q[cur], b->draft_tok[cur], AT(dev, l.index, int32_t),
                      dev, n, k, e->model->cfg.vocab_size, (float)e->sc.temperature, &filters,
                      AT(dev, l.tokens, int32_t), AT(dev, l.logprob, float),
                      AT(dev, l.processed, float), AT(dev, l.count, int32_t));
    be->to_host(be, AT(host, l.count, char), AT(dev, l.count, char), l.end - l.count);
    return append_checked(e, c, n, host, l, took);
}

int weft_rollout_draw_tokens(weft_engine *e, const due_seqs *due, const float *logits, int *took) {
    if (logits == NULL && e->rc.speculative_tokens > 0) return verify_on_device(e, due, took);
    int cap = 1; // a prompt forks n samples, a sample takes its drafts and one more
    for (int k = 0; k < due->n; k++) {
        const gen_seq *s = &e->seqs[due->seq[k]];
        cap += s->sample < 0 ? e->sc.n : s->n_drafts + 1;
    }
    draw *d = weft_alloc(sizeof(draw) * cap);
    int n = collect_draws(e, due, logits, d);
    if (logits == NULL) { // on the device
        weft_rollout_upload_draws(e, d, n, NULL);
        weft_rollout_sample_on_device(e, n);
        int still = weft_rollout_finish_draws(e, d, n, took);
        weft_free(d);
        return still;
    }
    float *logp = weft_alloc(sizeof(float) * (n > 0 ? n : 1));
    base_logprobs(e, d, n, logp);
    int still = append_draws(e, d, n, logp, took);
    weft_free(d), weft_free(logp);
    return still;
}
