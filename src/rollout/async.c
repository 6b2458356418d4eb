// Asynchronous scheduling: decode step N+1 is queued before the host has read step N's tokens,
// as vLLM's async scheduler does. Synchronously, each step's end waits for its download (the
// draws), and the GPU then idles while the host appends the tokens, checks stops, chooses the
// next step's rows, builds and uploads its inputs and launches it: at batch 1 that turnaround is
// a fixed share of every step. Queued ahead, the next step's rows take their token ids on the
// device from the draws before them (backend take_tokens), and the host settles step N (tokens,
// log-probs, stops) while step N+1 runs.
//
// The price: a sample that stops at step N has already been given a row in step N+1, which is
// computed in vain (its draw is dropped; stats async.wasted_rows). Blocks it frees at settling
// may be reused by step N+2 at once: all device work runs on one stream, so step N+1 has written
// its keys before anything queued later reads or overwrites them.
//
// Outputs are unchanged: a row's tokens, positions and random numbers are the same as a
// synchronous step's, and the rows of finished samples only pad the batch (bit for bit where the
// backend's kernels give every row the same result whatever the batch holds).
#include <string.h>

#include "rollout/internal.h"

bool weft_rollout_async_ready(const weft_engine *e) {
    const weft_backend *be = e->be;
    if (!e->rc.async_scheduling || !be->download_begin || !be->take_tokens || !be->capture_begin ||
        !weft_rollout_draws_on_device(e))
        return false;
    // Every running sample's next row runs, with no preemption and no row left for later (the
    // host would need its token), and the draws fit the buffers the step in flight's tokens lie in.
    int running = 0;
    long blocks = 0;
    for (int i = 0; i < e->n_seqs; i++) {
        const gen_seq *s = &e->seqs[i];
        if (s->state != SEQ_RUNNING) continue;
        if (s->sample < 0 || weft_rollout_pending_rows(s) != 1) return false;
        blocks += weft_kv_seq_blocks_needed(e->cache, s->kv, weft_rollout_write_from(e, s),
                                            s->cached + 1);
        running++;
    }
    int draws = weft_rollout_decode_rows(e, running);
    return running > 0 && running <= e->rc.max_batch_tokens &&
           blocks <= weft_kv_cache_free_blocks(e->cache) &&
           (e->in_flight < 0 || draws <= e->buf.draws_cap);
}

int weft_rollout_fed_from(const gen_seq *s) { return s->in_flight > 0 ? s->fed_by : -1; }

// Room for n draws in p: the host lists and the pinned copy of the device's (grown only while
// p is not in flight).
static void pending_room(weft_engine *e, pending_step *p, int n) {
    if (n > p->cap) {
        p->cap = 2 * n;
        weft_free(p->seq), weft_free(p->at);
        p->seq = weft_alloc(sizeof(int) * p->cap), p->at = weft_alloc(sizeof(int) * p->cap);
    }
    size_t words = 3 * (size_t)e->buf.draws_cap;
    if (words > p->host_cap) {
        if (p->host) e->be->host_free(e->be, p->host);
        p->host = e->be->host_alloc(e->be, sizeof(int32_t) * words);
        p->host_cap = words;
    }
}

void weft_rollout_queue_ahead(weft_engine *e, const draw *d, int n) {
    int slot = e->in_flight < 0 ? 0 : 1 - e->in_flight;
    pending_step *p = &e->pending[slot];
    step_buffers *b = &e->buf;
    pending_room(e, p, n);
    p->draws_cap = b->draws_cap;
    p->ticket = e->be->download_begin(e->be, p->host, b->draw_tokens,
                                      sizeof(int32_t) * 3 * (size_t)b->draws_cap);
    p->n = n;
    for (int i = 0; i < n; i++) {
        p->seq[i] = d[i].seq, p->at[i] = -1;
        if (d[i].seq < 0) continue; // padding
        gen_seq *s = &e->seqs[d[i].seq];
        p->at[i] = s->len;
        s->tokens[s->len++] = -1; // room was made at creation
        s->in_flight++, s->fed_by = i;
    }
    e->stats.async_steps++;
    weft_rollout_settle(e); // the step before
    e->in_flight = slot;
}

// Draw i's token into its sequence at p->at[i]; the sample is checked for a stop as if that were
// its last token (the placeholders after it set aside), and keeps them only if it runs on.
static void settle_draw(weft_engine *e, const pending_step *p, int i) {
    gen_seq *s = &e->seqs[p->seq[i]];
    if (s->state == SEQ_DONE) { // stopped at an earlier token: this row ran in vain
        e->stats.async_wasted_rows++;
        return;
    }
    int at = p->at[i], cap = p->draws_cap, len = s->len;
    s->tokens[at] = p->host[i];
    memcpy(&s->logprobs[at], &p->host[cap + i], sizeof(float));
    memcpy(&s->processed[at], &p->host[2 * cap + i], sizeof(float));
    s->in_flight--;
    s->len = at + 1;
    weft_rollout_after_token(e, p->seq[i]);
    if (s->state != SEQ_DONE) s->len = len;
    else s->in_flight = 0; // its later placeholders go with it
}

void weft_rollout_settle(weft_engine *e) {
    if (e->in_flight < 0) return;
    pending_step *p = &e->pending[e->in_flight];
    e->in_flight = -1;
    e->be->download_wait(e->be, p->ticket);
    p->ticket = NULL;
    for (int i = 0; i < p->n; i++)
        if (p->seq[i] >= 0) settle_draw(e, p, i);
}

void weft_rollout_pending_free(weft_engine *e) {
    weft_rollout_settle(e);
    for (int k = 0; k < 2; k++) {
        pending_step *p = &e->pending[k];
        weft_free(p->seq), weft_free(p->at);
        if (p->host) e->be->host_free(e->be, p->host);
        *p = (pending_step){0};
    }
}
