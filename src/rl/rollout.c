#include "rl/rollout.h"

#include <string.h>

#include "rollout/engine.h"

// A sample as doubles (token ids and fp32 log-probs are exact in them): prompt, sample, length,
// truncated, reward, then the tokens and the log-probs.
enum { HEADER = 5 };

static size_t packed_size(const weft_completion *c) { return HEADER + 2 * (size_t)c->len; }

static void pack(double *at, int prompt, int sample, const weft_completion *c, double reward) {
    double head[HEADER] = {prompt, sample, c->len, c->finish == WEFT_FINISH_LENGTH, reward};
    memcpy(at, head, sizeof head);
    for (int t = 0; t < c->len; t++) at[HEADER + t] = c->tokens[t];
    for (int t = 0; t < c->len; t++) at[HEADER + c->len + t] = c->logprobs[t];
}

static const double *unpack(const double *at, int n, weft_rl_sample *out) {
    int prompt = (int)at[0], sample = (int)at[1], len = (int)at[2];
    weft_rl_sample *s = &out[(size_t)prompt * n + sample];
    *s = (weft_rl_sample){.tokens = weft_alloc(sizeof(int32_t) * (len > 0 ? len : 1)),
                          .logprobs = weft_alloc(sizeof(float) * (len > 0 ? len : 1)),
                          .len = len, .truncated = at[3] != 0, .reward = at[4]};
    for (int t = 0; t < len; t++) s->tokens[t] = (int32_t)at[HEADER + t];
    for (int t = 0; t < len; t++) s->logprobs[t] = (float)at[HEADER + len + t];
    return at + HEADER + 2 * (size_t)len;
}

// Every rank's samples to every rank (all enter): one all-gather of the lengths, one of the
// records padded to the longest rank's.
static void gather_samples(weft_comm *world, const double *mine, size_t len, int n,
                           weft_rl_sample *out) {
    int W = weft_comm_size(world);
    double my_len = (double)len, *lens = weft_alloc(sizeof(double) * W), most = 1;
    weft_comm_allgather(world, &my_len, lens, 1, WEFT_COMM_F64);
    for (int r = 0; r < W; r++) most = lens[r] > most ? lens[r] : most;
    size_t stride = (size_t)most;
    double *part = weft_alloc(sizeof(double) * stride), *all = weft_alloc(sizeof(double) * stride * W);
    memcpy(part, mine, sizeof(double) * len);
    weft_comm_allgather(world, part, all, (long)stride, WEFT_COMM_F64);
    for (int r = 0; r < W; r++)
        for (const double *at = all + stride * r; at < all + stride * r + (size_t)lens[r];)
            at = unpack(at, n, out);
    weft_free(lens), weft_free(part), weft_free(all);
}

// This rank's rewards as its samples finish (reward.overlap) or after the rollout.
typedef struct scoring {
    const weft_rl_rollout_request *rq;
    const int *mine;  // (n_mine) the step's prompts this rank generates
    double *rewards;  // (n_mine * n) in (prompt, sample) order
} scoring;

static void score(void *ctx, int k, int s, const weft_completion *c) {
    scoring *sc = ctx;
    const weft_rl_prompt *p = sc->rq->prompts[sc->mine[k]];
    weft_reward_input in = {p->name, p->row, p->text, p->answer, c->text ? c->text : ""};
    weft_reward_submit(sc->rq->reward, &in, &sc->rewards[(size_t)k * sc->rq->sampling->n + s]);
}

// Packs this rank's completions with their rewards (every one in).
static double *pack_all(const weft_rl_rollout_request *rq, const int *mine, int n_mine,
                        const weft_completion *c, const double *rewards, size_t *len) {
    int n = rq->sampling->n;
    *len = 0;
    for (int k = 0; k < n_mine * n; k++) *len += packed_size(&c[k]);
    double *packed = weft_alloc(sizeof(double) * (*len > 0 ? *len : 1)), *at = packed;
    for (int k = 0; k < n_mine * n; k++) {
        pack(at, mine[k / n], k % n, &c[k], rewards[k]);
        at += packed_size(&c[k]);
    }
    return packed;
}

