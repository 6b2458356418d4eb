#include "rollout/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "rollout/internal.h"
#include "rollout/sampling.h"

// ------------------------------------------------------------------------------- set-up ----

long weft_engine_pool_blocks(const weft_model *m, const weft_rollout_config *rc,
                             const weft_sampling_config *sc, const weft_prompt *prompts, int n) {
    const weft_model_config *c = &m->cfg;
    int bs = rc->block_size, k = rc->speculative_tokens;
    if (rc->kv_cache_tokens > 0) return (rc->kv_cache_tokens + bs - 1) / bs;
    size_t block = weft_kv_cache_block_bytes(m->be, c->num_layers + k,
                                             c->num_kv_heads * c->head_dim, bs);
    long blocks = (long)(rc->kv_cache_fraction * (double)m->be->memory_available(m->be) / block);
    long most = 0; // every sample of every prompt at its longest (drafts too), nothing shared
    for (int i = 0; prompts && i < n; i++)
        most += (long)sc->n * ((prompts[i].len + sc->max_tokens + k + bs - 1) / bs + 1);
    return prompts && most < blocks ? most : blocks;
}

// Unset sampling.stop_token_ids: every end-of-text id of the model directory (generation_config.
// json's or config.json's) and the tokenizer's, as vLLM stops at both.
static void default_stop_ids(weft_sampling_config *sc, const weft_model_config *c,
                             const weft_tokenizer *tok) {
    _Static_assert(WEFT_MAX_END_IDS + 2 <= WEFT_MAX_STOP, "room for every default stop id");
    int ids[WEFT_MAX_END_IDS + 2], n = 0;
    for (int i = 0; i < c->n_end_ids; i++) ids[n++] = c->end_ids[i];
    if (c->n_end_ids == 0) ids[n++] = c->eos_token_id; // a model built from scratch sets this alone
    ids[n++] = tok ? weft_tokenizer_eos_id(tok) : -1;
    sc->n_stop_token_ids = 0;
    for (int i = 0; i < n; i++) {
        bool seen = ids[i] < 0;
        for (int j = 0; j < sc->n_stop_token_ids && !seen; j++)
            seen = sc->stop_token_ids[j] == ids[i];
        if (!seen) sc->stop_token_ids[sc->n_stop_token_ids++] = ids[i];
    }
}

weft_engine *weft_engine_create(weft_model *m, const weft_rollout_config *rc,
                                const weft_sampling_config *sc, const weft_tokenizer *tok,
                                long kv_blocks) {
    weft_sampling_config_validate(sc);
    weft_rollout_config_validate(rc, m->cfg.num_mtp, "given to the engine");
    weft_engine *e = weft_alloc(sizeof *e);
    *e = (weft_engine){.model = m, .be = m->be, .rc = *rc, .sc = *sc, .tok = tok, .in_flight = -1,
                       .invariant = rc->batch_invariant && m->be->batch_invariant};
    // A test compares the device's verification with the host's (the same outputs).
    e->verify_on_device = rc->speculative_tokens > 0 && m->be->sample_tokens &&
                          m->be->verify_drafts && m->be->take_tokens &&
                          !weft_fault_skip("DEVICE_VERIFICATION", 0, 0);
    e->stats.batch_invariant = e->invariant || !m->be->batch_invariant;
    const weft_model_config *c = &m->cfg;
    // The MTP modules that draft keep their keys and values in the same blocks, after the
    // decoder's layers.
    e->cache = weft_kv_cache_create(m->be, c->num_layers + rc->speculative_tokens,
                                    c->num_kv_heads * c->head_dim, rc->block_size, kv_blocks);
    // MTP module j's keys at a position read the token j on: a block's content takes the
    // modules' count of tokens after it.
    if (rc->prefix_caching) weft_kv_cache_enable_prefixes(e->cache, rc->speculative_tokens);
    if (e->sc.n_stop_token_ids < 0) default_stop_ids(&e->sc, c, tok);
    for (int i = 0; i < e->sc.n_stop_token_ids; i++)
        WEFT_CHECK(e->sc.stop_token_ids[i] < c->vocab_size, "sampling.stop_token_ids: %d is not a "
                   "token id of the model (vocabulary of %d)", e->sc.stop_token_ids[i],
                   c->vocab_size);
    e->sampling_scratch = weft_alloc(weft_sampling_scratch_bytes(c->vocab_size));
    if (rc->speculative_tokens > 0 && !e->verify_on_device)
        e->verify_scratch = weft_alloc(sizeof(double) * 2 * c->vocab_size);
    return e;
}

