#include "rl/report.h"

#include <jansson.h>
#include <stdlib.h>

#include "train/stats.h"

// ", \"eval_accuracy<suffix>\": x" and pass@k's keys likewise; suffix "" or "/<source>".
static void write_scores(FILE *f, const weft_rl_eval *e, const weft_rl_eval_scores *s,
                         const char *suffix) {
    json_t *key = json_sprintf("eval_accuracy%s", suffix);
    char *text = json_dumps(key, JSON_ENCODE_ANY);
    fprintf(f, ", %s: %.9g", text, s->accuracy);
    free(text), json_decref(key);
    for (int i = 0; i < e->n_k; i++) {
        key = json_sprintf("eval_pass_at_%d%s", e->k[i], suffix);
        text = json_dumps(key, JSON_ENCODE_ANY);
        fprintf(f, ", %s: %.9g", text, s->pass_at_k[i]);
        free(text), json_decref(key);
    }
}

// The held-out metrics, all problems' and each data source's (keys ".../<source>").
static void write_eval(FILE *f, const weft_rl_eval *e) {
    write_scores(f, e, &e->total, "");
    for (int g = 0; g < e->n_sources; g++) {
        char suffix[80];
        snprintf(suffix, sizeof suffix, "/%s", e->source[g]);
        write_scores(f, e, &e->by_source[g], suffix);
    }
}

void weft_rl_write_metrics(FILE *f, int step, const weft_rl_step_metrics *m) {
    const weft_rl_metrics *l = &m->loss;
    fprintf(f, "{\"step\": %d, \"reward_mean\": %.9g, \"reward_std\": %.9g, \"accuracy\": %.9g, "
            "\"response_length_mean\": %.6g, \"response_length_max\": %.0f, "
            "\"response_clip_frac\": %.6g, \"loss\": %.9g, \"pg_loss\": %.9g, "
            "\"pg_clipfrac\": %.6g, \"pg_clipfrac_lower\": %.6g, \"ppo_kl\": %.9g, "
            "\"tis_weight\": %.9g, \"tis_capped\": %.6g, "
            "\"kl_loss\": %.9g, \"entropy\": %.9g, \"grad_norm\": %.9g, \"lr\": %.6g, "
            "\"kv_bytes_freed\": %.0f, \"rollout_seconds\": %.4f, \"rollout_tokens\": %.0f, "
            "\"rollout_tokens_per_s\": %.1f, \"old_logprob_seconds\": %.4f, "
            "\"update_seconds\": %.4f, \"step_seconds\": %.4f, \"weight_version\": %d, "
            "\"gen_rounds\": %d, \"groups\": %d, \"groups_dropped\": %d, "
            "\"before_rollout_bytes\": %.0f, \"rollout_peak_bytes\": %.0f, "
            "\"after_sleep_bytes\": %.0f, \"training_peak_bytes\": %.0f, "
            "\"offloaded_bytes\": %.0f, \"rollout_prefix_hits\": %ld, \"reward_seconds\": %.4f, "
            "\"rewards_while_generating\": %.0f, \"rollout_weight_version\": %d, "
            "\"sample_wait_seconds\": %.4f",
            step, m->reward_mean, m->reward_std, m->accuracy, m->length_mean, m->length_max,
            m->clip_frac, l->loss, l->pg_loss, l->pg_clipfrac, l->pg_clipfrac_lower, l->ppo_kl,
            l->tis_weight, l->tis_capped,
            l->kl_loss, l->entropy, m->grad_norm, m->lr, m->rollout.pool_bytes, m->rollout_seconds,
            m->rollout_tokens,
            m->rollout_seconds > 0 ? m->rollout_tokens / m->rollout_seconds : 0.0,
            m->old_logprob_seconds, m->update_seconds, m->step_seconds, step, m->gen_rounds,
            m->groups, m->groups_dropped, m->bytes_before_rollout, m->rollout_peak_bytes,
            m->bytes_after_sleep, m->training_peak_bytes, m->offloaded_bytes,
            m->rollout.prefix_hits, m->reward_seconds, m->rewards_while_generating,
            m->rollout_weight_version, m->sample_wait_seconds);
    if (m->mismatch_max >= 0) // measured (rl.recompute_old_logprobs)
        fprintf(f, ", \"mismatch_max\": %.9g, \"mismatch_mean\": %.9g, \"mismatch_k3\": %.9g",
                m->mismatch_max, m->mismatch_mean, m->mismatch_k3);
    if (m->eval.total.accuracy >= 0) write_eval(f, &m->eval);
    if (m->reward_kl_coef >= 0)
        fprintf(f, ", \"reward_kl_penalty\": %.17g, \"reward_kl_penalty_coeff\": %.17g",
                m->reward_kl, m->reward_kl_coef);
    if (m->rollout.spec_depth > 0) {
        fprintf(f, ", \"spec_acceptance\": [");
        for (int j = 0; j < m->rollout.spec_depth; j++)
            fprintf(f, "%s%.6g", j ? ", " : "", m->rollout.spec_acceptance[j]);
        fprintf(f, "], \"spec_tokens_per_verify\": %.6g", m->rollout.spec_tokens_per_verify);
    }
    fprintf(f, "}\n");
    fflush(f);
}

