#include "rl/objective.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum {
    SUM_PG, SUM_KL, SUM_ENTROPY, SUM_CLIPPED, SUM_DUAL_CLIPPED, SUM_PPO_KL, SUM_TIS, SUM_TIS_CAPPED,
    N_SUMS
};

struct weft_rl_objective {
    weft_rl_config cfg;
    char source[256];
    weft_token_objective hooks;
    const weft_document *docs; // the pass's rows
    double *weight;     // (n_docs) a target's weight in the aggregate: 1/N, 1/(G n_i), 1/G, ...
    double *seq_log_ratio; // (n_docs) GSPO: mean over the sequence's targets of logp - old_logp;
                           // GMPO: of those log-ratios clipped against their advantage's sign
    double *seq_advantage; // (n_docs) GMPO: the mean advantage of the sequence's targets
    int n_docs;
    long n_targets, n_sequences;
    double sums[N_SUMS]; // this rank's rows, weighted (aggregates) or counted (token means)
    weft_rl_metrics last;
};

// ------------------------------------------------------------------------ per-token math ----

typedef struct token_loss {
    double value, d_logprob; // the per-token objective before aggregation, and its derivative
    double pg, kl;
    double tis; // the truncated importance weight (1 without)
    bool clipped, dual_clipped, tis_capped;
} token_loss;

// The clipped surrogate, given the ratio and its derivative with respect to logp: the larger of
// -A r and -A clip(r) (the second's derivative is 0 exactly when it is the larger), then for
// negative advantages with a dual clip at most -A c.
static void policy_term(const weft_rl_config *c, double A, double ratio, double d_ratio,
                        token_loss *out) {
    double clipped = fmin(fmax(ratio, 1 - c->clip_ratio_low), 1 + c->clip_ratio_high);
    double pg1 = -A * ratio, pg2 = -A * clipped;
    out->clipped = pg2 > pg1;
    out->pg = out->clipped ? pg2 : pg1;
    out->d_logprob = out->clipped ? 0.0 : -A * d_ratio;
    bool dual = c->policy_loss == WEFT_POLICY_LOSS_PPO && c->clip_ratio_c > 1 && A < 0;
    out->dual_clipped = dual && out->pg > -A * c->clip_ratio_c;
    if (out->dual_clipped) out->pg = -A * c->clip_ratio_c, out->d_logprob = 0.0;
}

// CISPO (MiniMax-M1, 2025): the ratio clipped and held constant weighs the token's log-prob,
// -sg(clip(r)) A logp, so a token outside the range still has a gradient (PPO's would be 0).
static void cispo_term(const weft_rl_config *c, double A, double ratio, double logp,
                       token_loss *out) {
    double w = fmin(fmax(ratio, 1 - c->clip_ratio_low), 1 + c->clip_ratio_high);
    out->clipped = w != ratio;
    out->pg = -w * A * logp;
    out->d_logprob = -w * A;
}

double weft_rl_kl(int type, double logp, double ref, double *d_logp) {
    double diff = logp - ref, d;
    double kl;
    switch (type) {
    case WEFT_KL_K1: d = 1.0, kl = diff; break;
    case WEFT_KL_K2: d = diff, kl = 0.5 * diff * diff; break;
    default: { // k3: exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10] (it is >= 0)
        double k3 = exp(-diff) + diff - 1;
        d = k3 > 10 ? 0.0 : 1.0 - exp(-diff);
        kl = k3 > 10 ? 10.0 : k3;
    }
    }
    if (d_logp) *d_logp = d;
    return kl;
}

// GMPO's log-ratio of one token: clamped to [-low, high] in the direction that lowers the
// objective for its advantage's sign (sgn(A) min(sgn(A) x, sgn(A) clamp(x))), 0 when A is 0;
// *free: whether the value moves with logp (not clamped, A not 0).
static double gmpo_log_ratio(const weft_rl_config *c, double A, double x, bool *free) {
    double clamped = fmin(fmax(x, -c->clip_ratio_low), c->clip_ratio_high);
    double chosen = A > 0 ? fmin(x, clamped) : A < 0 ? fmax(x, clamped) : 0.0;
    *free = A != 0 && chosen == x;
    return chosen;
}

