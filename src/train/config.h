// The job's settings: one struct, set from defaults, a YAML file and key=value overrides, all
// through one registry of dotted keys.
#pragma once
#include "optim/adamw.h"

typedef struct weft_job_config {
    int micro_batches; // train.micro_batches: micro-batches per global batch
    bool recompute;    // train.recompute: recompute each block's activations in backward
    int steps;         // train.steps: optimizer steps
    weft_optim_config optim;
} weft_job_config;

weft_job_config weft_job_config_default(void);
// Sets `key` from its text form; unknown keys and bad values are fatal errors that name the key
// (and suggest the closest known key). `source` says where the setting came from.
void weft_job_config_set(weft_job_config *cfg, const char *key, const char *value,
                         const char *source);
// Applies "key=value" arguments.
void weft_job_config_apply_overrides(weft_job_config *cfg, int argc, char **argv);
// Cross-field checks, run once after every setting is in.
void weft_job_config_validate(const weft_job_config *cfg);
