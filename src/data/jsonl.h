// data: token datasets stored as JSON lines, one tokenized document per line.
#pragma once
#include <stdint.h>

#include "data/tokenizer.h"

// A JSON Lines file read an object a line, the one reader of every JSONL input: blank lines are
// skipped, a UTF-8 byte-order mark before the first line is ignored (editors on Windows write
// one), a line may hold up to 64 MiB. A line that is not one JSON object ends the process naming
// "<path>:<line>" and `example`, what a line should look like.
typedef struct weft_jsonl_reader weft_jsonl_reader;
struct json_t;
// Opens path; a missing or unreadable file is one error naming it and `what` it should hold.
weft_jsonl_reader *weft_jsonl_open(const char *path, const char *what, const char *example);
// The next line's object (the caller's to json_decref), or NULL at the end of the file.
struct json_t *weft_jsonl_next(weft_jsonl_reader *r);
// "<path>:<line>" of the object weft_jsonl_next returned last, for the caller's own errors.
const char *weft_jsonl_where(const weft_jsonl_reader *r);
long weft_jsonl_line(const weft_jsonl_reader *r);
void weft_jsonl_close(weft_jsonl_reader *r);
// For an error about a row with chat messages ("messages", or a "prompt"/"response" list, as
// verl's and TRL's datasets hold them): a sentence saying how to give them, else "".
const char *weft_jsonl_chat_hint(const struct json_t *row);

typedef struct weft_document {
    int32_t *tokens;
    uint8_t *loss_mask; // loss_mask[t] = 1: token t is a target (predicted from position t-1)
    // Optional (NULL): per token, dL/dlogp of target token t, the objective's weight of
    // log p(token t | tokens before it); read where loss_mask[t] = 1.
    float *logprob_weights;
    // Optional (NULL), per token, read where loss_mask[t] = 1: an RL row's advantage of token t,
    // and log p(token t | tokens before it) under the policy that sampled it (old) and under the
    // reference policy (DESIGN.md section 12); and as the rollout engine recorded it (truncated
    // importance sampling corrects for the difference from old).
    float *advantages, *old_logprobs, *ref_logprobs, *rollout_logprobs;
    int len;
    int line; // the JSONL line it came from (1-based), a synthetic document's number; 0: neither
} weft_document;

typedef struct weft_document_set {
    weft_document *docs;
    int n;
} weft_document_set;

// Reads {"input_ids": [...], "loss_mask": [...], "logprob_weights": [...]} per line (blank lines
// skipped). loss_mask is optional: without it every token but the first is a target.
// logprob_weights (numbers, one per token) is optional too: it makes the batch's objective
// sum_t w_t log p(token t | tokens before it) over targets t instead of the cross-entropy; so are
// an RL row's "advantages", "old_logprobs", "ref_logprobs" and "rollout_logprobs". loss_mask[0]
// is always treated as 0 (token 0 of a document is never a target). Errors end in weft_fatal
// naming "<path>:<line>: ...":
// malformed JSON, missing/non-array input_ids, non-integer ids, id outside [0, vocab_size), empty
// input_ids, loss_mask length != input_ids length, loss_mask values other than 0/1; an empty file
// (no documents) is fatal too. Reads line by line, so the file may be larger than memory allows
// to hold as text.
weft_document_set *weft_read_token_jsonl(const char *path, int vocab_size);
// What to do when text meets a job without a tokenizer.
#define WEFT_NO_TOKENIZER_HINT                                                                     \
    "the model directory has no tokenizer.json; give data.tokenizer=FILE (a tokenizer.json), or "  \
    "data.tokenizer=bytes to use UTF-8 bytes"
// The same files, plus tokenized on the fly: {"text": ...} (every token but the first a target)
// and {"prompt": ..., "response": ...} (response tokens and the closing end-of-text are targets).
// Pre-tokenized ids must lie below vocab_size (the model's; 0: the tokenizer's). tok may be NULL:
// then a text line is an error that says how to give a tokenizer.
weft_document_set *weft_read_jsonl_dataset(const char *path, const weft_tokenizer *tok,
                                           int vocab_size);
// One prompt/response document, tokenized, the prompt masked from the loss.
weft_document weft_encode_document(const weft_tokenizer *tok, const char *prompt,
                                   const char *response);
void weft_document_set_free(weft_document_set *set);
