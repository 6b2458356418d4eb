#include "rl/loop.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rl/advantage.h"
#include "rl/batch.h"
#include "rl/evaluate.h"
#include "rl/exchange.h"
#include "rl/report.h"
#include "rl/objective.h"
#include "rl/rollout.h"
#include "train/checkpoint.h"
#include "train/job.h"
#include "train/loop.h"
#include "train/stats.h"

weft_job_config weft_rl_defaults(void) {
    weft_job_config c = weft_job_config_default();
    snprintf(c.train.output_dir, sizeof c.train.output_dir, "runs/rl");
    c.train.steps = 200;
    c.train.global_batch_size = 32; // prompts per step: 16 gave noisier updates, +12 points at most
    c.rl.ppo_mini_batch_size = 16;
    c.train.save_every = 50;
    c.train.log_every = 1;
    c.sampling.n = 8;
    c.sampling.max_tokens = 160;
    c.rl.eval_prompts = 512; // +-2 points of noise on the held-out accuracy
    c.rl.eval_every = 50;
    // Constant and small: 1e-4 undid the SFT model within 10 steps, 1e-5 learned slowly.
    c.optim.lr = c.optim.min_lr = 3e-5;
    c.optim.warmup_steps = 0;
    c.optim.clip_grad = 1.0;
    return c;
}

typedef struct rl_job {
    weft_job_config cfg;
    weft_comm *world;
    // rl.rollout_ranks > 0: the two sides' traffic, and this rank's side (world: NULL and world)
    weft_rl_exchange *x;
    weft_comm *group;
    bool writer;
    weft_tokenizer *tok;
    weft_backend *be;
    weft_model *m;
    weft_trainer *t; // NULL on a rank that only generates
    // The reference policy for the KL term (rl.kl_loss_coef > 0): model.path's weights, frozen,
    // scored by a trainer of its own in the same layout. NULL without a KL term.
    weft_model *ref_model;
    weft_trainer *ref;
    weft_reward *reward;
    weft_rl_objective *objective;
    weft_rl_prompts *train, *eval;
    FILE *metrics;
    double kl_coef; // the next step's KL-in-reward coefficient (rl.use_kl_in_reward)
} rl_job;


// ------------------------------------------------------------------------------- start-up ----

// The default SFT job's final checkpoint, training it first when it is not there: `weft rl` with
// no model starts where `weft train` with no arguments ends.
static void sft_start(weft_job_config *cfg, weft_session *session) {
    weft_job_config sft = weft_job_config_default();
    char path[WEFT_PATH_MAX];
    WEFT_CHECK(snprintf(path, sizeof path, "%s/checkpoints/step_%08d", sft.train.output_dir,
                        sft.train.steps) < (int)sizeof path, "internal: SFT path too long");
    char state[WEFT_PATH_MAX + 96];
    snprintf(state, sizeof state, "%s/trainer_state.json", path);
    if (access(state, R_OK) != 0) {
        if (weft_session_writer(session))
            printf("weft rl: no model.path given and no SFT checkpoint at %s: training the default "
                   "SFT job first\n", path);
        weft_train_run(&sft, session, NULL);
    }
    snprintf(cfg->model.path, sizeof cfg->model.path, "%s", path);
}

// Every problem a step could draw must fit: the prompt plus sampling.max_tokens in one document
// the trainer's layout takes whole; with exact_match it must carry an answer. Checked before any
// work, naming the first that does not.
static void check_prompts(const rl_job *j, const weft_rl_prompts *set) {
    for (int i = 0; i < set->n && j->cfg.reward.type == WEFT_REWARD_EXACT_MATCH; i++)
        WEFT_CHECK(set->p[i].answer, "%s: the prompt has no \"answer\" field, which "
                   "reward.type=exact_match compares the extracted answer with; add one, or use "
                   "reward.type=command", set->p[i].name);
    char why[192];
    int trainers = j->x ? weft_rl_exchange_trainers(j->x) : weft_comm_size(j->world);
    int most = weft_trainer_max_document_len(&j->cfg, trainers, why, sizeof why);
    int ctx = j->m->cfg.max_position_embeddings;
    for (int i = 0; i < set->n; i++) {
        long need = (long)set->p[i].len + j->cfg.sampling.max_tokens;
        WEFT_CHECK(need <= most && (ctx <= 0 || need <= ctx),
                   "%s: the prompt has %d tokens; with sampling.max_tokens=%d that is %ld, more "
                   "than %s (%d) or the model's context (%d); shorten the prompt or lower "
                   "sampling.max_tokens", set->p[i].name, set->p[i].len,
                   j->cfg.sampling.max_tokens, need, why, most, ctx);
    }
}

