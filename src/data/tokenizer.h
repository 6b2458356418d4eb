// data: tokenizers. Text in, token ids out, and back.
//
// Two kinds:
//   - the byte-level tokenizer: ids 0..255 are the bytes, 256 is "<|endoftext|>" (the eos);
//   - byte-level BPE read from a Hugging Face tokenizer.json (GPT-2, Qwen2, Llama 3 style), whose
//     encode gives exactly the ids of `tokenizers`' encode(text, add_special_tokens=False).
//
// Encoding follows the Hugging Face pipeline: added tokens (special or not) are matched verbatim
// in the raw text first, leftmost-longest; the rest is normalized (none or NFC), split by the
// pre-tokenizer (Split by regex, Digits, ByteLevel with or without its GPT-2 regex) and each piece
// merged by BPE rank. Regexes run through PCRE2 in UTF + Unicode-property mode, with \s meaning
// the Unicode White_Space property as in Oniguruma, which `tokenizers` uses.
//
// Input bytes that are not valid UTF-8 are replaced by U+FFFD, one per maximal invalid
// subsequence, exactly as Python's bytes.decode("utf-8", errors="replace") does before the text
// reaches `tokenizers` (the byte-level tokenizer needs no such step: it keeps every byte).
//
// Decoding concatenates the bytes of each token, special tokens included, and returns them as
// they are (`tokenizers` additionally replaces invalid UTF-8 in its output by U+FFFD, which only
// differs when the ids end inside a multi-byte character).
//
// A tokenizer is read-only after load: encode and decode may run concurrently on one tokenizer.
// Every error (unreadable or malformed file, unsupported feature, out-of-range id) ends in
// weft_fatal with one line naming the file and the problem.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct weft_tokenizer weft_tokenizer;

// Byte-level: ids 0..255 are the bytes, 256 is "<|endoftext|>" (eos), matched verbatim in text.
// vocab_size 257.
weft_tokenizer *weft_tokenizer_byte_level(void);

// A Hugging Face tokenizer.json of a byte-level BPE model. Supported: model BPE (vocab, merges as
// "a b" strings or [a, b] pairs, unk_token, fuse_unk, byte_fallback, ignore_merges); normalizer
// none or NFC (also inside a Sequence); pre_tokenizer ByteLevel, Split (Regex or String pattern,
// every behavior, invert), Digits, or a Sequence of them, which must include ByteLevel; decoder
// ByteLevel; added_tokens with single_word, lstrip, rstrip and normalized; post_processor
// TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing or a Sequence of them (see
// weft_tokenizer_encode_special). Truncation and padding settings are ignored. Anything
// else (another model type, normalizer, pre-tokenizer or decoder, BPE dropout, subword
// prefixes/suffixes) is rejected with weft_fatal naming the file and the feature.
weft_tokenizer *weft_tokenizer_load(const char *tokenizer_json_path);

// Number of ids: one more than the largest id of any token (vocab or added token).
int weft_tokenizer_vocab_size(const weft_tokenizer *t);
// The end-of-text id, as the files beside tokenizer.json name it: tokenizer_config.json's
// "eos_token", else generation_config.json's or config.json's "eos_token_id" (the first of a
// list); for a bare tokenizer.json, "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>" or
// "<｜end▁of▁sentence｜>" if it has one; -1 if none. A named token the tokenizer lacks is an error.
int weft_tokenizer_eos_id(const weft_tokenizer *t);
// "PATH, vocab V, end of text id E (from tokenizer_config.json)": what a job's start-up line says
// of its tokenizer (t NULL: none).
void weft_tokenizer_describe(const weft_tokenizer *t, char *out, size_t size);
// Writes the byte-level tokenizer into dir as Hugging Face files (tokenizer.json: BPE over the
// 256 byte symbols with no merges, and tokenizer_config.json), atomically each: a model trained on
// bytes then carries its tokenizer like any other. False if a write failed (errno says why).
bool weft_tokenizer_save_byte_level(const char *dir);

// Encodes len bytes of text (NUL bytes allowed). Returns a weft_alloc'd array of *n_out ids (never
// NULL, even when *n_out is 0).
int32_t *weft_tokenizer_encode(const weft_tokenizer *t, const char *text, size_t len, int *n_out);
// Encodes as Hugging Face's encode(text) does by default (add_special_tokens=True), which is how
// transformers and vLLM encode a text prompt: the post_processor's special tokens around
// weft_tokenizer_encode's ids (Llama 3: <|begin_of_text|> first; Qwen: none). A text whose own
// ids already begin with the leading ones (a chat template rendered with its BOS) does not get
// them twice.
int32_t *weft_tokenizer_encode_special(const weft_tokenizer *t, const char *text, size_t len,
                                       int *n_out);
// Those special tokens: *n_before ids put before a text's, *n_after after (none for bytes).
void weft_tokenizer_template(const weft_tokenizer *t, const int32_t **before, int *n_before,
                             const int32_t **after, int *n_after);
// Whether ids begin with the tokens put before a text (false when there are none).
bool weft_tokenizer_starts_with_template(const weft_tokenizer *t, const int32_t *ids, int n);
// Decodes n ids into a weft_alloc'd, NUL-terminated byte string of *len_out bytes (len_out may be
// NULL). An id no token has (past the tokenizer's ids, or a gap in them) decodes to nothing, as
// in Hugging Face's decode; a negative id ends in weft_fatal.
char *weft_tokenizer_decode(const weft_tokenizer *t, const int32_t *ids, int n, size_t *len_out);
// The same as text, as `tokenizers` decodes: valid UTF-8, each maximal invalid subpart (ids that
// end or start inside a multi-byte character) replaced by U+FFFD.
char *weft_tokenizer_decode_text(const weft_tokenizer *t, const int32_t *ids, int n, size_t *len_out);

void weft_tokenizer_free(weft_tokenizer *t);
