#include "rollout/generate.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/jsonl.h"
#include "model/safetensors.h"
#include "rollout/engine.h"

// ----------------------------------------------------------------------------- the input ----

typedef struct prompt_set {
    int n;
    json_t **rows;     // the input objects, echoed in the output
    int32_t **tokens;  // each prompt's ids
    int *lens;
    char **names;      // "FILE:LINE" for errors
} prompt_set;

static int32_t *ids_of(json_t *ids, const char *where, int vocab, int *len) {
    WEFT_CHECK(json_is_array(ids), "%s: \"input_ids\" must be a list of token ids", where);
    *len = (int)json_array_size(ids);
    int32_t *t = weft_alloc(sizeof(int32_t) * (*len > 0 ? *len : 1));
    for (int i = 0; i < *len; i++) {
        json_t *v = json_array_get(ids, i);
        WEFT_CHECK(json_is_integer(v) && json_integer_value(v) >= 0 &&
                       json_integer_value(v) < vocab,
                   "%s: input_ids[%d] is not a token id in [0, %d)", where, i, vocab);
        t[i] = (int32_t)json_integer_value(v);
    }
    return t;
}

// One prompt from its row: token ids as given, or the text encoded with the model's tokenizer.
static int32_t *prompt_tokens(json_t *row, const char *where, const weft_tokenizer *tok,
                              int vocab, int *len) {
    WEFT_CHECK(json_is_object(row), "%s: each line must be a JSON object with \"prompt\" or "
               "\"input_ids\"", where);
    json_t *ids = json_object_get(row, "input_ids"), *text = json_object_get(row, "prompt");
    if (ids) return ids_of(ids, where, vocab, len);
    WEFT_CHECK(json_is_string(text), "%s: the row has no \"prompt\" string and no \"input_ids\"%s",
               where, weft_jsonl_chat_hint(row));
    WEFT_CHECK(tok, "%s: a text prompt needs the model's tokenizer.json, which its directory "
               "lacks; give \"input_ids\" instead", where);
    const char *s = json_string_value(text);
    // Empty before the tokenizer's special tokens, which would make it one (Llama 3's BOS).
    WEFT_CHECK(*s, "%s is empty; give every prompt at least one token", where);
    return weft_tokenizer_encode_special(tok, s, strlen(s), len);
}

static prompt_set read_prompts(const char *path, const weft_tokenizer *tok, int vocab) {
    weft_jsonl_reader *r = weft_jsonl_open(path, "the prompts",
                                           "{\"prompt\": \"...\"} or {\"input_ids\": [1, 2, 3]}");
    prompt_set p = {0};
    int cap = 0;
    for (json_t *row; (row = weft_jsonl_next(r));) {
        const char *where = weft_jsonl_where(r);
        if (p.n == cap) {
            cap = cap ? 2 * cap : 64;
            p.rows = realloc(p.rows, sizeof(json_t *) * cap);
            p.tokens = realloc(p.tokens, sizeof(int32_t *) * cap);
            p.lens = realloc(p.lens, sizeof(int) * cap);
            p.names = realloc(p.names, sizeof(char *) * cap);
            WEFT_CHECK(p.rows && p.tokens && p.lens && p.names, "out of host memory reading %s", path);
        }
        p.rows[p.n] = row;
        p.tokens[p.n] = prompt_tokens(row, where, tok, vocab, &p.lens[p.n]);
        p.names[p.n] = weft_strdup(where);
        p.n++;
    }
    weft_jsonl_close(r);
    WEFT_CHECK(p.n > 0, "%s: holds no prompts; give one JSON object per line", path);
    return p;
}

static void prompt_set_free(prompt_set *p) {
    for (int i = 0; i < p->n; i++) {
        json_decref(p->rows[i]);
        weft_free(p->tokens[i]);
        weft_free(p->names[i]);
    }
    free(p->rows), free(p->tokens), free(p->lens), free(p->names);
}

// ---------------------------------------------------------------------------- the ranks ----

// ---------------------------------------------------------------------------- the output ----

