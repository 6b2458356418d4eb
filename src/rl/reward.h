// rl: rewards for responses (DESIGN.md section 12). exact_match extracts the answer with a PCRE2
// pattern and compares it with the prompt's answer; command runs a long-lived process (one per
// rank) that reads one JSON request per line on stdin and answers one line {"reward": x}. A reward
// that cannot be computed (a crash, a timeout, a malformed answer, a missing answer field) is an
// error naming the prompt, never a silent 0.
#pragma once
#include "rl/config.h"

typedef struct weft_reward weft_reward;

// Checks the settings (the pattern compiles) and starts the command, before any work.
weft_reward *weft_reward_create(const weft_reward_config *cfg);
void weft_reward_free(weft_reward *r);
typedef struct weft_reward_input {
    const char *name;     // the prompt's, for errors
    const char *row;      // its JSON row (NULL: a built-in problem)
    const char *prompt;   // its text
    const char *answer;   // NULL: none (exact_match needs one)
    const char *response; // the text to score
} weft_reward_input;

// The reward of one response: 1 or 0 for exact_match; the command's number for command (the
// request is the prompt's row plus "response"). Any failure is an error naming the prompt.
double weft_reward_score(weft_reward *r, const weft_reward_input *in);
