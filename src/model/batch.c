#include "model/batch.h"

#include <string.h>

static void *grow(void *p, size_t old_bytes, size_t new_bytes) {
    void *q = weft_alloc(new_bytes);
    if (p) memcpy(q, p, old_bytes);
    weft_free(p);
    return q;
}

void weft_batch_clear(weft_batch *b) {
    b->T = b->T_kv = b->n_docs = b->n_targets = 0;
    memset(b->n_mtp_targets, 0, sizeof b->n_mtp_targets);
    if (!b->cu_seqlens) {
        b->capacity_docs = 16;
        b->cu_seqlens = weft_alloc(sizeof(int32_t) * (b->capacity_docs + 1));
        b->cu_seqlens_kv = weft_alloc(sizeof(int32_t) * (b->capacity_docs + 1));
    }
    b->cu_seqlens[0] = b->cu_seqlens_kv[0] = 0;
}

static void reserve(weft_batch *b, int rows) {
    if (!b->cu_seqlens) weft_batch_clear(b);
    if (b->T + rows > b->capacity_tokens) {
        int cap = b->capacity_tokens ? b->capacity_tokens : 256;
        while (cap < b->T + rows) cap *= 2;
        size_t old = sizeof(int32_t) * b->capacity_tokens, now = sizeof(int32_t) * cap;
        b->tokens = grow(b->tokens, old, now);
        b->positions = grow(b->positions, old, now);
        b->targets = grow(b->targets, old, now);
        if (b->mtp_depth > 0) {
            // Rows keep their stride = capacity, so each row moves to its new place.
            int32_t *in = weft_alloc(now * b->mtp_depth), *tg = weft_alloc(now * b->mtp_depth);
            for (int k = 0; k < b->mtp_depth && b->mtp_inputs; k++) {
                memcpy(in + (size_t)k * cap, b->mtp_inputs + (size_t)k * b->capacity_tokens, old);
                memcpy(tg + (size_t)k * cap, b->mtp_targets + (size_t)k * b->capacity_tokens, old);
            }
            weft_free(b->mtp_inputs);
            weft_free(b->mtp_targets);
            b->mtp_inputs = in, b->mtp_targets = tg;
        }
        b->capacity_tokens = cap;
    }
    if (b->n_docs + 1 > b->capacity_docs) {
        size_t old = sizeof(int32_t) * (b->capacity_docs + 1), now = sizeof(int32_t) * (2 * b->capacity_docs + 1);
        b->cu_seqlens = grow(b->cu_seqlens, old, now);
        b->cu_seqlens_kv = grow(b->cu_seqlens_kv, old, now);
        b->capacity_docs *= 2;
    }
}

static bool is_target(const uint8_t *loss_mask, int len, int j) {
    return j < len && (loss_mask ? loss_mask[j] != 0 : true);
}

// Row i of the batch holds position p of a document of len tokens; p >= len is padding: token 0,
// no target at any depth.
static void fill_row(weft_batch *b, int i, const int32_t *tokens, const uint8_t *loss_mask,
                     int len, int p) {
    b->tokens[i] = p < len ? tokens[p] : 0;
    b->positions[i] = p;
    // Position p predicts token p+1: the target sits on the row whose logits predict it.
    bool next = is_target(loss_mask, len, p + 1);
    b->targets[i] = next ? tokens[p + 1] : -1;
    b->n_targets += next;
    for (int k = 1; k <= b->mtp_depth; k++) {
        int32_t *in = b->mtp_inputs + (size_t)(k - 1) * b->capacity_tokens;
        int32_t *tg = b->mtp_targets + (size_t)(k - 1) * b->capacity_tokens;
        in[i] = p + k < len ? tokens[p + k] : 0; // Megatron's roll fills with token 0
        bool target = is_target(loss_mask, len, p + k + 1);
        tg[i] = target ? tokens[p + k + 1] : -1;
        b->n_mtp_targets[k - 1] += target;
    }
}

void weft_batch_append_chunks(weft_batch *b, const int32_t *tokens, const uint8_t *loss_mask,
                              int len, int kv_len, const int *chunk_start, int n_chunks,
                              int chunk_len) {
    reserve(b, n_chunks * chunk_len);
    for (int c = 0; c < n_chunks; c++)
        for (int t = 0; t < chunk_len; t++)
            fill_row(b, b->T++, tokens, loss_mask, len, chunk_start[c] + t);
    b->T_kv += kv_len;
    b->n_docs++;
    b->cu_seqlens[b->n_docs] = b->T;
    b->cu_seqlens_kv[b->n_docs] = b->T_kv;
}

void weft_batch_append(weft_batch *b, const int32_t *tokens, const uint8_t *loss_mask, int len) {
    int start = 0;
    weft_batch_append_chunks(b, tokens, loss_mask, len, len, &start, 1, len);
}

const int32_t *weft_batch_mtp_inputs(const weft_batch *b, int k) {
    return b->mtp_inputs + (size_t)(k - 1) * b->capacity_tokens;
}
const int32_t *weft_batch_mtp_targets(const weft_batch *b, int k) {
    return b->mtp_targets + (size_t)(k - 1) * b->capacity_tokens;
}

void weft_batch_free(weft_batch *b) {
    weft_free(b->mtp_inputs);
    weft_free(b->mtp_targets);
    weft_free(b->tokens);
    weft_free(b->positions);
    weft_free(b->targets);
    weft_free(b->cu_seqlens);
    weft_free(b->cu_seqlens_kv);
    memset(b, 0, sizeof *b);
}
