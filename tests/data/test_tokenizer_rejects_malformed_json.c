// Malformed or unsupported tokenizer.json files end the process with status 1 and one line
// "weft: error: <path>: ..." naming the problem, never a crash or a silently wrong tokenizer.
// A minimal valid file loads and encodes as expected, so the rejections are not an accident.
#include "../testing.h"
#include "core/core.h"
#include "data/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

// A tokenizer.json with the given model, normalizer and pre_tokenizer JSON; the rest is valid.
static const char *write_tokenizer(const char *name, const char *model, const char *normalizer,
                                   const char *pre_tokenizer) {
    static char text[4096];
    snprintf(text, sizeof text,
             "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
             " \"added_tokens\": [{\"id\": 5, \"content\": \"<|endoftext|>\", \"single_word\": false,\n"
             "   \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}],\n"
             " \"normalizer\": %s,\n \"pre_tokenizer\": %s,\n \"post_processor\": null,\n"
             " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true,"
             " \"use_regex\": true},\n \"model\": %s}\n",
             normalizer, pre_tokenizer, model);
    return weft_test_write_text(name, text);
}

#define BYTE_LEVEL "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}"
#define VOCAB "{\"a\": 0, \"b\": 1, \"\\u0120\": 2, \"ab\": 3, \"\\u0120ab\": 4, \"<|endoftext|>\": 5}"
#define GOOD_MODEL                                                                                                     \
    "{\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null,"                 \
    " \"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": " VOCAB ","              \
    " \"merges\": [\"a b\", [\"\\u0120\", \"ab\"]]}"

static void test_good_file(void) {
    const char *path = write_tokenizer("good.json", GOOD_MODEL, "null", BYTE_LEVEL);
    weft_tokenizer *t = weft_tokenizer_load(path);
    CHECK(weft_tokenizer_vocab_size(t) == 6);
    CHECK(weft_tokenizer_eos_id(t) == 5);
    const char *text = "ab ab<|endoftext|>ab";
    int n;
    int32_t *ids = weft_tokenizer_encode(t, text, strlen(text), &n);
    CHECK(n == 4 && ids[0] == 3 && ids[1] == 4 && ids[2] == 5 && ids[3] == 3);
    size_t len;
    char *back = weft_tokenizer_decode(t, ids, n, &len);
    CHECK(len == strlen(text) && memcmp(back, text, len) == 0);
    weft_free(back);
    weft_free(ids);
    weft_tokenizer_free(t);

    t = weft_tokenizer_byte_level();
    CHECK(weft_tokenizer_vocab_size(t) == 257 && weft_tokenizer_eos_id(t) == 256);
    ids = weft_tokenizer_encode(t, "a<|endoftext|>\xff", 15, &n);
    CHECK(n == 3 && ids[0] == 'a' && ids[1] == 256 && ids[2] == 255);
    back = weft_tokenizer_decode(t, ids, n, &len);
    CHECK(len == 15 && memcmp(back, "a<|endoftext|>\xff", 15) == 0);
    weft_free(back);
    weft_free(ids);
    weft_tokenizer_free(t);
}

static void load(const char *path) { weft_tokenizer_free(weft_tokenizer_load(path)); }

static void decode_bad_id(const char *path) {
    weft_tokenizer *t = weft_tokenizer_load(path);
    int32_t id = -1;
    weft_free(weft_tokenizer_decode(t, &id, 1, NULL));
    weft_tokenizer_free(t);
}

// Ids no token has (a model's vocabulary padded past its tokenizer's) decode to nothing, as in
// Hugging Face's decode: a sampled one must not end a generation.
static void test_ids_without_tokens_decode_to_nothing(const char *path) {
    weft_tokenizer *t = weft_tokenizer_load(path);
    int32_t plain[2] = {0, 1}, padded[4] = {0, 6, 1, 1000};
    size_t a_len, b_len;
    char *a = weft_tokenizer_decode(t, plain, 2, &a_len), *b = weft_tokenizer_decode(t, padded, 4, &b_len);
    CHECK(a_len == b_len && memcmp(a, b, a_len) == 0);
    weft_free(a), weft_free(b);
    weft_tokenizer_free(t);
}

// Encodes `bytes` bytes of `unit` repeated with the tokenizer at path, failing if it takes more
// than `seconds`: inputs that used to cost quadratic or exponential time.
static void encode_within(const char *path, const char *unit, size_t bytes, double seconds) {
    weft_tokenizer *t = weft_tokenizer_load(path);
    size_t ul = strlen(unit), n = bytes / ul * ul;
    char *text = weft_alloc(n + 1);
    for (size_t i = 0; i < n; i += ul) memcpy(text + i, unit, ul);
    double t0 = weft_now_seconds();
    int n_ids;
    weft_free(weft_tokenizer_encode(t, text, n, &n_ids));
    double took = weft_now_seconds() - t0;
    if (took > seconds) fprintf(stderr, "encoding %zu bytes of \"%s\" took %.2f s\n", n, unit, took);
    CHECK(took <= seconds);
    weft_free(text);
    weft_tokenizer_free(t);
}

// A catastrophically backtracking Split pattern, (a+)+$, on text it cannot match.
static void encode_backtracking(const char *path) {
    weft_tokenizer *t = weft_tokenizer_load(path);
    const char *text = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab";
    int n;
    weft_free(weft_tokenizer_encode(t, text, strlen(text), &n));
    weft_tokenizer_free(t);
}

