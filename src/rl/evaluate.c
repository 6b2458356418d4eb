#include "rl/evaluate.h"

#include <string.h>

double weft_pass_at_k(int n, int c, int k) {
    if (n - c < k) return 1.0;
    double none = 1.0; // C(n - c, k) / C(n, k) as a product, free of huge binomials
    for (int i = n - c + 1; i <= n; i++) none *= 1.0 - (double)k / i;
    return 1.0 - none;
}

// mean@n and pass@k of the problems of `source` (NULL: every problem), rewarded[p] of problem
// p's n responses rewarded.
static weft_rl_eval_scores scores_of(const weft_rl_eval *r, const weft_rl_prompts *eval,
                                     const int *rewarded, int n, const char *source) {
    weft_rl_eval_scores out = {0};
    int problems = 0;
    for (int p = 0; p < eval->n; p++) {
        if (source && strcmp(eval->p[p].data_source, source) != 0) continue;
        problems++, out.accuracy += rewarded[p];
        for (int j = 0; j < r->n_k; j++)
            out.pass_at_k[j] += weft_pass_at_k(n, rewarded[p], r->k[j]);
    }
    if (problems == 0) return out;
    out.accuracy /= (double)problems * n;
    for (int j = 0; j < r->n_k; j++) out.pass_at_k[j] /= problems;
    return out;
}

// The problems' data sources in order of first appearance (none when no problem names one).
static void find_sources(weft_rl_eval *r, const weft_rl_prompts *eval) {
    bool named = false;
    for (int p = 0; p < eval->n; p++) named |= eval->p[p].data_source[0] != '\0';
    for (int p = 0; named && p < eval->n; p++) {
        const char *name = eval->p[p].data_source;
        int g = 0;
        while (g < r->n_sources && strcmp(r->source[g], name) != 0) g++;
        WEFT_CHECK(g < WEFT_EVAL_MAX_SOURCES, "%s: the held-out problems name more than %d "
                   "data sources (\"data_source\"); group them into fewer", eval->p[p].name,
                   WEFT_EVAL_MAX_SOURCES);
        if (g == r->n_sources) r->source[r->n_sources++] = name;
    }
}

weft_rl_eval weft_rl_evaluate(weft_model *m, weft_comm *comm, const weft_job_config *cfg,
                              const weft_tokenizer *tok, weft_reward *reward,
                              const weft_rl_prompts *eval) {
    weft_sampling_config sc = cfg->sampling;
    int P = eval->n, n = cfg->rl.eval_n;
    sc.temperature = cfg->rl.eval_temperature, sc.n = n;
    sc.top_k = 0, sc.top_p = 1, sc.min_p = 0;
    const weft_rl_prompt **prompts = weft_alloc(sizeof *prompts * (P > 0 ? P : 1));
    for (int k = 0; k < P; k++) prompts[k] = &eval->p[k];
    weft_rl_sample *s = weft_alloc(sizeof *s * ((size_t)P * n + 1));
    weft_rl_rollout_request rq = {&cfg->rollout, &sc, tok, reward, prompts, P, 0,
                                  cfg->reward.overlap};
    weft_rl_rollout(m, comm, &rq, s);
    weft_rl_eval r = {0};
    if (n > 1)
        for (int k = 1; k < n && r.n_k < WEFT_EVAL_MAX_K - 1; k *= 2) r.k[r.n_k++] = k;
    if (n > 1) r.k[r.n_k++] = n;
    int *rewarded = weft_alloc(sizeof(int) * (P > 0 ? P : 1));
    for (int p = 0; p < P; p++) {
        rewarded[p] = 0;
        for (int i = 0; i < n; i++) rewarded[p] += s[(size_t)p * n + i].reward > 0;
    }
    r.total = scores_of(&r, eval, rewarded, n, NULL);
    find_sources(&r, eval);
    for (int g = 0; g < r.n_sources; g++)
        r.by_source[g] = scores_of(&r, eval, rewarded, n, r.source[g]);
    weft_free(rewarded);
    weft_rl_samples_free(s, P * n);
    weft_free(s), weft_free(prompts);
    return r;
}
