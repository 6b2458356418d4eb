// rollout: the settings of generation, `sampling.*` (how each token is drawn) and `rollout.*`
// (the engine: KV cache size and layout), plain structs the job's settings registry fills.
#pragma once
#include "core/core.h"

enum { WEFT_MAX_STOP = 16, WEFT_MAX_STOP_LEN = 64 };

typedef struct weft_sampling_config {
    double temperature; // 0: greedy (the most likely token, the first on ties)
    int top_k;          // 0: off
    double top_p;       // 1: off; else in (0, 1]
    double min_p;       // 0: off; else in [0, 1]
    int max_tokens;     // new tokens per sample at most
    int n;              // samples per prompt
    int seed;
    // Stop strings (a sample ends once its text contains one; the text is cut before it) and stop
    // token ids (the token is kept in token_ids). n_stop_token_ids -1 (the default): every
    // end-of-text id of the model directory and its tokenizer (weft_model_config's end_ids); 0
    // (an explicit empty list): none, every sample runs to max_tokens.
    int n_stop, n_stop_token_ids;
    char stop[WEFT_MAX_STOP][WEFT_MAX_STOP_LEN];
    int stop_token_ids[WEFT_MAX_STOP];
    bool processed_logprobs; // also record each token's log-prob under the processed distribution
} weft_sampling_config;

typedef struct weft_rollout_config {
    int block_size;           // KV cache positions per block
    int kv_cache_tokens;      // pool size in positions (0: use kv_cache_fraction)
    double kv_cache_fraction; // of the device's free memory (host RAM on the CPU)
    int max_batch_tokens;     // rows one forward may hold (prefill is chunked to it)
    int max_running;          // sequences running at once at most (0: as many as fit)
    int speculative_tokens;   // tokens the MTP modules draft per step (0: no speculation)
    bool draft_bf16;          // drafts read the weights rounded to bf16 where the backend can
    bool cuda_graphs;         // decode steps as recorded graphs where the backend has them
    // Decode steps queued one ahead of the host where the backend downloads asynchronously: the
    // next step is launched on the device's draws before the host has read them (async.c).
    bool async_scheduling;
    // Each row's bits independent of what else its step holds, where the backend offers it
    // (backend.h's batch_invariant; the CPU always is): every row's attention through the pool.
    bool batch_invariant;
    // Sequences starting with tokens whose keys and values are in the cache (another prompt's
    // shared system prompt, a preempted sample's own) take those blocks and compute only the rest
    // (kv_cache.h); speculating, a block's content includes the k tokens after it, which the MTP
    // modules' keys there read.
    bool prefix_caching;
} weft_rollout_config;

weft_sampling_config weft_sampling_config_default(void);
weft_rollout_config weft_rollout_config_default(void);
// Checks the settings' ranges; `source` names where they came from in the error.
void weft_sampling_config_validate(const weft_sampling_config *c);
// Checks the engine's settings against the model (its MTP depth; `model` names it in the error).
void weft_rollout_config_validate(const weft_rollout_config *c, int mtp_depth, const char *model);
