// rl: the reward command (reward.type=command; DESIGN.md section 12), for reward.c. reward.processes
// long-lived processes per rank, each reading one JSON request per line on stdin and answering
// one line {"reward": x} per request, in request order. Requests are pipelined: each goes to the
// process with the fewest unanswered, written without blocking, and answers are read as they
// come. A crash, a timeout or a malformed answer is one error naming the prompt owed first, after
// every process has been ended.
#pragma once
#include "rl/config.h"

typedef struct weft_reward_command weft_reward_command;

// Starts the processes (the settings checked first).
weft_reward_command *weft_reward_command_start(const weft_reward_config *cfg);
// Ends them: each gets EOF on stdin and a moment to exit, then SIGKILL to its process group.
void weft_reward_command_stop(weft_reward_command *c);
// Sends `request` (one JSON line, '\n' included): its answer goes to *out; `name` (the prompt's,
// for errors) must live until then.
void weft_reward_command_send(weft_reward_command *c, const char *request, size_t len,
                              double *out, const char *name);
// Returns once every request sent is answered, each answer within reward.timeout of the last.
void weft_reward_command_collect(weft_reward_command *c);
// Requests sent and not yet answered.
int weft_reward_command_pending(const weft_reward_command *c);
