#include "rl/batch.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int weft_rl_mini_batch_prompts(const weft_job_config *c) {
    int mbs = c->rl.ppo_mini_batch_size, step = c->train.global_batch_size;
    return mbs > 0 && mbs < step ? mbs : step;
}

// DAPO's soft overlong punishment: 0 up to max_tokens - buffer tokens, then falling linearly to
// -penalty at max_tokens.
static double overlong_penalty(const weft_job_config *c, int len) {
    if (c->rl.overlong_buffer <= 0) return 0.0;
    double exceed = len - (c->sampling.max_tokens - c->rl.overlong_buffer);
    return fmin(-exceed / c->rl.overlong_buffer * c->rl.overlong_penalty, 0.0);
}

static bool rewards_differ(const double *r, int n) {
    for (int s = 1; s < n; s++)
        if (r[s] != r[0]) return true;
    return false;
}

// One round of generation: P prompts drawn, their samples generated and rewarded, the groups
// kept appended (all, or with dynamic sampling those whose rewards differ, up to P in all).
static void generate_round(const weft_rl_generator *g, weft_data_order *order, weft_rl_batch *b) {
    const weft_job_config *c = g->cfg;
    int P = c->train.global_batch_size, n = c->sampling.n;
    weft_rl_batch_info *info = &b->info;
    long stream = (long)order->epoch * order->n + order->cursor; // the prompts drawn so far
    const weft_rl_prompt **prompts = weft_alloc(sizeof *prompts * P);
    int *index = weft_alloc(sizeof(int) * P);
    weft_data_order_take(order, P, index);
    for (int k = 0; k < P; k++) prompts[k] = &g->train->p[index[k]];
    weft_free(index);
    weft_rl_sample *s = weft_alloc(sizeof *s * P * n);
    weft_rl_rollout_request rq = {&c->rollout, &c->sampling, g->tok, g->reward, prompts, P, stream,
                                  c->reward.overlap};
    weft_rl_rollout_stats rs = weft_rl_rollout(g->m, g->comm, &rq, s);
    info->seconds += rs.seconds, info->tokens += (double)rs.tokens;
    info->reward_seconds += rs.reward_seconds;
    info->rewards_while_generating += (double)rs.rewards_while_generating;
    info->last = rs;
    for (int k = 0; k < P; k++) {
        double r[WEFT_MAX_SAMPLES];
        for (int i = 0; i < n; i++)
            r[i] = s[k * n + i].reward + overlong_penalty(c, s[k * n + i].len);
        bool keep = info->groups < P && (!c->rl.dynamic_sampling || rewards_differ(r, n));
        if (keep) {
            b->prompts[info->groups] = prompts[k];
            memcpy(b->samples + (size_t)info->groups * n, s + (size_t)k * n, sizeof *s * n);
            memcpy(b->rewards + (size_t)info->groups * n, r, sizeof(double) * n);
            info->groups++;
        } else {
            info->dropped += info->groups < P;
            weft_rl_samples_free(s + (size_t)k * n, n);
        }
    }
    info->rounds++;
    weft_free(s), weft_free(prompts);
}

void weft_rl_batch_generate(const weft_rl_generator *g, weft_data_order *order, int step,
                            weft_rl_batch *b) {
    const weft_job_config *c = g->cfg;
    int P = c->train.global_batch_size, n = c->sampling.n;
    *b = (weft_rl_batch){.info = {.weight_version = g->weight_version},
                         .prompts = weft_alloc(sizeof *b->prompts * P),
                         .samples = weft_alloc(sizeof *b->samples * P * n),
                         .rewards = weft_alloc(sizeof(double) * P * n)};
    weft_rl_batch_info *info = &b->info;
    do generate_round(g, order, b);
    while (c->rl.dynamic_sampling && info->groups < P && info->rounds < c->rl.max_gen_batches);
    int mbs = weft_rl_mini_batch_prompts(c);
    if (info->groups < P && g->report)
        fprintf(stderr, "weft: warning: step %d: %d of %d groups have rewards that differ after "
                "rl.max_gen_batches=%d rounds; training on %d of them (whole mini-batches of "
                "%d prompts)\n", step, info->groups, P, c->rl.max_gen_batches,
                info->groups / mbs * mbs, mbs);
    int usable = info->groups / mbs * mbs; // a mini-batch is whole or not taken
    weft_rl_samples_free(b->samples + (size_t)usable * n, (info->groups - usable) * n);
    info->groups = usable;
    info->epoch = order->epoch, info->cursor = order->cursor;
}