static void check_settings(const weft_job_config *c) {
    const weft_sampling_config *sc = &c->sampling;
    WEFT_CHECK(sc->temperature == 1 && sc->top_k == 0 && sc->top_p == 1 && sc->min_p == 0,
               "sampling.temperature=%g top_k=%d top_p=%g min_p=%g: weft rl samples the policy "
               "itself (temperature 1, no filter), whose log-probs the trainer computes; a "
               "tempered or filtered rollout would be off-policy without saying so. Leave these "
               "at their defaults", sc->temperature, sc->top_k, sc->top_p, sc->min_p);
    if (c->reward.type == WEFT_REWARD_EXACT_MATCH) // the pattern compiles
        weft_reward_free(weft_reward_create(&c->reward));
    WEFT_CHECK(c->reward.type == WEFT_REWARD_COMMAND || !c->reward.command[0],
               "reward.command is set but reward.type=exact_match ignores it; add "
               "reward.type=command, or drop reward.command");
    int mbs = weft_rl_mini_batch_prompts(c);
    WEFT_CHECK(c->train.global_batch_size % mbs == 0, "rl.ppo_mini_batch_size=%d does not divide "
               "train.global_batch_size=%d (prompts per step); pick a divisor, or 0 for the whole "
               "step", mbs, c->train.global_batch_size);
    WEFT_CHECK(!(c->sampling.n == 1 && c->rl.adv_estimator == WEFT_ADV_GRPO &&
                 c->rl.norm_adv_by_std),
               "sampling.n=1 with rl.adv_estimator=grpo and rl.norm_adv_by_std=true: a group of "
               "one sample has no spread, so every advantage would be 0; raise sampling.n");
    int samples = c->train.global_batch_size * c->sampling.n;
    WEFT_CHECK(!c->rl.use_kl_in_reward || c->rl.kl_ctrl != WEFT_KL_CTRL_ADAPTIVE ||
                   c->rl.kl_horizon > 0.2 * samples,
               "rl.kl_horizon=%g with %d samples per step: the adaptive KL coefficient moves by "
               "up to 0.2 x samples / horizon per step, which would take it to 0 or below; raise "
               "rl.kl_horizon above %g", c->rl.kl_horizon, samples, 0.2 * samples);
    WEFT_CHECK(c->rl.recompute_old_logprobs || c->rl.tis_imp_ratio_cap == 0,
               "rl.tis_imp_ratio_cap=%g with rl.recompute_old_logprobs=false: the weights compare "
               "the trainer's log-probs with the rollout's, and without the recomputation the two "
               "are the same; recompute, or drop rl.tis_imp_ratio_cap", c->rl.tis_imp_ratio_cap);
    WEFT_CHECK(c->sampling.n <= WEFT_MAX_SAMPLES, "sampling.n=%d: weft rl takes at most %d "
               "samples per prompt", c->sampling.n, WEFT_MAX_SAMPLES);
    WEFT_CHECK(!(c->sampling.n == 1 && c->rl.adv_estimator == WEFT_ADV_RLOO),
               "sampling.n=1 with rl.adv_estimator=rloo: the leave-one-out baseline needs at "
               "least 2 samples per prompt; raise sampling.n");
}

static void job_open(rl_job *j, const weft_job_config *cfg, weft_session *session) {
    memset(j, 0, sizeof *j);
    j->cfg = *cfg;
    j->world = weft_session_world(session);
    j->writer = weft_session_writer(session);
    j->tok = weft_job_tokenizer(cfg);
    WEFT_CHECK(j->tok, "weft rl tokenizes its prompts and decodes responses for rewards, and %s",
               WEFT_NO_TOKENIZER_HINT);
    j->be = weft_job_backend(cfg, j->world);
    j->x = weft_rl_exchange_create(j->world, j->be, cfg);
    j->group = j->x ? weft_rl_exchange_side(j->x) : j->world;
    int vocab = weft_tokenizer_vocab_size(j->tok);
    if (weft_rl_exchange_generates(j->x)) { // the weights come from trainer 0
        weft_model_config mc;
        weft_job_model_config(cfg, vocab, &mc);
        j->m = weft_trainer_build_model(j->be, j->group, &mc, cfg, true);
    } else {
        j->m = weft_job_build_model(j->be, j->group, cfg, vocab, false);
    }
    weft_rollout_config_validate(&cfg->rollout, j->m->cfg.num_mtp, cfg->model.path);
    // The optimizer's schedule spans every update: steps x epochs x mini-batches.
    weft_job_config tc = *cfg;
    int mbs = weft_rl_mini_batch_prompts(cfg);
    tc.train.steps = cfg->train.steps * cfg->rl.ppo_epochs * (cfg->train.global_batch_size / mbs);
    j->kl_coef = cfg->rl.kl_coef;
    if (!weft_rl_exchange_generates(j->x)) {
        j->t = weft_trainer_create(j->m, j->group, &tc, true);
        if (cfg->rl.kl_loss_coef != 0 || cfg->rl.use_kl_in_reward) {
            j->ref_model = weft_job_build_model(j->be, j->group, cfg, vocab, true);
            j->ref = weft_trainer_create(j->ref_model, j->group, cfg, false);
        }
    }
    j->objective = weft_rl_objective_create(&cfg->rl, cfg->sampling.max_tokens, cfg->data.source);
    j->train = weft_rl_prompts_load(cfg, j->tok, false);
    j->eval = weft_rl_prompts_load(cfg, j->tok, true);
    WEFT_CHECK(cfg->train.global_batch_size <= j->train->n, "train.global_batch_size=%d prompts "
               "per step is more than the %d training prompts of data.source=%s; lower it or give "
               "more prompts", cfg->train.global_batch_size, j->train->n, cfg->data.source);
    check_prompts(j, j->train);
    check_prompts(j, j->eval);
    // A reward command starts once all is checked; a rank that only trains needs one for
    // held-out evaluation alone.
    if (!j->x || weft_rl_exchange_generates(j->x) || cfg->rl.eval_every > 0)
        j->reward = weft_reward_create(&cfg->reward);
}