// Bounds on what a file or a text can cost: ids far past the vocabulary, a backtracking regex,
// and combining marks that the NFC reordering used to sort in quadratic time.
static void test_limits(void) {
    EXPECT_FATAL(load,
                 write_tokenizer("huge_id.json",
                                 "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 67108863}, \"merges\": []}",
                                 "null", BYTE_LEVEL),
                 "token \"b\" has id 67108863", "defines only 3 tokens");
    const char *split = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                        "{\"Regex\": \"(a+)+$\"}, \"behavior\": \"Isolated\", \"invert\": false}, " BYTE_LEVEL "]}";
    double t0 = weft_now_seconds();
    EXPECT_FATAL(encode_backtracking, write_tokenizer("backtracking.json", GOOD_MODEL, "null", split),
                 "backtracking");
    CHECK(weft_now_seconds() - t0 < 10);
    // Alternating classes 230 and 220 (U+0301, U+0316): one long run of non-starters to sort.
    const char *nfc = write_tokenizer("nfc.json", GOOD_MODEL, "{\"type\": \"NFC\"}", BYTE_LEVEL);
    encode_within(nfc, "\xcc\x81\xcc\x96", 400000, 5.0);
    // Long texts stay under the regex match limit with the GPT-2 pattern.
    encode_within(nfc, "ab", 4000000, 20.0);
    encode_within(nfc, " ", 4000000, 20.0);
}

int main(void) {
    weft_test_make_dir("weft_tokenizer");

    test_good_file();
    test_limits();

    // The three the tokenizer must never get wrong: bad JSON, another model, a dangling merge.
    EXPECT_FATAL(load, weft_test_write_text("invalid.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}}"),
                 "invalid JSON at line 1");
    EXPECT_FATAL(load,
                 write_tokenizer("wordpiece.json",
                                 "{\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"vocab\": {\"[UNK]\": 0}}",
                                 "null", BYTE_LEVEL),
                 "model type \"WordPiece\" is not supported");
    EXPECT_FATAL(load,
                 write_tokenizer("unknown_merge.json",
                                 "{\"type\": \"BPE\", \"vocab\": " VOCAB ", \"merges\": [\"a b\", \"ab c\"]}", "null",
                                 BYTE_LEVEL),
                 "merge 1 (\"ab\" \"c\") uses token \"c\", which is not in the vocab");
    EXPECT_FATAL(load,
                 write_tokenizer("unknown_result.json",
                                 "{\"type\": \"BPE\", \"vocab\": " VOCAB ", \"merges\": [\"b a\"]}", "null",
                                 BYTE_LEVEL),
                 "uses token \"ba\", which is not in the vocab");

    // Other malformed or unsupported files.
    EXPECT_FATAL(load, weft_test_path("does_not_exist.json"), "cannot read tokenizer file");
    EXPECT_FATAL(load, weft_test_write_text("array.json", "[1, 2]"), "top level is not an object");
    EXPECT_FATAL(load, weft_test_write_text("no_model.json", "{\"version\": \"1.0\"}"), "no \"model\" object");
    EXPECT_FATAL(load,
                 write_tokenizer("bad_merge_string.json",
                                 "{\"type\": \"BPE\", \"vocab\": " VOCAB ", \"merges\": [\"ab\"]}", "null", BYTE_LEVEL),
                 "merge 0 \"ab\" is not two tokens separated by one space");
    EXPECT_FATAL(load,
                 write_tokenizer("bad_id.json", "{\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}", "null",
                                 BYTE_LEVEL),
                 "vocab entry \"a\" needs an integer id");
    EXPECT_FATAL(load,
                 write_tokenizer("dropout.json",
                                 "{\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": " VOCAB ", \"merges\": []}", "null",
                                 BYTE_LEVEL),
                 "BPE dropout is not supported");
    EXPECT_FATAL(load, write_tokenizer("lowercase.json", GOOD_MODEL, "{\"type\": \"Lowercase\"}", BYTE_LEVEL),
                 "normalizer \"Lowercase\" is not supported");
    EXPECT_FATAL(load,
                 write_tokenizer("nfkc.json", GOOD_MODEL,
                                 "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}]}", BYTE_LEVEL),
                 "normalizer \"NFKC\" is not supported");
    EXPECT_FATAL(
        load,
        write_tokenizer("metaspace.json", GOOD_MODEL, "null",
                        "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"always\"}"),
        "pre_tokenizer \"Metaspace\" is not supported");
    EXPECT_FATAL(load, write_tokenizer("no_byte_level.json", GOOD_MODEL, "null", "null"), "no ByteLevel step");
    EXPECT_FATAL(load,
                 write_tokenizer(
                     "bad_regex.json", GOOD_MODEL, "null",
                     "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                     "{\"Regex\": \"(\\\\p{L}+\"}, \"behavior\": \"Isolated\", \"invert\": false}, " BYTE_LEVEL "]}"),
                 "regex \"(\\p{L}+\" does not compile");
    EXPECT_FATAL(load,
                 write_tokenizer("bad_behavior.json", GOOD_MODEL, "null",
                                 "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                                 "{\"String\": \" \"}, \"behavior\": \"Sideways\", \"invert\": false}, " BYTE_LEVEL
                                 "]}"),
                 "behavior \"Sideways\"");
    EXPECT_FATAL(decode_bad_id, write_tokenizer("decode.json", GOOD_MODEL, "null", BYTE_LEVEL),
                 "cannot decode token id -1");
    test_ids_without_tokens_decode_to_nothing(weft_test_path("decode.json"));

    weft_test_remove_dir();
    printf("ok\n");
    return 0;
}