// GMPO (Zhao et al., 2025), as verl's geo_mean: the sequence's ratio is the geometric mean of its
// clipped token ratios, exp(mean of gmpo_log_ratio), at most e^20, times the sequence's mean
// advantage: every target carries -A_i r_i, and its log-prob's derivative is -A_i r_i where
// its log-ratio is free (the aggregation's weight then spreads it as the mean's 1/n_i would).
static void gmpo_term(const weft_rl_objective *o, int doc, double A, double x, token_loss *out) {
    double log_ratio = o->seq_log_ratio[doc];
    double ratio = exp(fmin(log_ratio, 20.0));
    bool free;
    gmpo_log_ratio(&o->cfg, A, x, &free);
    out->pg = -o->seq_advantage[doc] * ratio;
    out->d_logprob = free && log_ratio < 20 ? out->pg : 0.0;
    out->clipped = A != 0 && !free;
}

static token_loss token_objective(const weft_rl_objective *o, int doc, int t, double logp) {
    const weft_rl_config *c = &o->cfg;
    const weft_document *d = &o->docs[doc];
    double A = d->advantages[t], ratio, d_ratio;
    if (c->policy_loss == WEFT_POLICY_LOSS_GSPO) {
        // The sequence's ratio s_i as the value, the token's own ratio in the gradient (GSPO's
        // straight-through form): log r = logp - sg(logp) + sg(mean log ratio), at most 10.
        double log_ratio = o->seq_log_ratio[doc];
        ratio = exp(fmin(log_ratio, 10.0));
        d_ratio = log_ratio < 10 ? ratio : 0.0;
    } else {
        double log_ratio = logp - d->old_logprobs[t];
        ratio = exp(fmin(fmax(log_ratio, -20.0), 20.0));
        d_ratio = fabs(log_ratio) <= 20 ? ratio : 0.0;
    }
    token_loss l = {.tis = 1.0};
    if (c->policy_loss == WEFT_POLICY_LOSS_CISPO) cispo_term(c, A, ratio, logp, &l);
    else if (c->policy_loss == WEFT_POLICY_LOSS_GEO_MEAN)
        gmpo_term(o, doc, A, logp - d->old_logprobs[t], &l);
    else policy_term(c, A, ratio, d_ratio, &l);
    if (c->tis_imp_ratio_cap > 0) {
        // The rollout sampled from its own log-probs, not quite old's: a constant weight per
        // token, capped, with no gradient through it.
        double w = exp(d->old_logprobs[t] - d->rollout_logprobs[t]);
        l.tis_capped = !(w < c->tis_imp_ratio_cap);
        l.tis = l.tis_capped ? c->tis_imp_ratio_cap : w;
        l.pg *= l.tis, l.d_logprob *= l.tis;
    }
    l.value = l.pg;
    if (c->kl_loss_coef != 0) {
        double d_kl;
        l.kl = weft_rl_kl(c->kl_loss_type, logp, d->ref_logprobs[t], &d_kl);
        l.value += c->kl_loss_coef * l.kl;
        l.d_logprob += c->kl_loss_coef * d_kl;
    }
    return l;
}

// -------------------------------------------------------------------------------- hooks ----

static void rl_weights(void *ctx, const weft_token_rows *rows, float *d_logprob,
                       float *d_entropy) {
    weft_rl_objective *o = ctx;
    for (int r = 0; r < rows->n; r++) {
        d_logprob[r] = d_entropy[r] = 0.0f;
        int doc = rows->doc[r], t = rows->token[r];
        if (doc < 0) continue;
        double w = o->weight[doc], logp = rows->logprob[r];
        token_loss l = token_objective(o, doc, t, logp);
        d_logprob[r] = (float)(w * l.d_logprob);
        d_entropy[r] = (float)(-w * o->cfg.entropy_coeff);
        o->sums[SUM_PG] += w * l.pg;
        o->sums[SUM_KL] += w * l.kl;
        o->sums[SUM_ENTROPY] += w * rows->entropy[r];
        o->sums[SUM_CLIPPED] += l.clipped;
        o->sums[SUM_DUAL_CLIPPED] += l.dual_clipped;
        o->sums[SUM_PPO_KL] += o->docs[doc].old_logprobs[t] - logp;
        o->sums[SUM_TIS] += l.tis;
        o->sums[SUM_TIS_CAPPED] += l.tis_capped;
    }
}

