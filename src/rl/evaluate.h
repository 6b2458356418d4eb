// rl: held-out evaluation. Every held-out problem gets rl.eval_n responses (greedy at
// rl.eval_temperature 0, the default; sampled otherwise, from the streams of the problem's index,
// so each evaluation draws with the same random numbers); the job reports the share rewarded
// (mean@n; with one greedy response, the accuracy) and, for n > 1, pass@k at k = 1, 2, 4, ... and
// n: the chance that k of the n responses hold a rewarded one, by Chen et al. (2021)'s unbiased
// estimator, averaged over the problems. When the problems carry a "data_source", each source's
// too (verl's val-core/<source>/...).
#pragma once
#include "rl/rollout.h"
#include "rl/task.h"
#include "train/config.h"

enum { WEFT_EVAL_MAX_K = 12, WEFT_EVAL_MAX_SOURCES = 16 };

// mean@n and pass@k of a set of problems.
typedef struct weft_rl_eval_scores {
    double accuracy;
    double pass_at_k[WEFT_EVAL_MAX_K];
} weft_rl_eval_scores;

typedef struct weft_rl_eval {
    int n_k; // pass@k reported for k[0..n_k) (none when rl.eval_n is 1)
    int k[WEFT_EVAL_MAX_K];
    weft_rl_eval_scores total; // every problem's
    // Per data source, in order of first appearance (none when no problem names one; a problem
    // without one counts under ""): the sources' names point into the held-out prompts.
    int n_sources;
    const char *source[WEFT_EVAL_MAX_SOURCES];
    weft_rl_eval_scores by_source[WEFT_EVAL_MAX_SOURCES];
} weft_rl_eval;

// Collective over comm (the ranks that generate), which leave with the same result.
weft_rl_eval weft_rl_evaluate(weft_model *m, weft_comm *comm, const weft_job_config *cfg,
                              const weft_tokenizer *tok, weft_reward *reward,
                              const weft_rl_prompts *eval);
// 1 - C(n - c, k) / C(n, k): some of k responses drawn without replacement from n, of which c are
// rewarded, is rewarded.
double weft_pass_at_k(int n, int c, int k);
