// rollout (private): what the engine's files share: the sequences and the engine's state
// (engine.c schedules, step.c runs one forward and draws the tokens).
#pragma once
#include "model/batch.h"
#include "rollout/engine.h"

typedef enum { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE } seq_state;

// A prompt's prefill (sample -1, done once its samples are forked) or one of its samples.
typedef struct gen_seq {
    int prompt, sample;         // the random streams' counters
    int32_t *tokens;            // (len) the prompt, then the tokens drawn
    float *logprobs, *processed; // (len) of each drawn token (unused for the prompt's)
    int len, cap, prompt_len;
    int kv;                     // the KV cache's sequence, -1 while none
    int cached;                 // positions whose keys and values are in the cache
    seq_state state;
    long order;                 // arrival order: admission takes the oldest, preemption the newest
    weft_finish_reason finish;
} gen_seq;

// Device buffers of one step, grown as needed and kept.
typedef struct step_buffers {
    int rows_cap, seqs_cap, tables_cap, draws_cap, logits_cap;
    int32_t *slots, *q_pos, *cu_q, *tables; // (rows), (rows), (seqs + 1), (seqs * max_blocks)
    void *logits, *draw_logits;             // (head rows, V), (draws, V)
    int32_t *draw_rows, *draw_tokens;       // (draws)
    float *draw_logprobs;                   // (draws)
    float *host_logits;                     // (head rows, V) f32 on the host, for the draws
    size_t host_logits_cap;                 // floats
} step_buffers;

struct weft_engine {
    weft_model *model;
    weft_backend *be;
    weft_rollout_config rc;
    weft_sampling_config sc;
    const weft_tokenizer *tok;
    weft_kv_cache *cache;
    gen_seq *seqs;
    int n_seqs, seq_cap;
    long next_order, done_samples;
    weft_rollout_stats stats;
    void *sampling_scratch;
    weft_batch batch;
    step_buffers buf;
};

// engine.c
int weft_rollout_add_seq(weft_engine *e, gen_seq s);
// Makes room in the cache for positions [cached, cached + rows) of sequence i, preempting newer
// running sequences as needed; false (sequence i itself preempted) when even that is not enough.
bool weft_rollout_reserve_rows(weft_engine *e, int i, int rows);
// The prompt's samples from its prefilled sequence `parent`, sharing its blocks; returns the
// first sample's index (the n samples are consecutive).
int weft_rollout_fork_samples(weft_engine *e, int parent);
// After a sample's token is appended: done (its blocks freed at once) or on to the next.
void weft_rollout_after_token(weft_engine *e, int i);

// step.c
// One forward over the running sequences and the tokens drawn from it; false if none ran.
bool weft_rollout_step(weft_engine *e);
void weft_rollout_step_buffers_free(weft_engine *e);
