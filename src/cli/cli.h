// cli: the `weft` command. Each verb parses its arguments here and calls train/ (or parallel/'s
// planner, or data/'s tokenizer) to do the work.
#pragma once
#include <stdbool.h>

#include "train/session.h"

// A verb's own option: "--name" alone sets *flag, "--name VALUE" sets *value.
typedef struct weft_cli_option {
    const char *name;
    const char **value; // NULL for a flag
    bool *flag;
} weft_cli_option;

// What every verb that runs a job accepts: --config FILE.yaml, --stats FILE.json and key=value
// settings, besides its own options.
typedef struct weft_cli_args {
    const char *config, *stats;
    int n_settings;
    char **settings; // points into argv
} weft_cli_args;

// Parses argv (the verb's arguments) against opts (terminated by a {NULL} entry); anything else
// starting with "-" is an error naming the verb. The files --out and --stats name are made
// writable (their directories created) or refused before any work, by the session's writer (the
// rank that writes them); session may be NULL for a verb without one.
weft_cli_args weft_cli_parse(const char *verb, int argc, char **argv, const weft_cli_option *opts,
                             const weft_session *session);

int weft_cmd_grad(int argc, char **argv, weft_session *session);
int weft_cmd_train(int argc, char **argv, weft_session *session);
int weft_cmd_calibrate(int argc, char **argv, weft_session *session);
int weft_cmd_generate(int argc, char **argv, weft_session *session);
int weft_cmd_rl(int argc, char **argv, weft_session *session);
int weft_cmd_tokenize(int argc, char **argv);
int weft_cmd_plot(int argc, char **argv);
int weft_cmd_plan(int argc, char **argv);
