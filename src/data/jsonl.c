#include "data/jsonl.h"

#include "core/core.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Where a line came from, for error messages: "<path>:<line>".
typedef struct {
    const char *path;
    long line; // 1-based
} source_line;

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

static void read_tokens(source_line at, json_t *ids, int vocab_size, weft_document *doc) {
    if (!json_is_array(ids))
        weft_fatal("%s:%ld: \"input_ids\" is missing or not an array; each line must be an object like {\"input_ids\": "
                   "[1, 2, 3]}",
                   at.path, at.line);
    size_t n = json_array_size(ids);
    if (n == 0)
        weft_fatal("%s:%ld: \"input_ids\" is empty; drop the line or give the document at least one token", at.path,
                   at.line);
    if (n > INT_MAX)
        weft_fatal("%s:%ld: the document has %zu tokens, more than weft supports (%d); split it", at.path, at.line, n,
                   INT_MAX);
    doc->len = (int)n;
    doc->tokens = weft_alloc(n * sizeof *doc->tokens);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v))
            weft_fatal("%s:%ld: input_ids[%zu] is not an integer; token ids must be integers in [0, %d)", at.path,
                       at.line, i, vocab_size);
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= vocab_size)
            weft_fatal("%s:%ld: input_ids[%zu] = %lld is outside the vocabulary [0, %d); tokenize with the model's "
                       "tokenizer",
                       at.path, at.line, i, (long long)id, vocab_size);
        doc->tokens[i] = (int32_t)id;
    }
}

// Fills doc->loss_mask from the optional field; token 0 is never a target whatever the file says,
// because there is no position before it to predict it from.
static void read_loss_mask(source_line at, json_t *mask, weft_document *doc) {
    size_t n = (size_t)doc->len;
    doc->loss_mask = weft_alloc(n);
    if (!mask) {
        for (size_t i = 1; i < n; i++) doc->loss_mask[i] = 1;
        return;
    }
    if (!json_is_array(mask))
        weft_fatal("%s:%ld: \"loss_mask\" is not an array; give one 0/1 per token or leave the field out", at.path,
                   at.line);
    if (json_array_size(mask) != n)
        weft_fatal("%s:%ld: loss_mask has %zu entries but input_ids has %zu; they must be the same length", at.path,
                   at.line, json_array_size(mask), n);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(mask, i);
        if (!json_is_integer(v) || (json_integer_value(v) != 0 && json_integer_value(v) != 1))
            weft_fatal("%s:%ld: loss_mask[%zu] is not 0 or 1; the mask marks targets with 1 and others with 0", at.path,
                       at.line, i);
        doc->loss_mask[i] = i > 0 && json_integer_value(v) == 1;
    }
}

// Reads an optional per-token field (NULL when absent): one finite number per token.
static float *read_token_floats(source_line at, json_t *root, const char *field, int len) {
    json_t *w = json_object_get(root, field);
    if (!w) return NULL;
    size_t n = (size_t)len;
    if (!json_is_array(w) || json_array_size(w) != n)
        weft_fatal("%s:%ld: \"%s\" must be an array of one number per token (%zu)", at.path,
                   at.line, field, n);
    float *values = weft_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(w, i);
        double x = json_number_value(v);
        if (!json_is_number(v) || x != x || x > 3e38 || x < -3e38)
            weft_fatal("%s:%ld: %s[%zu] is not a finite number", at.path, at.line, field, i);
        values[i] = (float)x;
    }
    return values;
}

// Concatenates the encodings of the given strings, marking the tokens of string i as targets when
// targets[i], inside the tokenizer's special tokens (Llama 3's <|begin_of_text|> first, never a
// target; those after, targets as the last string is); eos (if >= 0 and not already the last of
// those) closes the document as a target.
static weft_document encode_parts(const weft_tokenizer *tok, const char **parts, const bool *targets,
                                  int n_parts, int eos) {
    int32_t *ids[2];
    int lens[2], total = 0;
    for (int i = 0; i < n_parts; i++) {
        ids[i] = weft_tokenizer_encode(tok, parts[i], strlen(parts[i]), &lens[i]);
        total += lens[i];
    }
    const int32_t *before, *after;
    int n_before, n_after;
    weft_tokenizer_template(tok, &before, &n_before, &after, &n_after);
    if (weft_tokenizer_starts_with_template(tok, ids[0], lens[0])) n_before = 0; // given already
    bool close = eos >= 0 && !(n_after > 0 && after[n_after - 1] == eos);
    total += n_before + n_after + close;
    weft_document doc = {.len = total};
    doc.tokens = weft_alloc(sizeof(int32_t) * (total > 0 ? total : 1));
    doc.loss_mask = weft_alloc(total > 0 ? total : 1);
    int at = 0;
    for (int j = 0; j < n_before; j++) doc.tokens[at++] = before[j];
    for (int i = 0; i < n_parts; i++) {
        for (int j = 0; j < lens[i]; j++, at++) {
            doc.tokens[at] = ids[i][j];
            doc.loss_mask[at] = targets[i] && at > 0;
        }
        weft_free(ids[i]);
    }
    for (int j = 0; j < n_after; j++, at++)
        doc.tokens[at] = after[j], doc.loss_mask[at] = targets[n_parts - 1] && at > 0;
    if (close) doc.tokens[at] = eos, doc.loss_mask[at] = at > 0;
    return doc;
}