void weft_engine_free(weft_engine *e) {
    if (!e) return;
    weft_rollout_pending_free(e);
    weft_kv_cache_free(e->cache);
    weft_rollout_step_buffers_free(e);
    weft_arena_free(&e->step_scratch);
    weft_free(e->seqs);
    weft_free(e->sampling_scratch), weft_free(e->verify_scratch);
    weft_free(e);
}

weft_rollout_stats weft_engine_stats(const weft_engine *e) {
    weft_rollout_stats s = e->stats;
    s.kv = weft_kv_cache_stats_now(e->cache);
    return s;
}

// Positions the samples forked from prompt sequence s copy on write when they draft (their MTP
// modules rewrite the prompt's last k positions): reserved with the prompt's last chunk, so the
// fork cannot run out of blocks.
int weft_rollout_fork_spare(const weft_engine *e, int sample, int len) {
    int k = e->rc.speculative_tokens, bs = e->rc.block_size;
    if (k == 0 || sample >= 0) return 0;
    int first = len - k > 0 ? len - k : 0;
    return (e->sc.n - 1) * ((len - 1) / bs - first / bs + 1) * bs;
}

// The longest context a sequence may reach: the model's, and what the pool holds.
static long context_limit(const weft_engine *e) {
    long pool = (long)weft_kv_cache_pool(e->cache)->n_blocks * e->rc.block_size;
    long model = e->model->cfg.max_position_embeddings;
    return model > 0 && model < pool ? model : pool;
}

void weft_engine_check_prompts(const weft_engine *e, const weft_prompt *prompts, int n,
                               const char *const *names) {
    long pool = (long)weft_kv_cache_pool(e->cache)->n_blocks * e->rc.block_size;
    long model = e->model->cfg.max_position_embeddings;
    for (int i = 0; i < n; i++) {
        const char *name = names ? names[i] : "a prompt";
        WEFT_CHECK(prompts[i].len > 0, "%s is empty; give every prompt at least one token", name);
        long need = (long)prompts[i].len + 1;
        WEFT_CHECK(model <= 0 || need <= model,
                   "%s has %d tokens: with the first new one more than the model's context of "
                   "%ld (max_position_embeddings); shorten it", name, prompts[i].len, model);
        // Speculating, the prompt's last chunk also holds the blocks its samples copy to draft.
        long spare = e->rc.speculative_tokens + weft_rollout_fork_spare(e, -1, prompts[i].len);
        WEFT_CHECK(spare == e->rc.speculative_tokens || need + spare <= pool,
                   "%s has %d tokens: with rollout.speculative_tokens = %d its %d samples "
                   "(sampling.n) each copy the prompt's last KV-cache blocks as it forks, %ld "
                   "positions in all, more than the cache's %ld; raise rollout.kv_cache_tokens (or "
                   "rollout.kv_cache_fraction), or lower sampling.n or rollout.speculative_tokens",
                   name, prompts[i].len, e->rc.speculative_tokens, e->sc.n, need + spare, pool);
        need += spare;
        WEFT_CHECK(need <= pool,
                   "%s has %d tokens: more than the KV cache's %ld positions hold; raise "
                   "rollout.kv_cache_tokens (or rollout.kv_cache_fraction) or shorten it", name,
                   prompts[i].len, pool);
    }
}

void weft_completions_free(weft_completion *c, int n) {
    for (int i = 0; i < n; i++) {
        weft_free(c[i].tokens), weft_free(c[i].logprobs), weft_free(c[i].processed_logprobs);
        weft_free(c[i].text);
    }
}

// ---------------------------------------------------------------------------- sequences ----

// Forgets what the MTP modules cached (the sequence's blocks are gone or never were).
static void reset_drafting_cache(gen_seq *s) {
    for (int j = 0; j < WEFT_MAX_MTP; j++) s->mtp_cached[j] = 0, s->stash_pos[j] = -1;
}

