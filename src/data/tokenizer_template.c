// The post_processor of a tokenizer.json: the special tokens Hugging Face's encode(text) puts
// around a text's ids by default (add_special_tokens=True). Llama 3's TemplateProcessing puts
// <|begin_of_text|> first, Qwen's ByteLevel puts nothing. Llama models are trained with that
// token at position 0 and go astray without it, so prompts and documents from text get it here
// as transformers and vLLM give it to them.
#include <jansson.h>
#include <string.h>

#include "core/core.h"
#include "data/tokenizer_internal.h"

static void add_ids(weft_tokenizer *t, bool after, const int32_t *ids, int n, const char *what) {
    int *count = after ? &t->n_suffix : &t->n_prefix;
    int32_t *into = after ? t->suffix : t->prefix;
    if (*count + n > WEFT_TOK_TEMPLATE_MAX)
        weft_fatal("%s: the post_processor puts more than %d special tokens %s a text (%s)", t->path,
                   WEFT_TOK_TEMPLATE_MAX, after ? "after" : "before", what);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            weft_fatal("%s: the post_processor's special token %s has id %d, outside the "
                       "vocabulary [0, %d)", t->path, what, ids[i], t->vocab_size);
        into[(*count)++] = ids[i];
    }
}

// TemplateProcessing's "single" template: the special tokens before and after its "$A".
static void parse_template(weft_tokenizer *t, json_t *pp) {
    json_t *single = json_object_get(pp, "single"), *specials = json_object_get(pp, "special_tokens");
    if (!json_is_array(single))
        weft_fatal("%s: post_processor TemplateProcessing has no \"single\" template", t->path);
    bool after = false;
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item) {
        if (json_object_get(item, "Sequence")) {
            if (after) weft_fatal("%s: the post_processor's single template holds two sequences", t->path);
            after = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(json_object_get(item, "SpecialToken"), "id"));
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            weft_fatal("%s: an item of the post_processor's single template is neither a sequence "
                       "nor a special token listed with its ids in \"special_tokens\"", t->path);
        size_t k;
        json_t *id;
        json_array_foreach(ids, k, id) {
            int32_t v = json_is_integer(id) ? (int32_t)json_integer_value(id) : -1;
            add_ids(t, after, &v, 1, name);
        }
    }
    if (!after) weft_fatal("%s: the post_processor's single template has no sequence ($A)", t->path);
}

// RobertaProcessing's and BertProcessing's "cls" (before) or "sep" (after): [token, id].
static void parse_pair(weft_tokenizer *t, json_t *pp, const char *key, bool after) {
    json_t *pair = json_object_get(pp, key), *id = json_array_get(pair, 1);
    const char *name = json_string_value(json_array_get(pair, 0));
    if (!name || !json_is_integer(id))
        weft_fatal("%s: post_processor needs \"%s\": [token, id]", t->path, key);
    int32_t v = (int32_t)json_integer_value(id);
    add_ids(t, after, &v, 1, name);
}

void weft_tok_parse_post_processor(weft_tokenizer *t, json_t *pp) {
    if (!pp || json_is_null(pp)) return;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!type) weft_fatal("%s: post_processor has no \"type\"", t->path);
    if (!strcmp(type, "Sequence")) {
        // Each processor wraps what the ones before it made.
        json_t *list = json_object_get(pp, "processors");
        if (!json_is_array(list)) weft_fatal("%s: post_processor Sequence has no \"processors\"", t->path);
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) {
            weft_tokenizer inner = {.path = t->path, .vocab_size = t->vocab_size};
            weft_tok_parse_post_processor(&inner, item);
            int32_t prefix[WEFT_TOK_TEMPLATE_MAX];
            int n = t->n_prefix;
            memcpy(prefix, t->prefix, sizeof(int32_t) * (size_t)n);
            t->n_prefix = 0;
            add_ids(t, false, inner.prefix, inner.n_prefix, "of a Sequence");
            add_ids(t, false, prefix, n, "of a Sequence");
            add_ids(t, true, inner.suffix, inner.n_suffix, "of a Sequence");
        }
    } else if (!strcmp(type, "TemplateProcessing")) {
        parse_template(t, pp);
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        parse_pair(t, pp, "cls", false);
        parse_pair(t, pp, "sep", true);
    } else if (strcmp(type, "ByteLevel") != 0) { // ByteLevel only trims offsets
        weft_fatal("%s: post_processor \"%s\" is not supported (weft supports TemplateProcessing, "
                   "ByteLevel, RobertaProcessing, BertProcessing and a Sequence of them)", t->path,
                   type);
    }
}

void weft_tokenizer_template(const weft_tokenizer *t, const int32_t **before, int *n_before,
                             const int32_t **after, int *n_after) {
    *before = t->prefix, *n_before = t->n_prefix;
    *after = t->suffix, *n_after = t->n_suffix;
}

bool weft_tokenizer_starts_with_template(const weft_tokenizer *t, const int32_t *ids, int n) {
    return t->n_prefix > 0 && n >= t->n_prefix &&
           !memcmp(ids, t->prefix, sizeof(int32_t) * (size_t)t->n_prefix);
}

int32_t *weft_tokenizer_encode_special(const weft_tokenizer *t, const char *text, size_t len,
                                       int *n_out) {
    int n;
    int32_t *ids = weft_tokenizer_encode(t, text, len, &n);
    int before = weft_tokenizer_starts_with_template(t, ids, n) ? 0 : t->n_prefix;
    int total = before + n + t->n_suffix;
    int32_t *out = weft_alloc(sizeof(int32_t) * (size_t)(total > 0 ? total : 1));
    memcpy(out, t->prefix, sizeof(int32_t) * (size_t)before);
    memcpy(out + before, ids, sizeof(int32_t) * (size_t)n);
    memcpy(out + before + n, t->suffix, sizeof(int32_t) * (size_t)t->n_suffix);
    weft_free(ids);
    *n_out = total;
    return out;
}