static void check_rows(const weft_rl_objective *o, const weft_document *docs, int n_docs) {
    for (int i = 0; i < n_docs; i++) {
        const char *missing = !docs[i].advantages     ? "advantages"
                              : !docs[i].old_logprobs ? "old_logprobs"
                              : !docs[i].ref_logprobs && o->cfg.kl_loss_coef != 0
                                  ? "ref_logprobs"
                              : !docs[i].rollout_logprobs && o->cfg.tis_imp_ratio_cap > 0
                                  ? "rollout_logprobs"
                                  : NULL;
        if (missing)
            weft_fatal("%s: document %d has no \"%s\"; RL rows need \"advantages\" and "
                       "\"old_logprobs\" (and \"ref_logprobs\" when rl.kl_loss_coef is not 0, "
                       "\"rollout_logprobs\" when rl.tis_imp_ratio_cap is), one number per token",
                       o->source, i + 1, missing);
    }
}

static long targets_of(const weft_document *d) {
    long n = 0;
    for (int t = 1; t < d->len; t++) n += d->loss_mask ? d->loss_mask[t] != 0 : 1;
    return n;
}

static double sequence_weight(const weft_rl_objective *o, long n_i) {
    double G = (double)o->n_sequences;
    switch (o->cfg.loss_agg_mode) {
    case WEFT_AGG_TOKEN_MEAN: return 1.0 / (double)o->n_targets;
    case WEFT_AGG_SEQ_MEAN_TOKEN_MEAN: return n_i > 0 ? 1.0 / (G * (double)n_i) : 0.0;
    case WEFT_AGG_SEQ_MEAN_TOKEN_SUM: return 1.0 / G;
    default: return 1.0 / (G * o->cfg.loss_scale_factor);
    }
}

// GSPO's and GMPO's per-sequence mean log ratio (and GMPO's mean advantage) from the pass's
// current log-probs.
static void sequence_log_ratios(weft_rl_objective *o, const float *logprobs) {
    long offset = 0;
    bool gmpo = o->cfg.policy_loss == WEFT_POLICY_LOSS_GEO_MEAN;
    for (int i = 0; i < o->n_docs; i++) {
        const weft_document *d = &o->docs[i];
        double sum = 0, advantage = 0;
        bool free;
        long n = 0;
        for (int t = 1; t < d->len; t++) {
            if (d->loss_mask && !d->loss_mask[t]) continue;
            double x = (double)logprobs[offset + t] - d->old_logprobs[t];
            sum += gmpo ? gmpo_log_ratio(&o->cfg, d->advantages[t], x, &free) : x;
            advantage += d->advantages[t], n++;
        }
        o->seq_log_ratio[i] = n > 0 ? sum / (double)n : 0.0;
        o->seq_advantage[i] = n > 0 ? advantage / (double)n : 0.0;
        offset += d->len;
    }
}

static bool sequence_ratio(int policy_loss) {
    return policy_loss == WEFT_POLICY_LOSS_GSPO || policy_loss == WEFT_POLICY_LOSS_GEO_MEAN;
}