// A sequence for prompt p: its prefill (sample -1) or one of its samples, with room for `extra`
// new tokens and the drafts beyond them.
static gen_seq seq_for_prompt(const weft_engine *e, const weft_prompt *p, int place, int sample,
                              int extra) {
    int k = e->rc.speculative_tokens;
    gen_seq s = {.prompt = p->index, .place = place, .sample = sample, .prompt_len = p->len,
                 .kv = -1, .cap = p->len + extra + 1 + k};
    s.tokens = weft_alloc(sizeof(int32_t) * s.cap);
    s.logprobs = weft_alloc(sizeof(float) * s.cap);
    s.processed = weft_alloc(sizeof(float) * s.cap);
    memcpy(s.tokens, p->tokens, sizeof(int32_t) * p->len);
    s.len = p->len;
    reset_drafting_cache(&s);
    if (k > 0 && !e->verify_on_device) { // else the drafts' rows stay there
        const weft_model_config *c = &e->model->cfg;
        s.draft_logits = weft_alloc(sizeof(float) * k * c->vocab_size);
    }
    return s;
}

static void seq_free(gen_seq *s) {
    weft_free(s->tokens), weft_free(s->logprobs), weft_free(s->processed);
    weft_free(s->draft_logits);
}

int weft_rollout_token_limit(const weft_engine *e, const gen_seq *s) {
    long limit = context_limit(e), most = (long)s->prompt_len + e->sc.max_tokens;
    return (int)(most < limit ? most : limit);
}

static bool is_stop_token(const weft_engine *e, int32_t token) {
    for (int i = 0; i < e->sc.n_stop_token_ids; i++)
        if (token == e->sc.stop_token_ids[i]) return true;
    return false;
}

// Whether the sample's text (decoded from its first n_tokens generated tokens) now holds a stop
// string; *cut receives where the first one starts.
static bool hit_stop_string(const weft_engine *e, const gen_seq *s, int n_tokens, size_t *cut,
                            char **text) {
    *text = NULL;
    if (!e->tok) return false;
    size_t n;
    *text = weft_tokenizer_decode_text(e->tok, s->tokens + s->prompt_len, n_tokens, &n);
    for (int i = 0; i < e->sc.n_stop; i++) {
        const char *at = strstr(*text, e->sc.stop[i]);
        if (at && (size_t)(at - *text) < *cut) *cut = (size_t)(at - *text);
    }
    return *cut < n;
}

// After a new token: whether the sample is done, and why.
static bool finished(weft_engine *e, gen_seq *s) {
    if (is_stop_token(e, s->tokens[s->len - 1])) return s->finish = WEFT_FINISH_STOP, true;
    size_t cut = (size_t)-1;
    char *text = NULL;
    bool stop = e->sc.n_stop > 0 && hit_stop_string(e, s, s->len - s->prompt_len, &cut, &text);
    weft_free(text);
    if (stop) return s->finish = WEFT_FINISH_STOP, true;
    if (s->len >= weft_rollout_token_limit(e, s)) return s->finish = WEFT_FINISH_LENGTH, true;
    return false;
}

// The sample's completion: its generated tokens, log-probs and text. The text leaves out the stop
// token that ended the sample (as vLLM's does; token_ids keep it): "<|endoftext|>" is not part
// of the answer a reward reads.
static void complete(const weft_engine *e, const gen_seq *s, weft_completion *out) {
    int n = s->len - s->prompt_len;
    *out = (weft_completion){.len = n, .finish = s->finish,
                             .tokens = weft_alloc(sizeof(int32_t) * (n > 0 ? n : 1)),
                             .logprobs = weft_alloc(sizeof(float) * (n > 0 ? n : 1))};
    memcpy(out->tokens, s->tokens + s->prompt_len, sizeof(int32_t) * n);
    memcpy(out->logprobs, s->logprobs + s->prompt_len, sizeof(float) * n);
    if (e->sc.processed_logprobs) {
        out->processed_logprobs = weft_alloc(sizeof(float) * (n > 0 ? n : 1));
        memcpy(out->processed_logprobs, s->processed + s->prompt_len, sizeof(float) * n);
    }
    if (e->tok) {
        size_t cut = (size_t)-1;
        char *text = NULL;
        int shown = n > 0 && is_stop_token(e, s->tokens[s->len - 1]) ? n - 1 : n;
        if (hit_stop_string(e, s, shown, &cut, &text)) text[cut] = '\0'; // decodes even with no stops
        out->text = text;
    }
}

// --------------------------------------------------------------------------- scheduling ----

typedef struct in_line {
    long order;
    int seq;
} in_line;

static int older_first(const void *a, const void *b) {
    long x = ((const in_line *)a)->order, y = ((const in_line *)b)->order;
    return (x > y) - (x < y);
}