// The step's speculation counts summed over the ranks (all enter).
static void speculation(const weft_rollout_stats *es, int k, weft_comm *world,
                        weft_rl_rollout_stats *st) {
    double t[2 + 2 * WEFT_MAX_MTP] = {(double)es->verify_steps, (double)es->verified_tokens};
    for (int j = 0; j < k; j++) t[2 + j] = (double)es->drafted[j], t[2 + k + j] = (double)es->accepted[j];
    weft_comm_allreduce_sum(world, t, 2 + 2 * k, WEFT_COMM_F64);
    st->spec_depth = k;
    for (int j = 0; j < k; j++) st->spec_acceptance[j] = t[2 + j] > 0 ? t[2 + k + j] / t[2 + j] : 0.0;
    st->spec_tokens_per_verify = t[0] > 0 ? t[1] / t[0] : 0.0;
}

weft_rl_rollout_stats weft_rl_rollout(weft_model *m, weft_comm *world,
                                      const weft_rl_rollout_request *rq, weft_rl_sample *out) {
    double t0 = weft_now_seconds();
    int P = rq->n_prompts, n = rq->sampling->n;
    weft_prompt *all = weft_alloc(sizeof(weft_prompt) * (P > 0 ? P : 1));
    int *lens = weft_alloc(sizeof(int) * (P > 0 ? P : 1));
    for (int k = 0; k < P; k++) {
        all[k] = (weft_prompt){rq->prompts[k]->tokens, rq->prompts[k]->len, (int)(rq->stream + k)};
        lens[k] = rq->prompts[k]->len;
    }
    // Wake: the pool sized on the whole step's prompts, so every rank makes the same one.
    long blocks = weft_engine_pool_blocks(m, rq->rollout, rq->sampling, all, P);
    weft_engine *e = weft_engine_create(m, rq->rollout, rq->sampling, rq->tok, blocks);
    int n_mine, *mine = weft_rollout_spread(lens, P, rq->sampling, weft_comm_rank(world),
                                            weft_comm_size(world), &n_mine);
    weft_prompt *local = weft_alloc(sizeof(weft_prompt) * (n_mine > 0 ? n_mine : 1));
    for (int k = 0; k < n_mine; k++) local[k] = all[mine[k]];
    weft_completion *c = weft_alloc(sizeof(weft_completion) * ((size_t)n_mine * n + 1));
    scoring sc = {rq, mine, weft_alloc(sizeof(double) * ((size_t)n_mine * n + 1))};
    // Overlapped, a reward command scores each response while the other samples generate.
    weft_generate_hooks hooks = {.sample_done = rq->overlap_rewards ? score : NULL, .ctx = &sc};
    weft_engine_generate(e, local, n_mine, c, &hooks);
    weft_rollout_stats es = weft_engine_stats(e);
    weft_engine_free(e); // sleep: the pool's bytes go back now, before training
    weft_rl_rollout_stats st = {.pool_bytes = (double)es.kv.pool_bytes};
    double t_scores = weft_now_seconds();
    st.rewards_while_generating = rq->overlap_rewards
                                      ? n_mine * n - weft_reward_pending(rq->reward) : 0;
    if (!rq->overlap_rewards) // all now, in (prompt, sample) order
        for (int k = 0; k < n_mine * n; k++) score(&sc, k / n, k % n, &c[k]);
    weft_reward_collect(rq->reward);
    st.reward_seconds = weft_now_seconds() - t_scores;
    size_t len;
    double *packed = pack_all(rq, mine, n_mine, c, sc.rewards, &len);
    weft_completions_free(c, n_mine * n);
    weft_free(sc.rewards);
    gather_samples(world, packed, len, n, out);
    double totals[4] = {(double)es.tokens, (double)es.preemptions,
                        (double)es.prefix_hit_positions, (double)st.rewards_while_generating};
    weft_comm_allreduce_sum(world, totals, 4, WEFT_COMM_F64);
    st.tokens = (long)totals[0], st.preemptions = (long)totals[1];
    st.prefix_hits = (long)totals[2], st.rewards_while_generating = (long)totals[3];
    if (rq->rollout->speculative_tokens > 0)
        speculation(&es, rq->rollout->speculative_tokens, world, &st);
    weft_free(packed), weft_free(c), weft_free(local), weft_free(mine), weft_free(lens), weft_free(all);
    st.seconds = weft_now_seconds() - t0;
    return st;
}

void weft_rl_samples_free(weft_rl_sample *s, int n) {
    for (int i = 0; i < n; i++) weft_free(s[i].tokens), weft_free(s[i].logprobs);
}
