// rollout (private): what the engine's files share: the sequences and the engine's state
// (engine.c schedules, step.c runs one forward and draws the tokens).
#pragma once
#include "model/batch.h"
#include "rollout/engine.h"
#include "rollout/sampling.h"

typedef enum { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE } seq_state;

// A prompt's prefill (sample -1, done once its samples are forked) or one of its samples.
typedef struct gen_seq {
    int prompt, sample;         // the random streams' counters
    int place;                  // the prompt's place in the generate call's list
    int32_t *tokens;            // (len) the prompt, then the tokens drawn
    float *logprobs, *processed; // (len) of each drawn token (unused for the prompt's)
    int len, cap, prompt_len;
    int kv;                     // the KV cache's sequence, -1 while none
    int cached;                 // positions whose keys and values are in the cache
    seq_state state;
    long order;                 // arrival order: admission takes the oldest, preemption the newest
    weft_finish_reason finish;
    // Speculative decoding (rollout.speculative_tokens = k > 0, speculate.c):
    int n_drafts;        // drafted tokens waiting at tokens[len, len + n_drafts), verified next
    float *draft_logits; // (k, V) the logits each draft was drawn from (its q), on the host
    int q_row[WEFT_MAX_MTP]; // drafting on the device: each draft's q, a row of draft_q
    // MTP module j+1's positions [0, mtp_cached[j]) hold keys of true inputs (accepted tokens).
    int mtp_cached[WEFT_MAX_MTP];
    // h_j (j = 0: the main model's h_0) at position stash_pos[j] (-1: none), row stash_row[j] of
    // the step buffers' stash[j]: the one row module j+1 starts from that producer j no longer
    // computes.
    int stash_pos[WEFT_MAX_MTP], stash_row[WEFT_MAX_MTP];
    // This step: the main forward's rows for this sequence, positions [main_lo, main_hi] at
    // rows main_row0 + position of its hidden states.
    int main_row0, main_lo, main_hi;
    // Asynchronous scheduling (async.c): the last in_flight tokens are placeholders for draws
    // whose download has not been read; the last of them is draw fed_by of the step in flight.
    int in_flight, fed_by;
} gen_seq;

// Device buffers of one step, grown as needed and kept.
typedef struct step_buffers {
    int meta_cap, draws_cap, logits_cap, draw_logits_cap;
    int32_t *meta; // one device allocation (one upload a step) holding the five below
    int32_t *slots, *q_pos, *cu_q, *tables; // (rows), (rows), (seqs + 1), (seqs * max_blocks)
    int32_t *cu_fresh;                      // (seqs + 1): the fresh sequences' rows, from 0
    void *logits, *draw_logits;             // (head rows, V), (host draws, V)
    int32_t *draw_rows, *draw_tokens;       // (draws)
    int32_t *draw_feed;                     // (draws) the draw of the step before a row's token is
    float *draw_logprobs, *draw_processed;  // (draws)
    double *draw_u;                         // (draws): the uniform numbers of device draws
    float *host_logits;                     // (head rows, V) f32 on the host, for the draws
    size_t host_logits_cap;                 // bytes
    // Where the backend has log_normalizers: the head rows' normalizers, downloaded with their
    // logits, from which the host finishes the drawn tokens' base log-probs (host_lse_rows of
    // them this step; 0: the logprobs op gives those), and the download's raw bytes (pinned).
    float *host_lse;
    int host_lse_rows;
    void *host_raw;
    size_t host_lse_cap, host_raw_cap; // bytes
    // Speculative decoding: the main forward's hidden states, the MTP modules' outputs (ping-pong)
    // and a module's gathered input, each (rows + seqs, C) (the tail takes stashed rows).
    void *hidden_main, *hidden_mtp[2], *hidden_in;
    int hidden_main_cap, hidden_mtp_cap[2], hidden_in_cap; // rows
    int32_t *gather_rows;                   // (rows) device
    int gather_cap;
    // Module j+1's stash: (rows, C) the kept rows of h_j; and the spare a rebuild writes.
    void *stash[WEFT_MAX_MTP], *stash_spare;
    int stash_cap[WEFT_MAX_MTP], stash_spare_cap; // rows
    // Drafting on the device (speculate.c): the logits rows (rows, V) the waiting drafts were
    // drawn from and the drafts (rows) int32, in draft_q[draft_q_cur] and draft_tok[draft_q_cur]
    // (the others are the next drafting phase's); the batch rows' token sources (rows) int32,
    // where a row's token is a draft (pass options token_from); and verify_drafts' inputs and
    // outputs (draws.c).
    void *draft_q[2], *verify_io;
    int32_t *draft_tok[2], *draft_feed;
    int draft_q_cap[2], draft_tok_cap[2], draft_q_cur, draft_feed_cap, verify_cap; // rows; checks
} step_buffers;

