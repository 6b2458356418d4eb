// Checkpoints: <run>/checkpoints/step_NNNNNNNN/, a complete Hugging Face model directory:
// config.json (the loaded model's, with only what training changed updated; complete for a model
// built from scratch), the weights (model.safetensors, or model-0000k-of-0000N.safetensors shards
// of at most train.save_shard_mb with model.safetensors.index.json), the model directory's
// tokenizer and generation files (data.tokenizer's as tokenizer.json), optimizer.safetensors
// (AdamW moments by parameter name) and trainer_state.json (step, data position, and every other
// file's size and hash). A checkpoint is written in a temporary directory and renamed into place,
// and trainer_state.json, written last, is its completion record: a crash mid-save leaves the
// previous checkpoint as the latest valid one.
#pragma once
#include "train/step.h"

typedef struct weft_train_state {
    int step;              // steps of the job's loop taken
    int optimizer_steps;   // AdamW updates taken (an RL step takes several; read back as step
                           // from checkpoints that predate the field)
    int epoch;             // data epoch
    long cursor;           // next document of the epoch's permutation
    uint64_t seed;
    // weft rl's adaptive KL-in-reward coefficient, saved where has_kl_coef (rl.kl_ctrl=adaptive).
    bool has_kl_coef;
    double kl_coef;
} weft_train_state;

// Saves atomically; returns the checkpoint directory's path (weft_alloc'd).
char *weft_checkpoint_save(const char *run_dir, const weft_trainer *t, const weft_train_state *s);
// Finds the newest valid checkpoint under `path` (a run directory, or a checkpoint directory
// itself), warning about and skipping incomplete ones; fatal if there is none.
char *weft_checkpoint_find(const char *path);
// Loads a checkpoint into the trainer (model weights and optimizer state) after checking that it
// was saved for this model shape; returns its state.
weft_train_state weft_checkpoint_load(const char *ckpt_dir, weft_trainer *t);
// Reads a trainer_state.json (step, optimizer_steps, epoch, cursor, seed, kl_coef); a missing or
// out-of-range field is fatal, but for optimizer_steps, which older checkpoints lack, and kl_coef,
// which only adaptive RL runs save.
weft_train_state weft_checkpoint_read_state(const char *path);