static json_t *floats(const float *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

// The output row of prompt i: its input fields and its samples.
static char *output_row(const prompt_set *p, int i, const weft_completion *c, int n) {
    json_t *row = json_deep_copy(p->rows[i]), *responses = json_array();
    for (int s = 0; s < n; s++) {
        json_t *ids = json_array();
        for (int t = 0; t < c[s].len; t++) json_array_append_new(ids, json_integer(c[s].tokens[t]));
        json_t *r = json_pack("{s:o, s:o, s:s}", "token_ids", ids, "logprobs",
                              floats(c[s].logprobs, c[s].len), "finish_reason",
                              c[s].finish == WEFT_FINISH_STOP ? "stop" : "length");
        if (c[s].text) json_object_set_new(r, "text", json_string(c[s].text));
        if (c[s].processed_logprobs)
            json_object_set_new(r, "processed_logprobs", floats(c[s].processed_logprobs, c[s].len));
        json_array_append_new(responses, r);
    }
    json_object_set_new(row, "responses", responses);
    char *text = json_dumps(row, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(row);
    return text;
}

// Every rank's rows to everyone (all ranks enter), in input order: rows[i] of prompt i. A rank's
// part is, per prompt, its index and its row's length (two int32) and the row's bytes.
static char **gather_rows(weft_comm *world, const int *mine, int n_mine, char **my_rows,
                          int n_prompts) {
    int W = weft_comm_size(world);
    size_t len = 0;
    for (int k = 0; k < n_mine; k++) len += 8 + strlen(my_rows[k]);
    double my_len = (double)len, *lens = weft_alloc(sizeof(double) * W), most = 4;
    weft_comm_allgather(world, &my_len, lens, 1, WEFT_COMM_F64);
    for (int r = 0; r < W; r++) most = lens[r] > most ? lens[r] : most;
    size_t stride = ((size_t)most + 3) / 4 * 4; // moved as 32-bit words
    char *part = weft_alloc(stride), *all = weft_alloc(stride * W), *at = part;
    for (int k = 0; k < n_mine; k++) {
        int32_t head[2] = {mine[k], (int32_t)strlen(my_rows[k])};
        memcpy(at, head, sizeof head);
        memcpy(at + 8, my_rows[k], (size_t)head[1]);
        at += 8 + head[1];
    }
    weft_comm_allgather(world, part, all, stride / 4, WEFT_COMM_F32);
    char **rows = weft_alloc(sizeof(char *) * n_prompts);
    for (int r = 0; r < W; r++)
        for (const char *c = all + stride * r; c < all + stride * r + (size_t)lens[r];) {
            int32_t head[2];
            memcpy(head, c, sizeof head);
            rows[head[0]] = weft_alloc((size_t)head[1] + 1);
            memcpy(rows[head[0]], c + 8, (size_t)head[1]);
            c += 8 + head[1];
        }
    weft_free(part), weft_free(lens), weft_free(all);
    return rows;
}

// Writes the rows, one per line, atomically (rank 0 only).
static void write_output(const char *path, char **rows, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += strlen(rows[i]) + 1;
    char *text = weft_alloc(len + 1), *at = text;
    for (int i = 0; i < n; i++) at += sprintf(at, "%s\n", rows[i]);
    WEFT_CHECK(weft_write_file_atomic(path, text, len), "%s: cannot write the output (%s)", path,
               strerror(errno));
    weft_free(text);
}

// ------------------------------------------------------------------------------ progress ----

// Rank 0 shows its own share under several ranks (a total would need a collective every step).
typedef struct progress {
    bool print, tty;
    double started;
    int last_done;
    char who[48]; // "generate" or "generate (rank 0 of W)"
} progress;

static void show_progress(void *ctx, int done, int total, long tokens) {
    progress *p = ctx;
    if (!p->print || (!p->tty && done == p->last_done)) return;
    double s = weft_now_seconds() - p->started;
    if (p->tty) printf("\r%s: %d/%d prompts, %ld tokens, %.0f tokens/s\033[K", p->who, done,
                       total, tokens, s > 0 ? tokens / s : 0.0);
    else if (done == total || done / 10 != p->last_done / 10)
        printf("%s: %d/%d prompts, %ld tokens, %.0f tokens/s\n", p->who, done, total, tokens,
               s > 0 ? tokens / s : 0.0);
    p->last_done = done;
    fflush(stdout);
}

// ------------------------------------------------------------------------------ the verb ----

// The model of the directory, its weights loaded, on `be`; *tok its tokenizer if it has one.
static weft_model *load_model(const char *dir, const char *drop_tensors, weft_backend *be,
                              weft_tokenizer **tok) {
    char path[4200];
    weft_model_config mc;
    snprintf(path, sizeof path, "%s/config.json", dir);
    weft_model_config_load(path, &mc);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    *tok = access(path, R_OK) == 0 ? weft_tokenizer_load(path) : NULL;
    weft_model *m = weft_model_create(
        be, &mc, &(weft_model_options){.drop_tensors = drop_tensors, .forward_only = true});
    weft_model_load_safetensors(m, dir); // a directory without weights is its one clear error
    return m;
}

// The job's totals over the ranks. `generating` is rank 0's wall time from its first step to every
// rank's rows gathered: the slowest rank's generation, which is what tokens/s is of.
static json_t *summary(const weft_rollout_stats *s, int prompts, double generating, double seconds,
                       weft_comm *world, bool print) {
    double totals[5] = {(double)s->tokens, (double)s->preemptions, (double)s->kv.peak_used,
                        (double)s->prefix_hit_positions, (double)s->computed_positions};
    double mine_peak = totals[2];
    weft_comm_allreduce_sum(world, totals, 5, WEFT_COMM_F64);
    double rate = generating > 0 ? totals[0] / generating : 0.0;
    if (print)
        printf("generate: done: %d prompts, %.0f tokens in %.1f s (%.0f tokens/s; %.1f s with "
               "loading and writing), KV blocks peak %.0f of %ld on rank 0 (%ld shared at most), "
               "%.0f preemptions, %.0f positions found in the prefix cache\n", prompts, totals[0],
               generating, rate, seconds, mine_peak, s->kv.blocks_total, s->kv.peak_shared,
               totals[1], totals[3]);
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:{s:I, s:f, s:I, s:I, s:I, s:I}, s:{s:f, s:f}}",
                     "tokens", totals[0], "seconds", seconds, "generating_seconds", generating,
                     "tokens_per_s", rate, "preemptions", totals[1], "kv",
                     "blocks_total", (json_int_t)s->kv.blocks_total, "peak_used_sum", totals[2],
                     "peak_used", (json_int_t)s->kv.peak_used, "peak_shared",
                     (json_int_t)s->kv.peak_shared, "copies", (json_int_t)s->kv.copies,
                     "pool_bytes", (json_int_t)s->kv.pool_bytes, "prefix_cache", "hit_positions",
                     totals[3], "computed_positions", totals[4]);
}