int *weft_rollout_in_line(weft_engine *e, seq_state state, int *n) {
    in_line *line = weft_arena_alloc(&e->step_scratch, sizeof(in_line) * (size_t)(e->n_seqs + 1));
    int *seqs = weft_arena_alloc(&e->step_scratch, sizeof(int) * (size_t)(e->n_seqs + 1));
    *n = 0;
    for (int i = 0; i < e->n_seqs; i++)
        if (e->seqs[i].state == state) line[(*n)++] = (in_line){e->seqs[i].order, i};
    qsort(line, (size_t)*n, sizeof *line, older_first);
    for (int k = 0; k < *n; k++) seqs[k] = line[k].seq;
    return seqs;
}

// Whether a running sequence still computes positions before its last token (a prompt, or a
// sample recomputed after preemption), whose blocks a waiting one may soon find.
static bool prefilling(const gen_seq *s) { return s->len - s->cached > 1; }

// Prefix caching: whether waiting sequence w had better wait for one of the running sequences
// still computing their first positions (busy[0, n)), which shares more of w's leading full
// blocks than it has computed yet. Once it has, w finds those blocks in the cache instead of
// computing them again beside it (a shared system prompt is computed once, not once a prompt).
static bool prefix_computed_soon(const weft_engine *e, const gen_seq *w, const int *busy, int n) {
    int bs = e->rc.block_size, blocks = (w->len - 1) / bs;
    size_t bytes = sizeof(int32_t) * bs;
    for (int k = 0; k < n && blocks > 0; k++) {
        const gen_seq *r = &e->seqs[busy[k]];
        int known = (r->len - r->in_flight) / bs, common = 0;
        int most = blocks < known ? blocks : known;
        while (common < most && memcmp(w->tokens + (size_t)common * bs,
                                       r->tokens + (size_t)common * bs, bytes) == 0)
            common++;
        if (common * bs > weft_rollout_final_positions(e, r)) return true;
    }
    return false;
}

// Frees running sequence i's blocks and sends it back to wait: it is recomputed (its prompt and
// tokens so far prefilled again) when blocks allow.
static void preempt(weft_engine *e, int i) {
    gen_seq *s = &e->seqs[i];
    weft_kv_seq_release(e->cache, s->kv);
    s->kv = -1, s->cached = 0, s->state = SEQ_WAITING;
    reset_drafting_cache(s); // its drafts stay: verified as they would have been
    e->stats.preemptions++;
}

// The newest running sequence that arrived after `than` (-1: none).
static int newest_after(const weft_engine *e, long than) {
    int newest = -1;
    for (int i = 0; i < e->n_seqs; i++)
        if (e->seqs[i].state == SEQ_RUNNING && e->seqs[i].order > than &&
            (newest < 0 || e->seqs[i].order > e->seqs[newest].order))
            newest = i;
    return newest;
}

int weft_rollout_pending_rows(const gen_seq *s) { return s->len + s->n_drafts - s->cached; }

int weft_rollout_write_from(const weft_engine *e, const gen_seq *s) {
    int from = s->cached;
    for (int j = 0; j < e->rc.speculative_tokens; j++)
        from = s->mtp_cached[j] < from ? s->mtp_cached[j] : from;
    return from;
}

int weft_rollout_final_positions(const weft_engine *e, const gen_seq *s) {
    int final = s->cached;
    for (int j = 0; j < e->rc.speculative_tokens; j++)
        final = s->mtp_cached[j] < final ? s->mtp_cached[j] : final;
    return final;
}

void weft_rollout_publish(weft_engine *e, const int *seqs, int n) {
    for (int k = 0; k < n; k++) {
        const gen_seq *s = &e->seqs[seqs[k]];
        if (s->kv < 0) continue; // done, or forked
        // Tokens the device has not sent yet (asynchronous steps) are not known here.
        weft_kv_seq_publish(e->cache, s->kv, s->tokens, s->len - s->in_flight,
                            weft_rollout_final_positions(e, s));
    }
}

bool weft_rollout_reserve_rows(weft_engine *e, int i, int rows, int spare) {
    if (e->seqs[i].kv < 0) e->seqs[i].kv = weft_kv_seq_new(e->cache);
    while (!weft_kv_seq_reserve(e->cache, e->seqs[i].kv, weft_rollout_write_from(e, &e->seqs[i]),
                                e->seqs[i].cached + rows + spare)) {
        int victim = newest_after(e, e->seqs[i].order);
        if (victim < 0) { // nothing newer to make room: this one waits
            preempt(e, i);
            return false;
        }
        preempt(e, victim);
    }
    return true;
}

