// A packed micro-batch (DESIGN.md section 2): documents concatenated without padding.
#pragma once
#include "core/core.h"
#include "model/config.h"

typedef struct weft_batch {
    int T, n_docs;          // tokens, documents
    int32_t *tokens;        // (T)
    int32_t *positions;     // (T) restarting at 0 in each document
    int32_t *targets;       // (T) targets[t] = token t+1 of the same document if it is a target, else -1
    int32_t *cu_seqlens;    // (n_docs + 1) rows of each document in this batch
    // Key rows attention sees per document: the whole document, padded, when context parallelism
    // holds only chunks of it here (DESIGN.md section 6); otherwise the same as cu_seqlens.
    int T_kv;
    int32_t *cu_seqlens_kv; // (n_docs + 1)
    int n_targets;
    // Multi-token prediction, depths k = 1..mtp_depth, rows of capacity_tokens entries:
    // mtp_inputs[k-1][t] = token t+k of the document (0 past its end), mtp_targets[k-1][t] = token
    // t+k+1 when it is a target, else -1. Set mtp_depth before the first append.
    int mtp_depth;
    int32_t *mtp_inputs, *mtp_targets;
    int n_mtp_targets[WEFT_MAX_MTP];
    int capacity_tokens, capacity_docs;
} weft_batch;

// Row k (1-based depth) of the MTP inputs / targets, T entries.
const int32_t *weft_batch_mtp_inputs(const weft_batch *b, int k);
const int32_t *weft_batch_mtp_targets(const weft_batch *b, int k);

void weft_batch_clear(weft_batch *b);
// Appends a document; loss_mask[t] = 1 marks token t as a target (loss_mask[0] is ignored; NULL
// means every token but the first).
void weft_batch_append(weft_batch *b, const int32_t *tokens, const uint8_t *loss_mask, int len);
// Appends chunks of a document padded to kv_len >= len tokens: rows for positions
// chunk_start[c] .. chunk_start[c] + chunk_len - 1 of each chunk c, in that order. Positions keep
// their place in the whole document; those past len are padding (token 0, never a target).
void weft_batch_append_chunks(weft_batch *b, const int32_t *tokens, const uint8_t *loss_mask,
                              int len, int kv_len, const int *chunk_start, int n_chunks,
                              int chunk_len);
void weft_batch_free(weft_batch *b);
