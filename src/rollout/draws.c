// Drawing a step's tokens from the main forward's logits: on the host (speculation's verification,
// the CPU backend, which reads the logits in place) or on the device (backend sample_tokens, any
// filter: a token and two log-probs per draw come back instead of the logits rows); then appending
// them with their log-probs.
#include <string.h>

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

void weft_rollout_upload_draws(weft_engine *e, const draw *d, int n, const int32_t *feed) {
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
        u[i] = weft_sampling_uniform((uint64_t)e->sc.seed, (uint64_t)s->prompt,
                                     (uint64_t)s->sample, (uint64_t)s->len, WEFT_DRAW_TOKEN);
    }
    e->be->to_device(e->be, b->draw_rows, rows, bytes);
    weft_free(rows);
}

// The draws and their base log-probs in one launch, which reads the logits rows in place.
void weft_rollout_sample_on_device(weft_engine *e, int n) {
    step_buffers *b = &e->buf;
    const weft_sampling_config *c = &e->sc;
    weft_draw_filters filters = {.top_k = c->top_k, .top_p = c->top_p, .min_p = c->min_p};
    e->be->sample_tokens(e->be, b->logits, b->draw_rows, b->draw_u, n, e->model->cfg.vocab_size,
                         (float)c->temperature, &filters, b->draw_tokens, b->draw_logprobs,
                         b->draw_processed);
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

int weft_rollout_draw_tokens(weft_engine *e, const due_seqs *due, const float *logits, int *took) {
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