static void job_close(rl_job *j) {
    if (j->metrics) fclose(j->metrics);
    weft_rl_prompts_free(j->train), weft_rl_prompts_free(j->eval);
    weft_rl_objective_free(j->objective);
    weft_reward_free(j->reward);
    weft_trainer_free(j->t);
    weft_model_free(j->m);
    weft_trainer_free(j->ref);
    weft_model_free(j->ref_model);
    weft_rl_exchange_free(j->x);
    weft_backend_destroy(j->be);
    weft_tokenizer_free(j->tok);
}

// --------------------------------------------------------------------------- a step's data ----

// Sample i of the step as a training document: its prompt and response, the response's tokens
// the targets (with the rollout's log-probs when truncated importance sampling reads them);
// old_logprobs are filled by the trainer, advantages once the rewards are final.
static weft_document sample_document(const weft_rl_prompt *p, const weft_rl_sample *s,
                                     bool rollout_logprobs) {
    int len = p->len + s->len;
    weft_document d = {.len = len, .tokens = weft_alloc(sizeof(int32_t) * len),
                       .loss_mask = weft_alloc((size_t)len),
                       .advantages = weft_alloc(sizeof(float) * len),
                       .old_logprobs = weft_alloc(sizeof(float) * len)};
    memcpy(d.tokens, p->tokens, sizeof(int32_t) * p->len);
    memcpy(d.tokens + p->len, s->tokens, sizeof(int32_t) * s->len);
    if (rollout_logprobs) {
        d.rollout_logprobs = weft_alloc(sizeof(float) * len);
        memset(d.rollout_logprobs, 0, sizeof(float) * p->len);
        memcpy(d.rollout_logprobs + p->len, s->logprobs, sizeof(float) * s->len);
    }
    for (int t = 0; t < len; t++) {
        d.loss_mask[t] = t >= p->len;
        d.advantages[t] = 0.0f;
        d.old_logprobs[t] = 0.0f;
    }
    return d;
}

static double sum_of(const double *x, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += x[i];
    return sum;
}

static void free_documents(weft_document *docs, int n) {
    for (int i = 0; i < n; i++)
        weft_free(docs[i].tokens), weft_free(docs[i].loss_mask), weft_free(docs[i].advantages),
            weft_free(docs[i].old_logprobs), weft_free(docs[i].ref_logprobs),
            weft_free(docs[i].rollout_logprobs);
    weft_free(docs);
}

// Over the step's samples: rewards (the overlong penalty included), accuracy (the reward
// function's score above 0), lengths.
static void sample_statistics(const weft_rl_sample *s, const double *rewards, int N,
                              weft_rl_step_metrics *sm) {
    double sum = 0, sq = 0, len = 0, most = 0, clipped = 0, correct = 0;
    for (int i = 0; i < N; i++) {
        sum += rewards[i], sq += rewards[i] * rewards[i], correct += s[i].reward > 0;
        len += s[i].len, most = s[i].len > most ? s[i].len : most, clipped += s[i].truncated;
    }
    sm->reward_mean = sum / N;
    sm->reward_std = N > 1 ? sqrt(fmax(0.0, (sq - sum * sum / N) / (N - 1))) : 0.0;
    sm->accuracy = correct / N;
    sm->length_mean = len / N, sm->length_max = most, sm->clip_frac = clipped / N;
}

