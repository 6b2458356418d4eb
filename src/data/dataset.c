#include "data/dataset.h"

#include <string.h>

#include "data/synthetic.h"

static weft_document_set *synthetic_set(const weft_dataset_options *o, const weft_tokenizer *tok) {
    weft_document_set *set = weft_alloc(sizeof *set);
    set->n = o->synthetic_documents;
    WEFT_CHECK(set->n > 0, "data.synthetic_documents must be at least 1");
    set->docs = weft_alloc(sizeof(weft_document) * set->n);
    weft_rng rng;
    weft_rng_seed(&rng, o->seed ^ 0x5eed5eedULL);
    char prompt[1024], response[4096];
    for (int i = 0; i < set->n; i++) {
        weft_synthetic_addition(&rng, prompt, sizeof prompt, response, sizeof response);
        set->docs[i] = weft_encode_document(tok, prompt, response);
        set->docs[i].line = i + 1;
    }
    return set;
}

// Cuts or rejects documents over the micro-batch budget, so a plan never meets one.
static void enforce_max_len(weft_document_set *set, const weft_dataset_options *o) {
    for (int i = 0; i < set->n; i++) {
        weft_document *d = &set->docs[i];
        if (d->len <= o->max_len) continue;
        WEFT_CHECK(o->truncate,
                   "%s: document %d has %d tokens, more than the limit of %d set by %s; "
                   "raise the budget or set data.truncate=true",
                   o->source, i + 1, d->len, o->max_len, o->max_len_why);
        d->len = o->max_len;
    }
}

weft_document_set *weft_dataset_load(const weft_dataset_options *o, const weft_tokenizer *tok) {
    bool synthetic = strcmp(o->source, "synthetic") == 0;
    WEFT_CHECK(tok || !synthetic, "data.source=synthetic is text and no tokenizer is set: %s",
               WEFT_NO_TOKENIZER_HINT);
    weft_document_set *set = synthetic ? synthetic_set(o, tok)
                                     : weft_read_jsonl_dataset(o->source, tok, o->vocab_size);
    if (o->max_len > 0) enforce_max_len(set, o);
    return set;
}
