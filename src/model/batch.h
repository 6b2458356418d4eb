// A packed micro-batch (DESIGN.md section 2): documents concatenated without padding.
#pragma once
#include "core/core.h"

typedef struct weft_batch {
    int T, n_docs;          // tokens, documents
    int32_t *tokens;        // (T)
    int32_t *positions;     // (T) restarting at 0 in each document
    int32_t *targets;       // (T) targets[t] = token t+1 of the same document if it is a target, else -1
    int32_t *cu_seqlens;    // (n_docs + 1)
    int n_targets;
    int capacity_tokens, capacity_docs;
} weft_batch;

void weft_batch_clear(weft_batch *b);
// Appends a document; loss_mask[t] = 1 marks token t as a target (loss_mask[0] is ignored; NULL
// means every token but the first).
void weft_batch_append(weft_batch *b, const int32_t *tokens, const uint8_t *loss_mask, int len);
void weft_batch_free(weft_batch *b);
