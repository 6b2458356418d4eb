// The job's settings: one struct, set from defaults, a YAML file and key=value overrides, all
// through one registry of dotted keys.
#pragma once
#include "model/config.h"
#include "optim/adamw.h"
#include "parallel/config.h"
#include "rl/config.h"
#include "rollout/config.h"

enum { WEFT_PATH_MAX = 1024 };

typedef struct weft_job_config {
    struct {
        char path[WEFT_PATH_MAX]; // model.path: Hugging Face directory; empty = from scratch
        // model.*: the architecture of a model built from scratch; vocab_size comes from the
        // tokenizer and head_dim 0 means hidden_size / num_heads.
        weft_model_config arch;
        // model.drop_tensors: checkpoint tensors the model does not use that loading may drop
        // (names separated by commas; brackets and quotes ignored). Any other is an error.
        char drop_tensors[4096];
    } model;
    struct {
        char source[WEFT_PATH_MAX];    // data.source: "synthetic" or a .jsonl file
        char tokenizer[WEFT_PATH_MAX]; // data.tokenizer: "" = byte-level, else tokenizer.json
        int synthetic_documents;       // data.synthetic_documents
        bool truncate;                 // data.truncate: cut documents to the micro-batch budget
    } data;
    struct {
        int steps, global_batch_size, max_tokens_per_microbatch, micro_batches;
        bool recompute;
        bool freeze_mtp; // train.freeze_mtp: MTP modules fixed, the main model trains
        int seed;
        char output_dir[WEFT_PATH_MAX];
        int save_every, log_every;
        double save_shard_mb; // train.save_shard_mb: weight files of at most this many MB (10^6 B)
    } train;
    weft_parallel_config parallel;
    weft_sampling_config sampling; // sampling.*: how generation draws tokens
    weft_rollout_config rollout;   // rollout.*: the generation engine
    weft_rl_config rl;             // rl.*: the RL objective and loop
    weft_reward_config reward;     // reward.*: how responses are scored
    int device;                 // device: a weft_device (cpu, cuda)
    double device_timeout;      // device_timeout: seconds a host wait for the GPU may take
    char resume[WEFT_PATH_MAX]; // resume: a run directory (or one of its checkpoints) to continue
    weft_optim_config optim;
} weft_job_config;

weft_job_config weft_job_config_default(void);
// Sets `key` from its text form; unknown keys and bad values are fatal errors that name the key
// (and suggest the closest known key). `source` says where the setting came from.
void weft_job_config_set(weft_job_config *cfg, const char *key, const char *value,
                         const char *source);
// Applies a YAML file of nested mappings (train: {steps: 10}) or dotted keys (train.steps: 10).
void weft_job_config_load_yaml(weft_job_config *cfg, const char *path);
// Applies "key=value" arguments.
void weft_job_config_apply_overrides(weft_job_config *cfg, int argc, char **argv);
// Cross-field checks, run once after every setting is in.
void weft_job_config_validate(const weft_job_config *cfg);
// The one way every verb settles its settings: on top of `cfg` (the defaults, or a verb's own),
// the YAML file at config_path (NULL: none), then the key=value overrides; then validation.
void weft_job_config_resolve(weft_job_config *cfg, const char *config_path, int n_overrides,
                             char **overrides);
// Writes every key with its value as YAML (the run's resolved config, for reproducibility).
bool weft_job_config_save_yaml(const weft_job_config *cfg, const char *path);