// Decode steps recorded as backend graphs (graphs.c). A graph holds the pointers and sizes of the
// step it recorded: it replays a step of the same rows, documents and block-table width while
// the backend has allocated and freed nothing since (every pointer it holds still live).
enum { STEP_GRAPHS = 8 };
typedef struct step_graph {
    int rows, docs, max_blocks;
    long allocations; // the backend's count at the recording
    void *graph;
} step_graph;
typedef struct step_graphs {
    step_graph cached[STEP_GRAPHS];
    int n;
    step_graph last_eager; // the last step run kernel by kernel: a repeat of it is recorded
} step_graphs;

// A decode step queued ahead of the host (async.c): where its draws' tokens go once they are back.
typedef struct pending_step {
    int n, cap;     // draws; room in seq and at
    int *seq, *at;  // (n) the sequence and the token index each draw fills (seq -1: padding)
    void *ticket;   // its download's (backend download_begin); NULL: nothing in flight
    int32_t *host;  // pinned: the tokens, log-probs and processed log-probs of draws_cap draws
    size_t host_cap; // int32s
    int draws_cap;  // the step's, which laid them out
} pending_step;

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
    // The generate call's: each sample's completion goes to out[place * n + sample] as it finishes.
    weft_completion *out;
    const weft_generate_hooks *hooks;
    weft_rollout_stats stats;
    void *sampling_scratch;
    double *verify_scratch; // (2, V) speculating: p and q of the draft being verified
    weft_batch batch;
    weft_batch draft_batch; // one MTP module's rows
    step_buffers buf;
    step_graphs graphs;
    pending_step pending[2]; // the step in flight and the one being queued (async.c)
    int in_flight;           // which of them is in flight, -1: none
    weft_arena step_scratch; // a step's host lists and staging rows, reset as each step begins
    // rollout.batch_invariant on a backend that has the switch: while generating it is on, and
    // every row's attention reads the pool, fresh prompts' too (step.c).
    bool invariant;
    // Speculation drafts and verifies on the device (backend sample_tokens, verify_drafts and
    // take_tokens; speculate.c): the logits stay there, and only the emitted tokens and their
    // log-probs come back.
    bool verify_on_device;
};

// engine.c
int weft_rollout_add_seq(weft_engine *e, gen_seq s);
// The sequences in `state`, oldest first (by order): *n of them, in the step's scratch arena.
int *weft_rollout_in_line(weft_engine *e, seq_state state, int *n);
// Makes room in the cache for positions [cached, cached + rows + spare) of sequence i (its own
// copies from weft_rollout_write_from on), preempting newer running sequences as needed; false
// (sequence i itself preempted) when even that is not enough.
bool weft_rollout_reserve_rows(weft_engine *e, int i, int rows, int spare);
// Positions a prompt's last chunk reserves beyond its end for the copies its samples make when
// they draft (0 for a sample, or without speculation).
int weft_rollout_fork_spare(const weft_engine *e, int sample, int len);
// The prompt's samples from its prefilled sequence `parent`, sharing its blocks; returns the
// first sample's index (the n samples are consecutive).
int weft_rollout_fork_samples(weft_engine *e, int parent);
// After a sample's token is appended: done (its blocks freed at once) or on to the next.
void weft_rollout_after_token(weft_engine *e, int i);

