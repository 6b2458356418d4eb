// The files around a tokenizer.json: where its end-of-text token is named, and the byte-level
// tokenizer written out as files Hugging Face reads.
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "data/tokenizer_internal.h"

// The id of the token spelled s (an added token first, then the vocabulary); -1 if none.
static int id_of(const weft_tokenizer *t, const char *s) {
    size_t n = strlen(s);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, s, n)) return t->added[i].id;
    return t->bytes_only ? (strcmp(s, "<|endoftext|>") == 0 ? 256 : -1)
                         : weft_tok_smap_get(&t->vocab, s, n);
}

static json_t *load_beside(const char *dir, const char *name, char *path, size_t size) {
    snprintf(path, size, "%s/%s", dir, name);
    if (access(path, F_OK) != 0) return NULL;
    json_error_t err;
    // transformers writes model_max_length = 1e30 as an integer, which only fits as a double.
    json_t *root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &err);
    WEFT_CHECK(root && json_is_object(root), "%s: %s%s; it must be a JSON object, as "
               "transformers writes it", path, root ? "not an object" : "invalid JSON: ",
               root ? "" : err.text);
    return root;
}

// An "eos_token" of tokenizer_config.json: the token's text, or an AddedToken {"content": ...}.
static int eos_of_tokenizer_config(const weft_tokenizer *t, json_t *v, const char *path) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return -1;
    WEFT_CHECK(json_is_string(v), "%s: \"eos_token\" must be a string or {\"content\": ...}", path);
    int id = id_of(t, json_string_value(v));
    WEFT_CHECK(id >= 0, "%s: eos_token \"%s\" is not a token of %s; fix the file or give the "
               "matching tokenizer", path, json_string_value(v), t->path);
    return id;
}

// An "eos_token_id" of generation_config.json or config.json: an id or a list (the first).
static int eos_of_id_field(const weft_tokenizer *t, json_t *v, const char *path) {
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (!v || json_is_null(v)) return -1;
    double id = json_number_value(v);
    WEFT_CHECK(json_is_number(v) && id >= 0 && id < t->vocab_size && id == (int)id,
               "%s: \"eos_token_id\" must be an id of the tokenizer's vocabulary [0, %d) or a "
               "list of them", path, t->vocab_size);
    return (int)id;
}

static const char *const EOS_GUESSES[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>",
                                          "<\uFF5Cend\u2581of\u2581sentence\uFF5C>"};

void weft_tok_resolve_eos(weft_tokenizer *t, const char *dir) {
    static const char *const FILES[] = {"tokenizer_config.json", "generation_config.json",
                                        "config.json"};
    char path[4096];
    t->eos_id = -1;
    for (int f = 0; f < 3 && t->eos_id < 0; f++) {
        json_t *root = load_beside(dir, FILES[f], path, sizeof path);
        if (!root) continue;
        t->eos_id = f == 0 ? eos_of_tokenizer_config(t, json_object_get(root, "eos_token"), path)
                           : eos_of_id_field(t, json_object_get(root, "eos_token_id"), path);
        json_decref(root);
        if (t->eos_id >= 0) snprintf(t->eos_source, sizeof t->eos_source, "%s", FILES[f]);
    }
    // A bare tokenizer.json (none of those files beside it names one): its usual spellings.
    for (size_t g = 0; g < sizeof EOS_GUESSES / sizeof *EOS_GUESSES && t->eos_id < 0; g++)
        if ((t->eos_id = id_of(t, EOS_GUESSES[g])) >= 0)
            snprintf(t->eos_source, sizeof t->eos_source, "its name: no tokenizer_config.json, "
                     "generation_config.json or config.json beside the tokenizer names one");
}

void weft_tokenizer_describe(const weft_tokenizer *t, char *out, size_t size) {
    if (!t) {
        snprintf(out, size, "none (pre-tokenized data)");
        return;
    }
    int n = snprintf(out, size, "%s, vocab %d, ", t->path, t->vocab_size);
    if (n < 0 || (size_t)n >= size) return;
    if (t->eos_id < 0) snprintf(out + n, size - (size_t)n, "no end-of-text token");
    else snprintf(out + n, size - (size_t)n, "end of text id %d (from %s)", t->eos_id, t->eos_source);
}

// --------------------------------------------------------------------- byte-level as files ----

// The byte-level tokenizer as a tokenizer.json: BPE over GPT-2's byte alphabet with no merges
// (every byte its own token, id = the byte) and "<|endoftext|>" = 256 matched verbatim.
static json_t *byte_level_json(void) {
    weft_tok_byte_level_init();
    json_t *vocab = json_object();
    for (uint32_t cp = 0; cp < 512; cp++) {
        int b = weft_tok_byte_of_char(cp);
        if (b < 0) continue;
        char utf8[4] = {0};
        if (cp < 0x80) utf8[0] = (char)cp;
        else utf8[0] = (char)(0xC0 | (cp >> 6)), utf8[1] = (char)(0x80 | (cp & 0x3F));
        json_object_set_new(vocab, utf8, json_integer(b));
    }
    return json_pack(
        "{s:s, s:n, s:n, s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}], s:n, s:{s:b, s:b, s:b, s:s}, "
        "s:n, s:{s:b, s:b, s:b, s:s}, s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:o, s:[]}}",
        "version", "1.0", "truncation", "padding", "added_tokens", "id", 256, "content",
        "<|endoftext|>", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
        1, "normalizer", "pre_tokenizer", "add_prefix_space", 0, "trim_offsets", 1, "use_regex",
        0, "type", "ByteLevel", "post_processor", "decoder", "add_prefix_space", 0,
        "trim_offsets", 1, "use_regex", 0, "type", "ByteLevel", "model", "type", "BPE",
        "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
        0, "byte_fallback", 0, "vocab", vocab, "merges");
}

static bool write_json(json_t *root, const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    bool ok = text && weft_write_file_atomic(path, text, strlen(text));
    free(text);
    return ok;
}

bool weft_tokenizer_save_byte_level(const char *dir) {
    json_t *config = json_pack("{s:s, s:s, s:I, s:b}", "tokenizer_class",
                               "PreTrainedTokenizerFast", "eos_token", "<|endoftext|>",
                               "model_max_length", (json_int_t)1 << 30,
                               "clean_up_tokenization_spaces", 0);
    return write_json(byte_level_json(), dir, "tokenizer.json") &&
           write_json(config, dir, "tokenizer_config.json");
}
