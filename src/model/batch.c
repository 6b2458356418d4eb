#include "model/batch.h"

#include <string.h>

static void *grow(void *p, size_t old_bytes, size_t new_bytes) {
    void *q = weft_alloc(new_bytes);
    if (p) memcpy(q, p, old_bytes);
    weft_free(p);
    return q;
}

void weft_batch_clear(weft_batch *b) {
    b->T = b->n_docs = b->n_targets = 0;
    memset(b->n_mtp_targets, 0, sizeof b->n_mtp_targets);
    if (!b->cu_seqlens) {
        b->capacity_docs = 16;
        b->cu_seqlens = weft_alloc(sizeof(int32_t) * (b->capacity_docs + 1));
    }
    b->cu_seqlens[0] = 0;
}

void weft_batch_append(weft_batch *b, const int32_t *tokens, const uint8_t *loss_mask, int len) {
    if (!b->cu_seqlens) weft_batch_clear(b);
    if (b->T + len > b->capacity_tokens) {
        int cap = b->capacity_tokens ? b->capacity_tokens : 256;
        while (cap < b->T + len) cap *= 2;
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
        b->cu_seqlens = grow(b->cu_seqlens, sizeof(int32_t) * (b->capacity_docs + 1),
                             sizeof(int32_t) * (2 * b->capacity_docs + 1));
        b->capacity_docs *= 2;
    }
    for (int t = 0; t < len; t++) {
        int i = b->T + t;
        b->tokens[i] = tokens[t];
        b->positions[i] = t;
        // Position t predicts token t+1: the target sits on the row whose logits predict it.
        bool next_is_target = t + 1 < len && (loss_mask ? loss_mask[t + 1] != 0 : true);
        b->targets[i] = next_is_target ? tokens[t + 1] : -1;
        b->n_targets += next_is_target;
    }
    for (int k = 1; k <= b->mtp_depth; k++) {
        int32_t *in = b->mtp_inputs + (size_t)(k - 1) * b->capacity_tokens + b->T;
        int32_t *tg = b->mtp_targets + (size_t)(k - 1) * b->capacity_tokens + b->T;
        for (int t = 0; t < len; t++) {
            in[t] = t + k < len ? tokens[t + k] : 0; // Megatron's roll fills with token 0
            int j = t + k + 1;
            bool target = j < len && (loss_mask ? loss_mask[j] != 0 : true);
            tg[t] = target ? tokens[j] : -1;
            b->n_mtp_targets[k - 1] += target;
        }
    }
    b->T += len;
    b->n_docs++;
    b->cu_seqlens[b->n_docs] = b->T;
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
    memset(b, 0, sizeof *b);
}