void weft_rl_batch_free(weft_rl_batch *b, int n) {
    weft_rl_samples_free(b->samples, b->info.groups * n);
    weft_free(b->samples), weft_free(b->rewards), weft_free(b->prompts);
    *b = (weft_rl_batch){0};
}

// ----------------------------------------------------------------------------- the wire ----

// The info's bytes in whole doubles; then per group its prompt's index, and per sample: length,
// truncated, reward, reward with the penalty, the tokens, the log-probs.
enum { INFO = (sizeof(weft_rl_batch_info) + sizeof(double) - 1) / sizeof(double), SAMPLE = 4 };

double *weft_rl_batch_pack(const weft_rl_batch *b, const weft_rl_prompts *train, int n,
                           size_t *len) {
    int G = b->info.groups;
    size_t total = INFO + (size_t)G;
    for (int i = 0; i < G * n; i++) total += SAMPLE + 2 * (size_t)b->samples[i].len;
    double *packed = weft_alloc(sizeof(double) * total), *at = packed + INFO;
    memset(packed, 0, sizeof(double) * INFO);
    memcpy(packed, &b->info, sizeof b->info);
    for (int g = 0; g < G; g++) {
        *at++ = (double)(b->prompts[g] - train->p);
        for (int k = 0; k < n; k++) {
            const weft_rl_sample *s = &b->samples[g * n + k];
            double head[SAMPLE] = {s->len, s->truncated, s->reward, b->rewards[g * n + k]};
            memcpy(at, head, sizeof head), at += SAMPLE;
            for (int t = 0; t < s->len; t++) *at++ = s->tokens[t];
            for (int t = 0; t < s->len; t++) *at++ = s->logprobs[t];
        }
    }
    *len = total;
    return packed;
}

void weft_rl_batch_unpack(const double *packed, size_t len, const weft_rl_prompts *train, int n,
                          weft_rl_batch *b) {
    WEFT_CHECK(len >= INFO, "internal: a packed RL batch of %zu values", len);
    memset(b, 0, sizeof *b);
    memcpy(&b->info, packed, sizeof b->info);
    int G = b->info.groups;
    b->prompts = weft_alloc(sizeof *b->prompts * (G > 0 ? G : 1));
    b->samples = weft_alloc(sizeof *b->samples * ((size_t)G * n + 1));
    b->rewards = weft_alloc(sizeof(double) * ((size_t)G * n + 1));
    const double *at = packed + INFO, *end = packed + len;
    for (int g = 0; g < G; g++) {
        int index = (int)*at++;
        WEFT_CHECK(index >= 0 && index < train->n, "internal: prompt %d of %d", index, train->n);
        b->prompts[g] = &train->p[index];
        for (int k = 0; k < n; k++) {
            weft_rl_sample *s = &b->samples[g * n + k];
            int L = (int)at[0];
            *s = (weft_rl_sample){.tokens = weft_alloc(sizeof(int32_t) * (L > 0 ? L : 1)),
                                  .logprobs = weft_alloc(sizeof(float) * (L > 0 ? L : 1)),
                                  .len = L, .truncated = at[1] != 0, .reward = at[2]};
            b->rewards[g * n + k] = at[3];
            at += SAMPLE;
            for (int t = 0; t < L; t++) s->tokens[t] = (int32_t)*at++;
            for (int t = 0; t < L; t++) s->logprobs[t] = (float)*at++;
        }
    }
    WEFT_CHECK(at == end, "internal: a packed RL batch of %zu values held %td", len, at - packed);
}