// Takes what the prefix cache holds of waiting sequence i's positions, then admits it if the
// blocks its next rows need are free; else gives those back.
static bool try_admit(weft_engine *e, int i) {
    gen_seq *s = &e->seqs[i];
    if (s->kv < 0) s->kv = weft_kv_seq_new(e->cache);
    // Its last token's row is always computed: the next token is drawn from it.
    s->cached = weft_kv_seq_match_prefix(e->cache, s->kv, s->tokens, s->len, s->len - 1);
    // The MTP modules' keys in those blocks are final too: each module starts where the main
    // model does, reading the hidden states it computes (no stashed row needed).
    for (int j = 0; j < e->rc.speculative_tokens; j++) s->mtp_cached[j] = s->cached;
    int rows = weft_rollout_pending_rows(s);
    if (rows > e->rc.max_batch_tokens) rows = e->rc.max_batch_tokens;
    if (weft_kv_seq_blocks_needed(e->cache, s->kv, weft_rollout_write_from(e, s),
                                  s->cached + rows) > weft_kv_cache_free_blocks(e->cache)) {
        weft_kv_seq_release(e->cache, s->kv); // the prefix's blocks stay findable
        s->kv = -1, s->cached = 0;
        reset_drafting_cache(s);
        return false;
    }
    e->stats.prefix_hit_positions += s->cached;
    s->state = SEQ_RUNNING;
    return true;
}

// Admits waiting sequences, oldest first, while their next rows' blocks are free (admission never
// preempts: only running sequences make room for newer ones). A sequence whose leading blocks a
// running one is computing waits for them (prefix caching) and lets the next in line go first.
static void admit(weft_engine *e) {
    int running = 0, n_busy = 0, n_waiting;
    int *line = weft_rollout_in_line(e, SEQ_WAITING, &n_waiting);
    int *busy = weft_arena_alloc(&e->step_scratch, sizeof(int) * (size_t)(e->n_seqs + 1));
    bool prefixes = e->rc.prefix_caching;
    for (int i = 0; i < e->n_seqs; i++) {
        if (e->seqs[i].state != SEQ_RUNNING) continue;
        running++;
        if (prefixes && prefilling(&e->seqs[i])) busy[n_busy++] = i;
    }
    for (int k = 0; k < n_waiting && (e->rc.max_running <= 0 || running < e->rc.max_running);
         k++) {
        int i = line[k];
        if (prefixes && prefix_computed_soon(e, &e->seqs[i], busy, n_busy)) continue;
        if (!try_admit(e, i)) break;
        running++;
        if (prefixes && prefilling(&e->seqs[i])) busy[n_busy++] = i;
    }
}

// A sample of prompt sequence p: its tokens, blocks and what the MTP modules cached.
static gen_seq fork_sample(weft_engine *e, const gen_seq *p, int sample) {
    gen_seq child = seq_for_prompt(e, &(weft_prompt){p->tokens, p->len, p->prompt}, p->place,
                                   sample, e->sc.max_tokens);
    child.kv = weft_kv_seq_fork(e->cache, p->kv);
    child.cached = p->cached;
    child.state = SEQ_RUNNING;
    child.order = p->order + 1 + sample; // the samples take the prompt's place in line
    child.main_row0 = p->main_row0, child.main_lo = p->main_lo, child.main_hi = p->main_hi;
    memcpy(child.mtp_cached, p->mtp_cached, sizeof child.mtp_cached);
    memcpy(child.stash_pos, p->stash_pos, sizeof child.stash_pos);
    memcpy(child.stash_row, p->stash_row, sizeof child.stash_row); // shared until a rebuild
    return child;
}

int weft_rollout_fork_samples(weft_engine *e, int parent) {
    int first = e->n_seqs;
    // The spare blocks reserved with the prompt's last chunk go back for the samples' copies.
    weft_kv_seq_truncate(e->cache, e->seqs[parent].kv, e->seqs[parent].len);
    for (int s = 0; s < e->sc.n; s++) // the table may move as samples are added
        weft_rollout_add_seq(e, fork_sample(e, &e->seqs[parent], s));
    gen_seq *p = &e->seqs[parent];
    weft_kv_seq_release(e->cache, p->kv);
    p->kv = -1;
    p->state = SEQ_DONE;
    // Drafting, each sample's MTP modules rewrite the prompt's last k positions: its own copy.
    int k = e->rc.speculative_tokens, from = p->len - k > 0 ? p->len - k : 0;
    for (int s = 0; s < e->sc.n && k > 0; s++)
        WEFT_CHECK(weft_kv_seq_reserve(e->cache, e->seqs[first + s].kv, from, p->len),
                   "internal: the blocks reserved for a prompt's samples ran out");
    return first;
}

