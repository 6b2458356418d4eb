// rl: the prompts an RL job trains on and is evaluated on, each with the answer its reward
// compares against. The built-in task (data.source=synthetic) is the default SFT job's addition,
// harder: rl.min_terms to rl.max_terms terms; a JSONL file holds {"prompt": ..., "answer": ...}
// rows (answer a string or a number; it may be left out for reward.type=command; an optional
// "data_source" string, as verl's data has, groups the held-out metrics).
#pragma once
#include "data/tokenizer.h"
#include "train/config.h"

typedef struct weft_rl_prompt {
    int32_t *tokens;
    int len;
    char *text;   // the prompt as given
    char *answer; // NULL: none
    char *row;    // the JSON row (compact), for reward commands; NULL for the built-in task
    char name[64]; // "FILE:LINE" or "synthetic problem N", for errors
    char data_source[64]; // the row's "data_source" ("" without): held-out metrics per source
} weft_rl_prompt;

typedef struct weft_rl_prompts {
    weft_rl_prompt *p;
    int n;
} weft_rl_prompts;

// The training prompts (held_out false) or the held-out evaluation ones: for the built-in task a
// disjoint random stream of rl.eval_prompts problems, for a file rl.eval_prompts rows set aside
// from its end.
weft_rl_prompts *weft_rl_prompts_load(const weft_job_config *cfg, const weft_tokenizer *tok,
                                      bool held_out);
void weft_rl_prompts_free(weft_rl_prompts *p);