static void rl_begin(void *ctx, const weft_document *docs, int n_docs, const float *logprobs) {
    weft_rl_objective *o = ctx;
    check_rows(o, docs, n_docs);
    o->docs = docs, o->n_docs = n_docs;
    weft_free(o->weight), weft_free(o->seq_log_ratio), weft_free(o->seq_advantage);
    o->weight = weft_alloc(sizeof(double) * (n_docs > 0 ? n_docs : 1));
    o->seq_log_ratio = weft_alloc(sizeof(double) * (n_docs > 0 ? n_docs : 1));
    o->seq_advantage = weft_alloc(sizeof(double) * (n_docs > 0 ? n_docs : 1));
    long *n = weft_alloc(sizeof(long) * (n_docs > 0 ? n_docs : 1));
    o->n_targets = o->n_sequences = 0;
    for (int i = 0; i < n_docs; i++) {
        n[i] = targets_of(&docs[i]);
        o->n_targets += n[i], o->n_sequences += n[i] > 0;
    }
    for (int i = 0; i < n_docs; i++) o->weight[i] = sequence_weight(o, n[i]);
    weft_free(n);
    if (sequence_ratio(o->cfg.policy_loss)) sequence_log_ratios(o, logprobs);
    memset(o->sums, 0, sizeof o->sums);
}

static double rl_end(void *ctx, weft_comm *world) {
    weft_rl_objective *o = ctx;
    weft_comm_allreduce_sum(world, o->sums, N_SUMS, WEFT_COMM_F64);
    double N = o->n_targets > 0 ? (double)o->n_targets : 1.0;
    weft_rl_metrics *m = &o->last;
    m->pg_loss = o->sums[SUM_PG];
    m->kl_loss = o->sums[SUM_KL];
    m->entropy = o->sums[SUM_ENTROPY];
    m->pg_clipfrac = o->sums[SUM_CLIPPED] / N;
    m->pg_clipfrac_lower = o->sums[SUM_DUAL_CLIPPED] / N;
    m->ppo_kl = o->sums[SUM_PPO_KL] / N;
    m->tis_weight = o->sums[SUM_TIS] / N;
    m->tis_capped = o->sums[SUM_TIS_CAPPED] / N;
    m->loss = m->pg_loss + o->cfg.kl_loss_coef * m->kl_loss - o->cfg.entropy_coeff * m->entropy;
    m->n_targets = o->n_targets, m->n_sequences = o->n_sequences;
    return m->loss;
}

// ---------------------------------------------------------------------------- lifecycle ----

weft_rl_objective *weft_rl_objective_create(const weft_rl_config *cfg, double loss_scale_factor,
                                            const char *source) {
    weft_rl_config_validate(cfg);
    weft_rl_objective *o = weft_alloc(sizeof *o);
    o->cfg = *cfg;
    if (o->cfg.loss_scale_factor == 0) o->cfg.loss_scale_factor = loss_scale_factor;
    WEFT_CHECK(o->cfg.loss_scale_factor > 0, "rl.loss_scale_factor must be positive");
    snprintf(o->source, sizeof o->source, "%s", source);
    o->hooks = (weft_token_objective){.ctx = o, .entropy = true,
                                      .whole_logprobs = sequence_ratio(cfg->policy_loss),
                                      .begin = rl_begin, .weights = rl_weights, .end = rl_end};
    return o;
}

void weft_rl_objective_free(weft_rl_objective *o) {
    if (!o) return;
    weft_free(o->weight), weft_free(o->seq_log_ratio), weft_free(o->seq_advantage);
    weft_free(o);
}

const weft_token_objective *weft_rl_objective_hooks(weft_rl_objective *o) { return &o->hooks; }

weft_rl_metrics weft_rl_objective_metrics(const weft_rl_objective *o) { return o->last; }

json_t *weft_rl_metrics_json(const weft_rl_metrics *m) {
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I}", "loss", m->loss,
                     "pg_loss", m->pg_loss, "kl_loss", m->kl_loss, "entropy", m->entropy,
                     "pg_clipfrac", m->pg_clipfrac, "pg_clipfrac_lower", m->pg_clipfrac_lower,
                     "ppo_kl", m->ppo_kl, "tis_weight", m->tis_weight, "tis_capped",
                     m->tis_capped, "n_targets", (json_int_t)m->n_targets, "n_sequences",
                     (json_int_t)m->n_sequences);
}