// The log-probs trainer t computes for the documents in its layout: document-major, document i's
// token t at the sum of the earlier lengths + t (weft_alloc'd).
static float *scored_logprobs(weft_trainer *t, const weft_document *docs, int N) {
    long T = 0;
    for (int i = 0; i < N; i++) T += docs[i].len;
    float *lp = weft_alloc(sizeof(float) * (T > 0 ? T : 1));
    weft_trainer_score(t, docs, N, &(weft_trainer_outputs){.logprobs = lp});
    return lp;
}

// The old log-probs, recomputed by the trainer in its own layout, into the documents; and how far
// the rollout's were from them (0 on the CPU: the same ops in the same order). Without
// rl.recompute_old_logprobs, the rollout's own, and no mismatch measured (< 0).
static void old_logprobs(rl_job *j, weft_document *docs, int N, const weft_rl_sample *samples,
                         const weft_rl_prompt *const *prompts, int n, weft_rl_step_metrics *sm) {
    double t0 = weft_now_seconds();
    if (!j->cfg.rl.recompute_old_logprobs) {
        for (int i = 0; i < N; i++) {
            int P = prompts[i / n]->len;
            memcpy(docs[i].old_logprobs + P, samples[i].logprobs, sizeof(float) * samples[i].len);
        }
        sm->mismatch_max = sm->mismatch_mean = sm->mismatch_k3 = -1;
        sm->old_logprob_seconds = weft_now_seconds() - t0;
        return;
    }
    float *lp = scored_logprobs(j->t, docs, N);
    double most = 0, sum = 0, k3 = 0;
    long count = 0, at = 0;
    for (int i = 0; i < N; i++) {
        int P = prompts[i / n]->len;
        memcpy(docs[i].old_logprobs, lp + at, sizeof(float) * docs[i].len);
        for (int t = 0; t < samples[i].len; t++) {
            double delta = (double)lp[at + P + t] - samples[i].logprobs[t];
            most = fmax(most, fabs(delta)), sum += fabs(delta), count++;
            k3 += exp(-delta) + delta - 1; // KL(rollout || trainer), k3 estimate per token
        }
        at += docs[i].len;
    }
    weft_free(lp);
    sm->mismatch_max = most, sm->mismatch_mean = sum / count, sm->mismatch_k3 = k3 / count;
    sm->old_logprob_seconds = weft_now_seconds() - t0;
}

// The reference policy's log-probs of the samples, for the KL term.
static void reference_logprobs(rl_job *j, weft_document *docs, int N) {
    float *lp = scored_logprobs(j->ref, docs, N);
    long at = 0;
    for (int i = 0; i < N; i++) {
        docs[i].ref_logprobs = weft_alloc(sizeof(float) * docs[i].len);
        memcpy(docs[i].ref_logprobs, lp + at, sizeof(float) * docs[i].len);
        at += docs[i].len;
    }
    weft_free(lp);
}

// KL in the reward, per response token: kl(old log-prob, reference log-prob) into kl[i]
// (samples[i].len); sm gets the responses' mean per-token KL and the coefficient charged, and the
// controller sets the next step's. Returns the coefficient charged.
static double reward_kl(rl_job *j, const weft_document *docs, const weft_rl_prompt *const *prompts,
                        const weft_rl_sample *samples, int N, double **kl,
                        weft_rl_step_metrics *sm) {
    const weft_rl_config *c = &j->cfg.rl;
    int n = j->cfg.sampling.n;
    double per_token = 0;
    for (int i = 0; i < N; i++) {
        int P = prompts[i / n]->len, len = samples[i].len;
        kl[i] = weft_alloc(sizeof(double) * (len > 0 ? len : 1));
        weft_kl_penalties(c, docs[i].old_logprobs + P, docs[i].ref_logprobs + P, len, kl[i]);
        per_token += len > 0 ? sum_of(kl[i], len) / len : 0.0;
    }
    sm->reward_kl = per_token / N, sm->reward_kl_coef = j->kl_coef;
    double charged = j->kl_coef;
    j->kl_coef = weft_kl_coef_next(c, j->kl_coef, sm->reward_kl, N);
    return charged;
}