int weft_rollout_add_seq(weft_engine *e, gen_seq s) {
    e->seqs = weft_grow(e->seqs, e->n_seqs, &e->seq_cap, sizeof(gen_seq), 64);
    e->seqs[e->n_seqs] = s;
    return e->n_seqs++;
}

// After a sample's token is appended: done (its blocks freed at once) or on to the next.
void weft_rollout_after_token(weft_engine *e, int i) {
    gen_seq *s = &e->seqs[i];
    e->stats.tokens++;
    if (!finished(e, s)) return;
    weft_kv_seq_release(e->cache, s->kv);
    s->kv = -1;
    s->state = SEQ_DONE;
    e->done_samples++;
    weft_completion *c = &e->out[(size_t)s->place * e->sc.n + s->sample];
    complete(e, s, c);
    if (e->hooks && e->hooks->sample_done)
        e->hooks->sample_done(e->hooks->ctx, s->place, s->sample, c);
}

// ------------------------------------------------------------------------------- the loop ----

// The parameters do not change while the engine generates (a trainer updates them between
// rollouts): the backend may keep what it derives from them for as long (backend.h). And its
// forward ops are batch-invariant for as long, where the engine asks for that.
static void hold_params(weft_engine *e, bool hold) {
    weft_model *m = e->model;
    weft_backend *be = m->be;
    if (hold && be->params_fixed)
        be->params_fixed(be, m->param_buf, m->n_elements * weft_dtype_size(be->param_dtype));
    else if (!hold && be->params_released)
        be->params_released(be);
    if (e->invariant) be->batch_invariant(be, hold);
}

void weft_engine_generate(weft_engine *e, const weft_prompt *prompts, int n_prompts,
                          weft_completion *out, const weft_generate_hooks *hooks) {
    double t0 = weft_now_seconds();
    long waits = e->be->host_waits;
    size_t bytes_read = e->be->host_bytes_read;
    weft_engine_check_prompts(e, prompts, n_prompts, NULL);
    weft_kv_cache_forget_prefixes(e->cache); // the weights may have changed since the last call
    hold_params(e, true);
    e->n_seqs = 0, e->done_samples = 0;
    e->out = out, e->hooks = hooks;
    for (int p = 0; p < n_prompts; p++) {
        gen_seq s = seq_for_prompt(e, &prompts[p], p, -1, 0);
        s.order = e->next_order;
        e->next_order += e->sc.n + 1; // room for the samples' places
        weft_rollout_add_seq(e, s);
    }
    long total = (long)n_prompts * e->sc.n;
    while (e->done_samples < total) {
        admit(e);
        WEFT_CHECK(weft_rollout_step(e), "internal: rollout made no progress");
        if (hooks && hooks->progress)
            hooks->progress(hooks->ctx, (int)(e->done_samples / e->sc.n), n_prompts,
                            e->stats.tokens);
    }
    // A step of finished samples' rows only may still be in flight; every completion is made.
    weft_rollout_settle(e);
    e->out = NULL, e->hooks = NULL;
    for (int i = 0; i < e->n_seqs; i++) seq_free(&e->seqs[i]);
    e->n_seqs = 0;
    hold_params(e, false);
    e->stats.seconds += weft_now_seconds() - t0;
    e->stats.host_waits += e->be->host_waits - waits;
    e->stats.host_bytes_read += (long)(e->be->host_bytes_read - bytes_read);
}

int *weft_rollout_spread(const int *lens, int n, const weft_sampling_config *sc, int rank,
                         int ranks, int *n_mine) {
    double *load = weft_alloc(sizeof(double) * ranks);
    int *order = weft_alloc(sizeof(int) * n), *mine = weft_alloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++) // insertion sort by length, descending, stable
        for (int j = i; j > 0 && lens[order[j]] > lens[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    int *owner = weft_alloc(sizeof(int) * n);
    for (int k = 0; k < n; k++) {
        int best = 0;
        for (int r = 1; r < ranks; r++) best = load[r] < load[best] ? r : best;
        owner[order[k]] = best;
        load[best] += (double)sc->n * (lens[order[k]] + sc->max_tokens);
    }
    *n_mine = 0;
    for (int i = 0; i < n; i++)
        if (owner[i] == rank) mine[(*n_mine)++] = i;
    weft_free(load), weft_free(order), weft_free(owner);
    return mine;
}