char *weft_rl_describe_eval(char *out, size_t size, const char *prefix, const weft_rl_eval *e) {
    int at = snprintf(out, size, "%s%.3f", prefix, e->total.accuracy);
    if (e->n_k > 0 && at > 0 && (size_t)at < size)
        snprintf(out + at, size - (size_t)at, " (pass@%d %.3f)", e->k[e->n_k - 1],
                 e->total.pass_at_k[e->n_k - 1]);
    return out;
}

void weft_rl_save_stats(const char *path, const weft_rl_eval *start, const weft_rl_eval *end,
                        int steps) {
    json_t *stats = json_pack("{s:f, s:f, s:i}", "eval_accuracy_start", start->total.accuracy,
                              "eval_accuracy_end", end->total.accuracy, "steps", steps);
    const weft_rl_eval *at[2] = {start, end};
    const char *names[2] = {"eval_pass_at_k_start", "eval_pass_at_k_end"};
    for (int i = 0; i < 2; i++) {
        if (at[i]->n_k == 0) continue;
        json_t *o = json_object();
        for (int j = 0; j < at[i]->n_k; j++) {
            char k[16];
            snprintf(k, sizeof k, "%d", at[i]->k[j]);
            json_object_set_new(o, k, json_real(at[i]->total.pass_at_k[j]));
        }
        json_object_set_new(stats, names[i], o);
    }
    weft_stats_save(stats, path);
}

void weft_rl_print_step(int step, int steps, const weft_rl_step_metrics *m, bool disaggregated) {
    char eval[80] = "", kl[64] = "", mismatch[32] = "-", rollout[64];
    if (m->mismatch_max >= 0) snprintf(mismatch, sizeof mismatch, "%.2g", m->mismatch_max);
    if (m->eval.total.accuracy >= 0)
        weft_rl_describe_eval(eval, sizeof eval, "  held-out ", &m->eval);
    if (m->reward_kl_coef >= 0)
        snprintf(kl, sizeof kl, "  kl-in-reward %.3g x %.3g", m->reward_kl, m->reward_kl_coef);
    if (disaggregated) // the rollout ran on other ranks; what the trainers spent is their wait
        snprintf(rollout, sizeof rollout, "rollout %.1f of weights v%d, waited %.1f",
                 m->rollout_seconds, m->rollout_weight_version, m->sample_wait_seconds);
    else
        snprintf(rollout, sizeof rollout, "rollout %.1f", m->rollout_seconds);
    printf("step %d/%d  reward %.3f  acc %.3f%s  len %.1f  pg %.4f  clip %.3f  entropy %.3f%s  "
           "gnorm %.3f  mismatch %s  %.1fs (%s, logp %.1f, update %.1f)\n",
           step, steps, m->reward_mean, m->accuracy, eval, m->length_mean, m->loss.pg_loss,
           m->loss.pg_clipfrac, m->loss.entropy, kl, m->grad_norm, mismatch,
           m->step_seconds, rollout, m->old_logprob_seconds, m->update_seconds);
    fflush(stdout);
}

// The KV pool exists only in the rollout phase. Disaggregated, the pool is on the rollout ranks
// and the trainers hold their training state throughout.
void weft_rl_print_memory(const weft_rl_step_metrics *m, bool disaggregated) {
    char base[32], roll[32], pool[32], train[32], after[32], gone[32];
    weft_format_bytes(base, sizeof base, (size_t)m->bytes_before_rollout);
    weft_format_bytes(roll, sizeof roll, (size_t)m->rollout_peak_bytes);
    weft_format_bytes(pool, sizeof pool, (size_t)m->rollout.pool_bytes);
    weft_format_bytes(after, sizeof after, (size_t)m->bytes_after_sleep);
    weft_format_bytes(train, sizeof train, (size_t)m->training_peak_bytes);
    weft_format_bytes(gone, sizeof gone, (size_t)m->offloaded_bytes);
    if (disaggregated) {
        printf("memory (last step, measured): trainer ranks %s held between steps, training peak "
               "%s; rollout ranks' KV pool %s\n", base, train, pool);
        return;
    }
    printf("memory (last step, measured): %s held between steps; rollout peak %s with a KV pool "
           "of %s, freed at sleep (%s held after it)%s%s%s; training peak %s\n", base, roll, pool,
           after, m->offloaded_bytes > 0 ? ", optimizer state, gradients and activations (" : "",
           m->offloaded_bytes > 0 ? gone : "", m->offloaded_bytes > 0 ? ") offloaded" : "", train);
}