// The step's advantages into the documents' response tokens. Per sample (adv, N) for every
// estimator but REINFORCE++ (adv NULL there: its advantages differ per token): of the rewards
// less coef times each response's summed KL (kl NULL: no KL in the reward).
static void assign_advantages(rl_job *j, weft_document *docs, const weft_rl_batch *b, int N,
                              double *const *kl, double coef, double *adv) {
    const weft_rl_config *c = &j->cfg.rl;
    int n = j->cfg.sampling.n;
    int *lengths = weft_alloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) lengths[i] = b->samples[i].len;
    if (!adv) {
        float **out = weft_alloc(sizeof(float *) * N);
        for (int i = 0; i < N; i++) out[i] = docs[i].advantages + b->prompts[i / n]->len;
        weft_reinforce_pp_advantages(b->rewards, (const double *const *)kl, coef, lengths, N, out);
        weft_free(out);
    } else {
        double *shaped = weft_alloc(sizeof(double) * N);
        for (int i = 0; i < N; i++)
            shaped[i] = b->rewards[i] - (kl ? coef * sum_of(kl[i], lengths[i]) : 0.0);
        weft_advantages(c, shaped, lengths, b->info.groups, n, adv);
        for (int i = 0; i < N; i++)
            for (int t = 0; t < docs[i].len; t++) docs[i].advantages[t] = (float)adv[i];
        weft_free(shaped);
    }
    weft_free(lengths);
}

static void add_metrics(weft_rl_metrics *acc, const weft_rl_metrics *m, double w) {
    acc->loss += w * m->loss, acc->pg_loss += w * m->pg_loss, acc->kl_loss += w * m->kl_loss;
    acc->entropy += w * m->entropy, acc->pg_clipfrac += w * m->pg_clipfrac;
    acc->pg_clipfrac_lower += w * m->pg_clipfrac_lower, acc->ppo_kl += w * m->ppo_kl;
    acc->tis_weight += w * m->tis_weight, acc->tis_capped += w * m->tis_capped;
}

// rl.ppo_epochs passes over the step's samples in mini-batches of whole groups, one optimizer
// step each.
static void policy_updates(rl_job *j, const weft_document *docs, int N, weft_rl_step_metrics *sm) {
    double t0 = weft_now_seconds();
    const weft_job_config *c = &j->cfg;
    int n = c->sampling.n;
    int mbs = weft_rl_mini_batch_prompts(c);
    int per_update = mbs * n, updates = c->rl.ppo_epochs * (N / per_update);
    weft_trainer_set_objective(j->t, weft_rl_objective_hooks(j->objective));
    memset(&sm->loss, 0, sizeof sm->loss);
    sm->grad_norm = 0;
    for (int e = 0; e < c->rl.ppo_epochs; e++)
        for (int b = 0; b + per_update <= N; b += per_update) {
            weft_step_result r = weft_trainer_step(j->t, docs + b, per_update);
            weft_rl_metrics m = weft_rl_objective_metrics(j->objective);
            add_metrics(&sm->loss, &m, 1.0 / updates);
            sm->grad_norm += r.grad_norm / updates;
            sm->lr = r.lr;
        }
    weft_trainer_set_objective(j->t, NULL);
    sm->update_seconds = weft_now_seconds() - t0;
}

// ------------------------------------------------------------------------------- the step ----

// rl.offload_training_state: the trainer's optimizer state, gradients and activations (and the
// reference policy's activations) leave device memory while rollout runs; returns the bytes given
// back, as the backend counts them (0 when off).
static double trainer_sleep(rl_job *j) {
    if (!j->cfg.rl.offload_training_state) return 0.0;
    size_t held = j->be->bytes_in_use;
    weft_trainer_sleep(j->t);
    if (j->ref_model) weft_model_release_activations(j->ref_model);
    return (double)(held - j->be->bytes_in_use);
}

static void trainer_wake(rl_job *j) {
    if (j->cfg.rl.offload_training_state) weft_trainer_wake(j->t);
}

// The held-out problems, on the trainers (with rl.rollout_ranks too: they hold the newest
// weights), the trainer asleep meanwhile like a rollout's.
static weft_rl_eval evaluate(rl_job *j) {
    trainer_sleep(j);
    weft_rl_eval r = weft_rl_evaluate(j->m, j->group, &j->cfg, j->tok, j->reward, j->eval);
    trainer_wake(j);
    return r;
}

static json_t *float_list(const float *x, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(x[i]));
    return a;
}