// Positions [from, ...) a running sequence's next forwards write (MTP modules rewrite some below
// `cached`), so its blocks there must be its own.
int weft_rollout_write_from(const weft_engine *e, const gen_seq *s);
// Positions whose keys and values are final in every layer (the MTP modules' too).
int weft_rollout_final_positions(const weft_engine *e, const gen_seq *s);
// Registers the full blocks of sequences seqs[0, n) whose keys are final with the prefix cache.
void weft_rollout_publish(weft_engine *e, const int *seqs, int n);
// Rows the sequence's next forward would take: its positions not yet in the cache and its drafts.
int weft_rollout_pending_rows(const gen_seq *s);
// The most tokens sequence s may reach (prompt + max_tokens, within the model's context and the
// pool).
int weft_rollout_token_limit(const weft_engine *e, const gen_seq *s);

// step.c
// One forward over the running sequences and the tokens drawn from it; false if none ran.
bool weft_rollout_step(weft_engine *e);
void weft_rollout_step_buffers_free(weft_engine *e);
// Device buffers: grown to hold `want` elements of `each` bytes (contents lost), else kept.
void *weft_rollout_grown(weft_backend *be, void *p, int *cap, int want, size_t each);
// The step buffers' logits grown to hold `rows` rows and, after them, their normalizers.
void weft_rollout_logits_room(weft_engine *e, int rows);
// Uploads the slots, positions, sequence bounds and block tables of a batch whose documents are the
// sequences seqs[0..n) and returns the provider through which its attention reads the cache.
// The batch's sequences with cached keys come first and attend over the pool (layout: its first
// layout.Tq rows); the rest, fresh ones whose rows are all their positions from 0, attend over
// their own keys with the training attention (fresh: rows layout.Tq on, on the tensor cores on a
// GPU), the same result without reading them back from the pool.
typedef struct paged_provider {
    weft_engine *e;
    const int32_t *slots; // (T) device: where each row's keys and values go
    weft_paged_layout layout;
    weft_attention_layout fresh;
    int H, KV, D;
    int stored_layer; // the layer whose keys split_store put in the pool (attend stores the rest)
} paged_provider;
// A negative seqs[j] is a padding row's (one row, attending over block 0, storing nothing).
weft_kv_provider weft_rollout_provider(weft_engine *e, const weft_batch *batch, const int *seqs,
                                       int n, paged_provider *storage);

// graphs.c
// Queues work(e, ctx): device work alone (every upload it reads went before), a step's forward
// and draws over `rows` rows of `docs` sequences and block tables `max_blocks` wide (with the
// engine's settings, the shape of all it queues). Replays its graph where one was
// recorded; records one where the last step run kernel by kernel had the same shape and the
// backend allocated nothing since; else (and without rollout.cuda_graphs, or a backend that
// records none) runs it kernel by kernel.
typedef void (*weft_device_work)(weft_engine *e, void *ctx);
void weft_rollout_run_graphed(weft_engine *e, int rows, int docs, int max_blocks,
                              weft_device_work work, void *ctx);
// Block tables' width for a step whose longest sequence has `blocks` blocks: rounded up to a
// power of two where graphs are recorded, so that a width serves many steps.
int weft_rollout_table_width(const weft_engine *e, int blocks);
// Rows a decode step of n rows runs: where graphs are recorded, n padded up to 1, 2, 4, 8 or a
// multiple of 8 (within rollout.max_batch_tokens), so that a batch shrinking as its samples
// finish keeps replaying a few graphs. Padding rows store no keys and their draws are dropped.
int weft_rollout_decode_rows(const weft_engine *e, int n);
void weft_rollout_graphs_free(weft_engine *e);

