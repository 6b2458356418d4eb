#include "rl/evaluate.h"

#include <string.h>

double weft_pass_at_k(int n, int c, int k) {
    if (n - c < k) return 1.0;
    double none = 1.0; // C(n - c, k) / C(n, k) as a product, free of huge binomials
    for (int i = n - c + 1; i <= n; i++) none *= 1.0 - (double)k / i;
    return 1.0 - none;
}

// The sources of the problems (r->source, in order of first appearance) and each one's scores.
static void per_source(weft_rl_eval *r, const weft_rl_prompts *eval, const weft_rl_sample *s,
                       int n) {
    bool named = false;
    for (int p = 0; p < eval->n; p++) named |= eval->p[p].data_source[0] != '\0';
    if (!named) return;
    int problems[WEFT_EVAL_MAX_SOURCES] = {0};
    for (int p = 0; p < eval->n; p++) {
        const char *name = eval->p[p].data_source;
        int g = 0;
        while (g < r->n_sources && strcmp(r->source[g], name) != 0) g++;
        WEFT_CHECK(g < WEFT_EVAL_MAX_SOURCES, "%s: the held-out problems name more than %d "
                   "data sources (\"data_source\"); group them into fewer", eval->p[p].name,
                   WEFT_EVAL_MAX_SOURCES);
        if (g == r->n_sources) r->source[r->n_sources++] = name;
        int c = 0;
        for (int i = 0; i < n; i++) c += s[(size_t)p * n + i].reward > 0;
        weft_rl_eval_scores *e = &r->by_source[g];
        e->accuracy += c;
        for (int j = 0; j < r->n_k; j++) e->pass_at_k[j] += weft_pass_at_k(n, c, r->k[j]);
        problems[g]++;
    }
    for (int g = 0; g < r->n_sources; g++) {
        r->by_source[g].accuracy /= (double)problems[g] * n;
        for (int j = 0; j < r->n_k; j++) r->by_source[g].pass_at_k[j] /= problems[g];
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
    double correct = 0;
    for (int p = 0; p < P; p++) {
        int c = 0;
        for (int i = 0; i < n; i++) c += s[(size_t)p * n + i].reward > 0;
        correct += c;
        for (int j = 0; j < r.n_k; j++) r.pass_at_k[j] += weft_pass_at_k(n, c, r.k[j]) / P;
    }
    r.accuracy = P > 0 ? correct / ((double)P * n) : 0.0;
    per_source(&r, eval, s, n);
    weft_rl_samples_free(s, P * n);
    weft_free(s), weft_free(prompts);
    return r;
}
