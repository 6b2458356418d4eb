// rollout: the generation engine (DESIGN.md section 11). It generates with the trainer's own model,
// ops and parameter buffer, through a paged KV cache and continuous batching:
//  - every step runs one forward over all running sequences: each contributes the positions not
//    yet in the cache (a prompt's prefill, in chunks, or the one token sampled last), and the head
//    runs on the last row of those that are due a new token;
//  - the n samples of a prompt share its prefill and its blocks (copy on write of the last one);
//  - waiting sequences are admitted while blocks allow; when the pool runs out the newest running
//    sequences are preempted (their blocks freed) and recomputed later;
//  - tokens are drawn with randomness that depends only on (seed, prompt, sample, position), and
//    each token's log-prob is computed by the same op the trainer uses, so outputs do not depend
//    on batching, the pool or preemptions, and the log-probs equal the trainer's (bit for bit on
//    the CPU).
#pragma once
#include "data/tokenizer.h"
#include "model/model.h"
#include "rollout/config.h"
#include "rollout/kv_cache.h"

typedef enum { WEFT_FINISH_STOP, WEFT_FINISH_LENGTH } weft_finish_reason;

typedef struct weft_prompt {
    const int32_t *tokens;
    int len;
    int index; // the prompt's place in the whole input: the random streams' counter
} weft_prompt;

typedef struct weft_completion {
    int32_t *tokens;          // (len) generated token ids, the stopping token included
    float *logprobs;          // (len) under the model (temperature 1, no filter)
    float *processed_logprobs; // (len) under the processed distribution, when asked; else NULL
    int len;
    weft_finish_reason finish;
    char *text;               // decoded (cut before a stop string), when a tokenizer was given
} weft_completion;

typedef struct weft_rollout_stats {
    long tokens, forwards, preemptions;
    int peak_batch; // the most sequences one forward ran (continuous batching at work)
    double seconds;
    // Speculative decoding: steps that verified drafts, drafts offered and accepted per depth
    // (index j: depth j+1; a draft after a rejected one, or past a stop, is offered only), and
    // the time the MTP modules' passes took.
    // verified_tokens: tokens those steps emitted (a sample's stop cuts its accepted drafts).
    long verify_steps, drafted[WEFT_MAX_MTP], accepted[WEFT_MAX_MTP], verified_tokens;
    double draft_seconds;
    // Decode steps run as recorded backend graphs: graphs recorded, and steps replayed from one.
    long graph_captures, graph_steps;
    // Decode steps queued ahead of the host (rollout.async_scheduling), and the rows they gave
    // samples that had stopped at the step before (computed in vain).
    long async_steps, async_wasted_rows;
    // Times the host waited for the device (the backend's count: downloads, synchronizations,
    // frees): a decode step should wait once, for its tokens, whatever the model's depth. And the
    // bytes it read back: a decode step's should not grow with the vocabulary.
    long host_waits;
    long host_bytes_read;
    // Prefix caching (rollout.prefix_caching): positions whose keys and values a sequence found in
    // the cache instead of computing them, and the positions the forwards computed (drafts too).
    long prefix_hit_positions, computed_positions;
    // Whether each row's bits were independent of what else its step held: always on the CPU,
    // with rollout.batch_invariant on a GPU.
    bool batch_invariant;
    weft_kv_cache_stats kv;
} weft_rollout_stats;

typedef struct weft_engine weft_engine;

// An engine over model m with a pool of kv_blocks blocks (see weft_engine_pool_blocks). tok, if
// given, decodes text for stop strings and completions; stop_tokens lists the ids that end a
// sample (the settings' stop_token_ids, or the model's end-of-text ids).
weft_engine *weft_engine_create(weft_model *m, const weft_rollout_config *rc,
                                const weft_sampling_config *sc, const weft_tokenizer *tok,
                                long kv_blocks);
void weft_engine_free(weft_engine *e); // frees the KV pool too
// Blocks the settings give the pool: rollout.kv_cache_tokens, else rollout.kv_cache_fraction of
// the device's free memory, but never more than generating every prompt's samples at once could
// use (prompts: n of them; NULL: no such bound).
long weft_engine_pool_blocks(const weft_model *m, const weft_rollout_config *rc,
                             const weft_sampling_config *sc, const weft_prompt *prompts, int n);

// Checks, before any work, that every prompt can be generated alone: not empty, and prompt plus
// max_tokens within the model's context and the pool. `names` (may be NULL) say where each prompt
// came from for the error.
void weft_engine_check_prompts(const weft_engine *e, const weft_prompt *prompts, int n,
                               const char *const *names);

// What a caller of weft_engine_generate hears while it runs (any may be NULL).
typedef struct weft_generate_hooks {
    // After each step: the prompts finished and the tokens generated so far.
    void (*progress)(void *ctx, int prompts_done, int prompts, long tokens);
    // As soon as a sample has finished, with its completion, final (out[prompt * n + sample],
    // prompt its place in `prompts`): a reward can be scored while the others generate.
    void (*sample_done)(void *ctx, int prompt, int sample, const weft_completion *c);
    void *ctx;
} weft_generate_hooks;

// Generates sampling.n samples of each prompt: out[p * n + s] (freed with
// weft_completions_free). `hooks` may be NULL.
void weft_engine_generate(weft_engine *e, const weft_prompt *prompts, int n_prompts,
                          weft_completion *out, const weft_generate_hooks *hooks);
weft_rollout_stats weft_engine_stats(const weft_engine *e);
// Which of n prompts (lens: their token counts) rank `rank` of `ranks` generates: each goes to the
// rank with the least estimated work so far (prompt and samples' tokens; longest first, ties by
// index), the same on every rank. Returns the indices in increasing order (*n_mine of them).
int *weft_rollout_spread(const int *lens, int n, const weft_sampling_config *sc, int rank,
                         int ranks, int *n_mine);
void weft_completions_free(weft_completion *c, int n);
