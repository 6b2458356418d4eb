// data: the training documents of a job, tokenized, with their loss masks.
#pragma once
#include "core/core.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"

typedef struct weft_dataset_options {
    const char *source;      // "synthetic" or a JSONL file
    int synthetic_documents; // how many problems the synthetic task generates
    uint64_t seed;
    int max_len;             // a document longer than this is an error, or cut when truncate
    const char *max_len_why; // the settings that make max_len, for the error
    bool truncate;
    int vocab_size;          // the model's: pre-tokenized ids must lie below it
} weft_dataset_options;

// JSONL lines may be {"text": ...} (every token a target), {"prompt": ..., "response": ...} (only
// response tokens are targets; an end-of-text token closes the response) or pre-tokenized
// {"input_ids": [...], "loss_mask": [...]}. tok may be NULL (a model directory without a
// tokenizer): then only pre-tokenized lines are read, and text is an error that says so.
weft_document_set *weft_dataset_load(const weft_dataset_options *o, const weft_tokenizer *tok);