// speculate.c
// The MTP modules' passes for sequences seqs[0..n): every row whose inputs are known, and with
// `drafting` the drafts for the next step (module j drafts token len + j - 1).
void weft_rollout_draft(weft_engine *e, const int *seqs, int n, bool drafting);
// Drafting on the device: the rows of batch (whose documents are sequences seqs[0, n), -1 a
// padding row's) whose input token is a draft, the token at position + offset (0: the main
// model's, j: MTP module j's) at or past the sequence's len, take it from tokens (device, by
// draft row q_row): their sources uploaded and set in pass (token_source, token_from); false
// (pass unchanged) where no row reads a draft.
bool weft_rollout_feed_drafts(weft_engine *e, const weft_batch *batch, const int *seqs, int n,
                              int offset, const int32_t *tokens, weft_pass_options *pass);
// Verifies sequence i's drafts against the main model's logits rows (1 + n_drafts, V, host) of
// the rows first_row.. of the step: fills out with the tokens to append (the accepted drafts and
// one more: drawn from the residual at the first rejection, else the bonus) and returns how many.
typedef struct draw {
    int seq, row;
    int32_t token;
    float processed;
    int depth;     // an accepted draft's depth - 1; -1 for a drawn token
    bool verified; // came out of a step that verified drafts
} draw;
int weft_rollout_verify(weft_engine *e, int i, const float *logits, int first_row, draw *out);

// draws.c
// A token drawn from the processed distribution of a logits row (V, host), its log-prob under it.
int weft_rollout_draw(weft_engine *e, const gen_seq *s, const float *logits, int position,
                      weft_draw_kind kind, float *processed);
// The sequences due a token this step: each one's first logits row (its last 1 + n_drafts rows
// have logits).
typedef struct due_seqs {
    int *seq, *first_row, n, rows;
} due_seqs;
// Whether this step's tokens are drawn on the device (backend sample_tokens): where the backend
// has it and nothing needs the host's logits (no drafts to verify).
bool weft_rollout_draws_on_device(const weft_engine *e);
// Drafts drawn on the device from rows d[i].row of logits (device) for the sequences d[i].seq,
// at depth `depth` (the draft of token len + depth - 1): their tokens into tokens[i] (device;
// no wait: the host never reads them, the next module and the verifying forward take them there).
void weft_rollout_draw_drafts_on_device(weft_engine *e, const void *logits, const draw *d,
                                        int n, int depth, int32_t *tokens);
// Draws a token for every sequence due one from the main forward's logits (in the step buffers;
// `logits`: their host copy, NULL when drawn on the device, drafts verified there too), then
// appends them with their log-probs. Returns the sequences that took a token and still run in
// *took.
int weft_rollout_draw_tokens(weft_engine *e, const due_seqs *due, const float *logits, int *took);
// The same on the device in three parts, so that the device work between can be recorded as a
// graph: the draws d[0, n)'s rows and uniform numbers go up (one upload; seq < 0: a padding
// row's draw, whose token is never used), with feed (n; NULL: none) the batch rows' token
// sources (draw_feed: pass options token_from); the draws and their base log-probs are queued
// (device work alone); one download, then the first n draws' tokens are appended.
void weft_rollout_upload_draws(weft_engine *e, const draw *d, int n, const int32_t *feed);
void weft_rollout_sample_on_device(weft_engine *e, int n);
int weft_rollout_finish_draws(weft_engine *e, draw *d, int n, int *took);

// async.c
// Whether the next step may be queued before the host reads the step in flight's tokens: the
// engine and backend allow it, every running sequence is a sample decoding one token drawn on
// the device, and the pool holds each one's next row without preempting.
bool weft_rollout_async_ready(const weft_engine *e);
// The draw of the step in flight that sequence s's next row's token comes from (-1: known).
int weft_rollout_fed_from(const gen_seq *s);
// After a decode step's device work d[0, n) (padding draws included) is queued: its draws'
// download begins, each due sequence takes a placeholder token, then the step before (if one
// is in flight) is settled: this one is now in flight.
void weft_rollout_queue_ahead(weft_engine *e, const draw *d, int n);
// Waits for the step in flight (if any) and appends its tokens and log-probs.
void weft_rollout_settle(weft_engine *e);
void weft_rollout_pending_free(weft_engine *e);