// The step's samples as JSON lines (rank 0, atomically): prompt, response tokens and text-free
// numbers, so runs on different layouts can be compared sample by sample.
static void save_rollouts(const rl_job *j, int step, const weft_rl_batch *b, const double *adv,
                          double *const *kl, const weft_document *docs) {
    if (!j->writer) return;
    int n = j->cfg.sampling.n, N = b->info.groups * n;
    const weft_rl_prompt *const *prompts = b->prompts;
    const weft_rl_sample *s = b->samples;
    char path[WEFT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/rollouts", j->cfg.train.output_dir);
    WEFT_CHECK(weft_mkdirs(path), "%s: cannot create (%s)", path, strerror(errno));
    snprintf(path, sizeof path, "%s/rollouts/step_%06d.jsonl", j->cfg.train.output_dir, step);
    char **lines = weft_alloc(sizeof(char *) * N);
    size_t len = 0;
    for (int i = 0; i < N; i++) {
        json_t *tokens = json_array(), *lp = json_array(), *old = json_array(), *ref = json_array();
        int P = prompts[i / n]->len;
        for (int t = 0; t < s[i].len; t++) {
            json_array_append_new(tokens, json_integer(s[i].tokens[t]));
            json_array_append_new(lp, json_real(s[i].logprobs[t]));
            json_array_append_new(old, json_real(docs[i].old_logprobs[P + t]));
            if (docs[i].ref_logprobs)
                json_array_append_new(ref, json_real(docs[i].ref_logprobs[P + t]));
        }
        json_t *row = json_pack("{s:s, s:i, s:o, s:o, s:o, s:f, s:b, s:i}", "prompt",
                                prompts[i / n]->name, "sample", i % n, "tokens", tokens,
                                "logprobs", lp, "old_logprobs", old, "reward", s[i].reward,
                                "truncated", s[i].truncated, "weight_version",
                                b->info.weight_version);
        if (adv) json_object_set_new(row, "advantage", json_real(adv[i]));
        else json_object_set_new(row, "token_advantages", float_list(docs[i].advantages + P,
                                                                     s[i].len));
        if (docs[i].ref_logprobs) json_object_set(row, "ref_logprobs", ref);
        if (kl) json_object_set_new(row, "kl_penalty", json_real(sum_of(kl[i], s[i].len)));
        json_decref(ref);
        lines[i] = json_dumps(row, JSON_COMPACT | JSON_REAL_PRECISION(9));
        len += strlen(lines[i]) + 1;
        json_decref(row);
    }
    char *text = weft_alloc(len + 1), *at = text;
    for (int i = 0; i < N; i++) at += sprintf(at, "%s\n", lines[i]), free(lines[i]);
    weft_free(lines);
    WEFT_CHECK(weft_write_file_atomic(path, text, len), "%s: cannot write (%s)", path, strerror(errno));
    weft_free(text);
}

// Every rank trains and generates: the step's batch generated here with the trainer's own
// weights (version step - 1) while the trainer sleeps.
static void generate_here(rl_job *j, weft_data_order *order, int step, weft_rl_batch *b,
                          weft_rl_step_metrics *sm) {
    sm->offloaded_bytes = trainer_sleep(j);
    weft_backend_reset_peak(j->be);
    weft_rl_generator g = {&j->cfg, j->m, j->group, j->tok, j->reward, j->train, step - 1,
                           j->writer};
    weft_rl_batch_generate(&g, order, step, b);
    sm->rollout_peak_bytes = (double)j->be->peak_bytes;
    sm->bytes_after_sleep = (double)j->be->bytes_in_use;
}

// A trainer's wait for the rollout ranks' next batch.
static void receive_batch(rl_job *j, weft_rl_batch *b, weft_rl_step_metrics *sm) {
    double t0 = weft_now_seconds();
    size_t len = 0;
    double *packed = weft_rl_exchange_batch(j->x, NULL, &len);
    weft_rl_batch_unpack(packed, len, j->train, j->cfg.sampling.n, b);
    weft_free(packed);
    sm->sample_wait_seconds += weft_now_seconds() - t0;
}

// The trainer's part of a step: rewards, advantages, old log-probs, policy updates.
static void train_on_batch(rl_job *j, const weft_rl_batch *b, int step, weft_rl_step_metrics *sm) {
    const weft_job_config *c = &j->cfg;
    const weft_rl_batch_info *in = &b->info;
    int n = c->sampling.n, N = in->groups * n;
    sm->rollout_seconds = in->seconds, sm->rollout_tokens = in->tokens;
    sm->reward_seconds = in->reward_seconds;
    sm->rewards_while_generating = in->rewards_while_generating;
    sm->rollout = in->last, sm->rollout_weight_version = in->weight_version;
    sm->gen_rounds = in->rounds, sm->groups_dropped = in->dropped, sm->groups = in->groups;
    weft_backend_reset_peak(j->be);
    if (N > 0) {
        sample_statistics(b->samples, b->rewards, N, sm);
        weft_document *docs = weft_alloc(sizeof *docs * N);
        for (int i = 0; i < N; i++)
            docs[i] = sample_document(b->prompts[i / n], &b->samples[i],
                                      c->rl.tis_imp_ratio_cap > 0);
        old_logprobs(j, docs, N, b->samples, b->prompts, n, sm);
        if (j->ref) reference_logprobs(j, docs, N);
        double **kl = c->rl.use_kl_in_reward ? weft_alloc(sizeof(double *) * N) : NULL;
        double coef = kl ? reward_kl(j, docs, b->prompts, b->samples, N, kl, sm) : 0.0;
        double *adv = c->rl.adv_estimator == WEFT_ADV_REINFORCE_PP
                          ? NULL : weft_alloc(sizeof(double) * N);
        assign_advantages(j, docs, b, N, kl, coef, adv);
        if (c->rl.save_rollouts) save_rollouts(j, step, b, adv, kl, docs);
        trainer_wake(j);
        policy_updates(j, docs, N, sm);
        free_documents(docs, N);
        for (int i = 0; kl && i < N; i++) weft_free(kl[i]);
        weft_free(adv), weft_free(kl);
    } else {
        trainer_wake(j);
    }
    sm->training_peak_bytes = (double)j->be->peak_bytes;
}

// After a trainer's update (rl.rollout_ranks): one step off policy, the next batch, which the
// rollout ranks generated meanwhile with older weights, is taken first; then the new weights go
// to the rollout ranks if a batch still to come is generated with them.
static void after_update(rl_job *j, int step, weft_rl_batch *next, weft_rl_step_metrics *sm) {
    int last = j->cfg.train.steps, lag = j->cfg.rl.one_step_off_policy;
    if (lag && step + 1 <= last) receive_batch(j, next, sm);
    if (step + 1 + lag <= last) weft_rl_exchange_weights(j->x, j->m);
}

// A rank that only generates (rl.rollout_ranks): batch b with the weights of step
// max(start, b - 1 - lag), received from trainer 0 as they are needed, each batch sent to the
// trainers, in the order after_update takes them.
static void generate_for_trainers(rl_job *j, const weft_train_state *start) {
    const weft_job_config *c = &j->cfg;
    int lag = c->rl.one_step_off_policy, version = start->step, n = c->sampling.n;
    weft_data_order order;
    weft_data_order_start(&order, j->train->n, start->seed, start->epoch, start->cursor);
    for (int step = start->step + 1; step <= c->train.steps; step++) {
        int need = step - 1 - lag > start->step ? step - 1 - lag : start->step;
        if (need > version) weft_rl_exchange_weights(j->x, j->m), version = need;
        weft_rl_generator g = {c, j->m, j->group, j->tok, j->reward, j->train, version,
                               weft_comm_rank(j->group) == 0};
        weft_rl_batch b;
        weft_rl_batch_generate(&g, &order, step, &b);
        size_t len;
        double *packed = weft_rl_batch_pack(&b, j->train, n, &len);
        weft_rl_exchange_batch(j->x, packed, &len);
        weft_free(packed);
        weft_rl_batch_free(&b, n);
    }
    weft_data_order_free(&order);
}

// One RL step on a trainer: the batch (generated here, or the rollout ranks'), then training on
// it; *trained gets where the prompt order stood after it.
static weft_rl_step_metrics rl_step(rl_job *j, weft_data_order *order, int step,
                                    weft_rl_batch *next, weft_rl_batch_info *trained) {
    double t0 = weft_now_seconds();
    double before = (double)j->be->bytes_in_use;
    weft_rl_step_metrics sm = {.eval.total.accuracy = -1, .reward_kl = -1, .reward_kl_coef = -1,
                               .bytes_before_rollout = before, .rollout_peak_bytes = before,
                               .bytes_after_sleep = before};
    weft_rl_batch b;
    if (!j->x) {
        generate_here(j, order, step, &b, &sm);
    } else {
        if (!next->samples) receive_batch(j, next, &sm);
        b = *next, *next = (weft_rl_batch){0};
    }
    train_on_batch(j, &b, step, &sm);
    *trained = b.info;
    weft_rl_batch_free(&b, j->cfg.sampling.n);
    if (j->x) after_update(j, step, next, &sm);
    sm.step_seconds = weft_now_seconds() - t0;
    return sm;
}

static FILE *open_metrics_file(const rl_job *j, int step) {
    const char *dir = j->cfg.train.output_dir;
    WEFT_CHECK(weft_mkdirs(dir) && access(dir, W_OK) == 0, "train.output_dir=%s: cannot create "
               "or write there (%s)", dir, strerror(errno));
    if (!j->writer) return NULL;
    char path[WEFT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    weft_job_config_save_yaml(&j->cfg, path);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    return weft_metrics_open(path, step);
}

// -------------------------------------------------------------------------------- the job ----

// The layout, when some ranks only generate ("" otherwise).
static const char *layout_note(const rl_job *j, char *note, size_t size) {
    if (!j->x) return "";
    int T = weft_rl_exchange_trainers(j->x);
    snprintf(note, size, ": %d training, %d generating%s", T, weft_comm_size(j->world) - T,
             j->cfg.rl.one_step_off_policy ? ", one step off policy" : "");
    return note;
}

static bool due(int step, int every, int last) { return every > 0 && (step % every == 0 || step == last); }

int weft_rl_run(const weft_job_config *cfg_in, weft_session *session, const char *stats_path) {
    weft_job_config cfg = *cfg_in;
    weft_job_config_validate(&cfg);
    check_settings(&cfg); // before any work, the SFT job included
    if (!cfg.model.path[0]) sft_start(&cfg, session);
    rl_job j;
    job_open(&j, &cfg, session);
    weft_train_state state = {.seed = (uint64_t)cfg.train.seed};
    char *ckpt = NULL;
    if (cfg.resume[0] && j.t) {
        ckpt = weft_checkpoint_find(cfg.resume);
        state = weft_checkpoint_load(ckpt, j.t);
        if (state.has_kl_coef && cfg.rl.use_kl_in_reward && cfg.rl.kl_ctrl == WEFT_KL_CTRL_ADAPTIVE)
            j.kl_coef = state.kl_coef;
        if (j.writer) printf("resumed from %s at step %d\n", ckpt, state.step);
    }
    if (j.x) { // the rollout ranks start where trainer 0 does, with its weights
        weft_rl_exchange_share(j.x, &state, sizeof state);
        weft_rl_exchange_weights(j.x, j.m);
    }
    if (weft_run_is_finished(&cfg, state.step, j.writer)) {
        weft_free(ckpt);
        job_close(&j);
        return 0;
    }
    if (weft_rl_exchange_generates(j.x)) {
        generate_for_trainers(&j, &state);
        job_close(&j);
        return 0;
    }
    j.metrics = open_metrics_file(&j, state.step);
    char note[160];
    if (j.writer)
        printf("weft rl: %s, %d steps of %d prompts x %d samples, %d training problems, %d "
               "held-out, %d rank(s)%s\n", cfg.model.path, cfg.train.steps,
               cfg.train.global_batch_size, cfg.sampling.n, j.train->n, j.eval->n,
               weft_comm_size(j.world), layout_note(&j, note, sizeof note));
    weft_rl_eval start = {.total.accuracy = -1};
    if (cfg.rl.eval_every > 0) start = evaluate(&j);
    weft_rl_eval latest = start;
    char text[2][80];
    if (j.writer && start.total.accuracy >= 0)
        printf("%s\n", weft_rl_describe_eval(text[0], sizeof text[0],
                                             "held-out accuracy at the start: ", &start));
    weft_data_order order;
    weft_data_order_start(&order, j.train->n, state.seed, state.epoch, state.cursor);
    weft_rl_step_metrics last = {0};
    weft_rl_batch next = {0}; // disaggregated: a batch received ahead (one step off policy)
    for (int step = state.step + 1; step <= cfg.train.steps; step++) {
        weft_rl_batch_info trained;
        weft_rl_step_metrics sm = rl_step(&j, &order, step, &next, &trained);
        last = sm;
        if (due(step, cfg.rl.eval_every, cfg.train.steps)) latest = sm.eval = evaluate(&j);
        if (j.writer) {
            weft_rl_write_metrics(j.metrics, step, &sm);
            weft_rl_print_step(step, cfg.train.steps, &sm, j.x);
        }
        state.step = step, state.epoch = trained.epoch, state.cursor = trained.cursor;
        state.has_kl_coef = cfg.rl.use_kl_in_reward && cfg.rl.kl_ctrl == WEFT_KL_CTRL_ADAPTIVE;
        state.kl_coef = j.kl_coef;
        if (due(step, cfg.train.save_every, cfg.train.steps))
            weft_free(weft_checkpoint_save(cfg.train.output_dir, j.t, &state));
    }
    if (j.writer && last.step_seconds > 0) weft_rl_print_memory(&last, j.x);
    if (j.writer && start.total.accuracy >= 0)
        printf("done: %s ->%s; metrics.jsonl and checkpoints in %s\n",
               weft_rl_describe_eval(text[0], sizeof text[0], "held-out accuracy ", &start),
               weft_rl_describe_eval(text[1], sizeof text[1], " ", &latest), cfg.train.output_dir);
    weft_rl_save_stats(j.writer ? stats_path : NULL, &start, &latest, cfg.train.steps);
    weft_data_order_free(&order);
    weft_free(ckpt);
    job_close(&j);
    return 0;
}