weft_document weft_encode_document(const weft_tokenizer *tok, const char *prompt,
                                   const char *response) {
    const char *parts[2] = {prompt, response};
    const bool targets[2] = {false, true};
    return encode_parts(tok, parts, targets, 2, weft_tokenizer_eos_id(tok));
}

static const char *string_field(source_line at, json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    if (!json_is_string(v))
        weft_fatal("%s:%ld: \"%s\" must be a string%s", at.path, at.line, key,
                   weft_jsonl_chat_hint(root));
    return json_string_value(v);
}

// A text or prompt/response record, tokenized.
static weft_document encode_record(source_line at, json_t *root, const weft_tokenizer *tok) {
    weft_document doc;
    if (json_object_get(root, "text")) {
        const char *text = string_field(at, root, "text");
        const bool target = true;
        doc = encode_parts(tok, &text, &target, 1, weft_tokenizer_eos_id(tok));
    } else if (json_object_get(root, "prompt") || json_object_get(root, "response")) {
        doc = weft_encode_document(tok, string_field(at, root, "prompt"),
                                   string_field(at, root, "response"));
    } else {
        weft_fatal("%s:%ld: the record has none of \"text\", \"prompt\"/\"response\" or "
                   "\"input_ids\"; give one of them%s",
                   at.path, at.line, weft_jsonl_chat_hint(root));
    }
    if (doc.len < 2)
        weft_fatal("%s:%ld: the document has %d token(s); it needs at least 2 to predict anything",
                   at.path, at.line, doc.len);
    return doc;
}

static weft_document parse_record(source_line at, json_t *root, int vocab_size,
                                  const weft_tokenizer *tok) {
    weft_document doc = {0};
    bool ids = json_object_get(root, "input_ids") != NULL;
    if (!tok && !ids && (json_object_get(root, "text") || json_object_get(root, "prompt") ||
                         json_object_get(root, "response")))
        weft_fatal("%s:%ld: a text record, but no tokenizer is set: %s", at.path, at.line,
                   WEFT_NO_TOKENIZER_HINT);
    if (tok && !ids) {
        doc = encode_record(at, root, tok);
    } else {
        read_tokens(at, json_object_get(root, "input_ids"), vocab_size, &doc);
        read_loss_mask(at, json_object_get(root, "loss_mask"), &doc);
        doc.logprob_weights = read_token_floats(at, root, "logprob_weights", doc.len);
        doc.advantages = read_token_floats(at, root, "advantages", doc.len);
        doc.old_logprobs = read_token_floats(at, root, "old_logprobs", doc.len);
        doc.ref_logprobs = read_token_floats(at, root, "ref_logprobs", doc.len);
        doc.rollout_logprobs = read_token_floats(at, root, "rollout_logprobs", doc.len);
    }
    return doc;
}

static void append(weft_document_set *set, int *cap, weft_document doc) {
    WEFT_CHECK(set->n < *cap || *cap <= INT_MAX / 2,
               "too many documents in one file (more than %d); split the file", *cap);
    set->docs = weft_grow(set->docs, set->n, cap, sizeof *set->docs, 64);
    set->docs[set->n++] = doc;
}

// ------------------------------------------------------------------------- the reader ----

// One document per line: the longest line weft reads. 64 MiB holds a document of millions of
// tokens (as ids or text) while a file with no newline at all, or a runaway line, is refused
// before it is read into memory whole.
#define MAX_LINE_BYTES ((size_t)64 << 20)

struct weft_jsonl_reader {
    FILE *f;
    char *path, *example;
    long line; // the line read last (1-based)
    char *buf; // grown as needed, up to MAX_LINE_BYTES
    size_t cap;
    char *where; // "<path>:<line>"
};

weft_jsonl_reader *weft_jsonl_open(const char *path, const char *what, const char *example) {
    weft_jsonl_reader *r = weft_alloc(sizeof *r);
    r->f = weft_open_input(path, what);
    r->path = weft_strdup(path), r->example = weft_strdup(example);
    r->where = weft_alloc(strlen(path) + 24);
    return r;
}

