// rl: rewards for responses (DESIGN.md section 12). exact_match extracts the answer with a PCRE2
// pattern and compares it with the prompt's answer; command runs long-lived processes
// (reward.processes per rank, reward_command.h) that read one JSON request per line on stdin and
// answer one line {"reward": x} each. A reward that cannot be computed (a crash, a timeout, a
// malformed answer, a missing answer field) is an error naming the prompt, never a silent 0.
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

// Asks for the reward of one response, to be stored at *out: 1 or 0 for exact_match, at once;
// the command's number for command (the request is the prompt's row plus "response"), sent now
// and answered by the time weft_reward_collect returns. Requests are pipelined: the command may
// still be scoring earlier ones, and answers are read in the order the requests went out. Any
// failure is an error naming the prompt; `in`'s strings are copied or no longer read once this
// returns, except `name`, which must live until the reward is in.
void weft_reward_submit(weft_reward *r, const weft_reward_input *in, double *out);
// Returns once every reward asked for is stored, each answer within reward.timeout of the last.
void weft_reward_collect(weft_reward *r);
// Rewards asked for and not yet stored.
int weft_reward_pending(const weft_reward *r);