// Speculative decoding's counts summed over the ranks: per depth the drafts offered and accepted,
// and how many tokens each verification emitted. Printed by rank 0 when asked.
static json_t *speculation_summary(const weft_rollout_stats *s, int k, weft_comm *world,
                                   bool print) {
    double totals[2 + 2 * WEFT_MAX_MTP] = {(double)s->verify_steps, (double)s->verified_tokens};
    for (int j = 0; j < k; j++) totals[2 + j] = (double)s->drafted[j];
    for (int j = 0; j < k; j++) totals[2 + k + j] = (double)s->accepted[j];
    weft_comm_allreduce_sum(world, totals, 2 + 2 * k, WEFT_COMM_F64);
    json_t *drafted = json_array(), *accepted = json_array(), *rate = json_array();
    for (int j = 0; j < k; j++) {
        double d = totals[2 + j], a = totals[2 + k + j];
        json_array_append_new(drafted, json_integer((json_int_t)d));
        json_array_append_new(accepted, json_integer((json_int_t)a));
        json_array_append_new(rate, json_real(d > 0 ? a / d : 0.0));
    }
    double steps = totals[0], length = steps > 0 ? totals[1] / steps : 0;
    if (print) {
        printf("generate: speculation: %d draft tokens per step, acceptance", k);
        for (int j = 0; j < k; j++)
            printf(" %s%.1f%%", j ? "/ " : "", 100 * json_real_value(json_array_get(rate, j)));
        printf(" by depth, %.2f tokens per verification, drafting %.1f s on rank 0\n", length,
               s->draft_seconds);
    }
    return json_pack("{s:i, s:I, s:o, s:o, s:o, s:f, s:f}", "tokens", k, "verify_steps",
                     (json_int_t)steps, "drafted", drafted, "accepted", accepted, "acceptance",
                     rate, "mean_accepted_length", length, "draft_seconds", s->draft_seconds);
}