// Reads the next line (with its newline, if any) into r->buf; its length, or -1 at the end of
// the file. A line longer than MAX_LINE_BYTES is an error naming it.
static ssize_t read_line(weft_jsonl_reader *r) {
    size_t n = 0;
    int c = 0;
    r->line++;
    while (c != '\n' && (c = getc_unlocked(r->f)) != EOF) {
        if (n + 2 > r->cap) {
            size_t grown = r->cap ? 2 * r->cap : 4096;
            char *p = realloc(r->buf, grown);
            if (!p) weft_fatal("out of host memory reading %s:%ld", r->path, r->line);
            r->buf = p, r->cap = grown;
        }
        r->buf[n++] = (char)c;
        if (n > MAX_LINE_BYTES)
            weft_fatal("%s:%ld: the line is longer than %zu MiB; one record per line, at most "
                       "that long: split or shorten it", r->path, r->line, MAX_LINE_BYTES >> 20);
    }
    if (n) r->buf[n] = '\0';
    return n == 0 ? -1 : (ssize_t)n;
}

json_t *weft_jsonl_next(weft_jsonl_reader *r) {
    for (ssize_t len; (len = read_line(r)) != -1;) {
        const char *text = r->buf;
        size_t n = (size_t)len;
        if (r->line == 1 && n >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) text += 3, n -= 3;
        if (is_blank(text, n)) continue;
        sprintf(r->where, "%s:%ld", r->path, r->line);
        json_error_t err;
        json_t *root = json_loadb(text, n, 0, &err);
        if (!root)
            weft_fatal("%s: not valid JSON (%s, at byte %d of the line); each line must be one "
                       "JSON object like %s", r->where, err.text, err.position, r->example);
        if (!json_is_object(root))
            weft_fatal("%s: the line is not a JSON object; each line must be an object like %s",
                       r->where, r->example);
        return root;
    }
    if (ferror(r->f))
        weft_fatal("%s:%ld: read error (%s); check the file", r->path, r->line, strerror(errno));
    return NULL;
}

const char *weft_jsonl_where(const weft_jsonl_reader *r) { return r->where; }
long weft_jsonl_line(const weft_jsonl_reader *r) { return r->line; }

void weft_jsonl_close(weft_jsonl_reader *r) {
    if (!r) return;
    fclose(r->f);
    free(r->buf);
    weft_free(r->path), weft_free(r->example), weft_free(r->where), weft_free(r);
}

const char *weft_jsonl_chat_hint(const json_t *row) {
    json_t *r = (json_t *)row; // jansson's getters take no const
    bool chat = json_object_get(r, "messages") || json_is_array(json_object_get(r, "prompt")) ||
                json_is_array(json_object_get(r, "response"));
    return chat ? "; this row holds chat messages, and weft renders no chat template: give the "
                  "text tokenizer.apply_chat_template(messages, tokenize=False) makes"
                : "";
}

// ------------------------------------------------------------------------ documents ----

static weft_document_set *read_jsonl(const char *path, int vocab_size, const weft_tokenizer *tok) {
    WEFT_CHECK(vocab_size > 0, "%s: vocab_size must be positive, got %d", path, vocab_size);
    weft_jsonl_reader *r = weft_jsonl_open(
        path, "the JSONL documents",
        tok ? "{\"text\": \"...\"}, {\"prompt\": \"...\", \"response\": \"...\"} or "
              "{\"input_ids\": [1, 2, 3]}"
            : "{\"input_ids\": [1, 2, 3]}");
    weft_document_set *set = weft_alloc(sizeof *set);
    int cap = 0;
    for (json_t *root; (root = weft_jsonl_next(r));) {
        source_line at = {path, weft_jsonl_line(r)};
        weft_document doc = parse_record(at, root, vocab_size, tok);
        json_decref(root);
        doc.line = (int)(at.line < INT_MAX ? at.line : INT_MAX);
        append(set, &cap, doc);
    }
    weft_jsonl_close(r);
    if (set->n == 0)
        weft_fatal("%s: contains no documents (the file is empty or has only blank lines); give one "
                   "JSON object per line", path);
    return set;
}

weft_document_set *weft_read_token_jsonl(const char *path, int vocab_size) {
    return read_jsonl(path, vocab_size, NULL);
}

weft_document_set *weft_read_jsonl_dataset(const char *path, const weft_tokenizer *tok,
                                           int vocab_size) {
    return read_jsonl(path, vocab_size > 0 ? vocab_size : weft_tokenizer_vocab_size(tok), tok);
}

void weft_document_set_free(weft_document_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n; i++) {
        weft_free(set->docs[i].tokens);
        weft_free(set->docs[i].loss_mask);
        weft_free(set->docs[i].logprob_weights);
        weft_free(set->docs[i].advantages);
        weft_free(set->docs[i].old_logprobs);
        weft_free(set->docs[i].ref_logprobs);
        weft_free(set->docs[i].rollout_logprobs);
    }
    weft_free(set->docs);
    weft_free(set);
}