int weft_generate_run(const weft_generate_request *r, weft_comm *world) {
    double t0 = weft_now_seconds();
    weft_comm_configure(world, r->debug_collectives, r->collective_timeout);
    weft_backend *be = weft_backend_create(r->device, weft_comm_local_rank(world));
    weft_backend_set_wait_timeout(be, r->device_timeout);
    weft_comm_use_backend(world, be);
    weft_tokenizer *tok;
    weft_model *m = load_model(r->model_dir, r->drop_tensors, be, &tok);
    weft_rollout_config_validate(&r->rollout, m->cfg.num_mtp, r->model_dir);
    prompt_set p = read_prompts(r->prompts, tok, m->cfg.vocab_size);
    weft_prompt *all = weft_alloc(sizeof(weft_prompt) * p.n);
    for (int i = 0; i < p.n; i++) all[i] = (weft_prompt){p.tokens[i], p.lens[i], i};
    // The pool is sized on the whole input, so every rank makes the same one.
    long blocks = weft_engine_pool_blocks(m, &r->rollout, &r->sampling, all, p.n);
    weft_engine *e = weft_engine_create(m, &r->rollout, &r->sampling, tok, blocks);
    weft_engine_check_prompts(e, all, p.n, (const char *const *)p.names); // every rank, all
    int n_mine, *mine = weft_rollout_spread(p.lens, p.n, &r->sampling, weft_comm_rank(world),
                                            weft_comm_size(world), &n_mine);
    weft_prompt *local = weft_alloc(sizeof(weft_prompt) * (n_mine > 0 ? n_mine : 1));
    for (int k = 0; k < n_mine; k++) local[k] = all[mine[k]];
    int n = r->sampling.n;
    weft_completion *out = weft_alloc(sizeof(weft_completion) * ((size_t)n_mine * n + 1));
    bool writer = weft_comm_rank(world) == 0;
    progress prog = {.print = writer, .tty = isatty(STDOUT_FILENO), .started = weft_now_seconds(),
                     .who = "generate"};
    if (weft_comm_size(world) > 1)
        snprintf(prog.who, sizeof prog.who, "generate (rank 0 of %d)", weft_comm_size(world));
    weft_engine_generate(e, local, n_mine, out,
                         &(weft_generate_hooks){.progress = show_progress, .ctx = &prog});
    if (prog.tty && writer) printf("\n");
    char **my_rows = weft_alloc(sizeof(char *) * (n_mine > 0 ? n_mine : 1));
    for (int k = 0; k < n_mine; k++) my_rows[k] = output_row(&p, mine[k], out + (size_t)k * n, n);
    char **rows = gather_rows(world, mine, n_mine, my_rows, p.n);
    double generating = weft_now_seconds() - prog.started;
    if (writer) write_output(r->out, rows, p.n);
    weft_rollout_stats st = weft_engine_stats(e);
    json_t *stats = summary(&st, p.n, generating, weft_now_seconds() - t0, world, writer);
    json_object_set_new(stats, "prompts", json_integer(p.n));
    json_object_set_new(stats, "peak_batch", json_integer(st.peak_batch)); // on rank 0
    json_object_set_new(stats, "generation_seconds", json_real(st.seconds)); // rank 0's engine time
    json_object_set_new(stats, "forwards", json_integer(st.forwards)); // rank 0's steps, and of them
    json_object_set_new(stats, "graphs", json_pack("{s:I, s:I}", "recorded",         // those replayed
                                                   (json_int_t)st.graph_captures, "replayed_steps",
                                                   (json_int_t)st.graph_steps));
    // Rank 0's decode steps queued ahead of the host, and rows computed for stopped samples.
    json_object_set_new(stats, "async", json_pack("{s:I, s:I}", "steps", (json_int_t)st.async_steps,
                                                  "wasted_rows",
                                                  (json_int_t)st.async_wasted_rows));
    json_object_set_new(stats, "batch_invariant", json_boolean(st.batch_invariant));
    json_object_set_new(stats, "host_waits", json_integer(st.host_waits)); // rank 0's
    json_object_set_new(stats, "host_bytes_read", json_integer(st.host_bytes_read)); // rank 0's
    json_object_set_new(stats, "memory", json_pack("{s:I, s:I, s:I}", "parameters", // rank 0's
                                                   (json_int_t)weft_model_param_bytes(m),
                                                   "gradients", (json_int_t)weft_model_grad_bytes(m),
                                                   "peak_activations",
                                                   (json_int_t)weft_model_peak_bytes(m)));
    if (r->rollout.speculative_tokens > 0)
        json_object_set_new(stats, "speculative", speculation_summary(&st, r->rollout.speculative_tokens,
                                                                      world, writer));
    if (writer && r->stats) {
        char *text = json_dumps(stats, JSON_INDENT(2));
        WEFT_CHECK(weft_write_file_atomic(r->stats, text, strlen(text)), "%s: cannot write the "
                   "statistics (%s)", r->stats, strerror(errno));
        free(text);
    }
    json_decref(stats);
    for (int i = 0; i < p.n; i++) weft_free(rows[i]);
    for (int k = 0; k < n_mine; k++) free(my_rows[k]);
    weft_free(rows), weft_free(my_rows), weft_free(mine), weft_free(local), weft_free(all);
    weft_completions_free(out, n_mine * n);
    weft_free(out);
    weft_engine_free(e);
    prompt_set_free(&p);
    weft_model_free(m);
    if (tok) weft_tokenizer_free(tok);
    weft_backend_destroy(be);
    return 0;
}
