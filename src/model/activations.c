// The activation arena: one device allocation per model, carved into every buffer a pass uses.
// Every byte of activations lives in it, so its size is the pass's activation memory.
#include "model/internal.h"

// Hands out 64-byte-aligned slices of the arena; with arena == NULL it only measures.
static void *take(weft_activations *a, size_t bytes) {
    size_t at = (a->used + 63) / 64 * 64;
    a->used = at + bytes;
    return a->arena ? a->arena + at : NULL;
}

// Keys and values (or their gradients) as one (2, rows, width) block, so the context-parallel
// exchange moves both in one collective: *k gets the first half, *v the second.
static void take_kv(weft_activations *a, size_t half_bytes, void **k, void **v) {
    *k = take(a, 2 * half_bytes);
    *v = *k ? (char *)*k + half_bytes : NULL;
}

static void carve_layer_inner(weft_activations *a, layer_acts *la, dims d, size_t esz,
                              bool qk_norm) {
    size_t T = (size_t)d.T;
    la->ln1 = take(a, esz * T * d.C);
    la->q = take(a, esz * T * d.qd);
    take_kv(a, esz * T * d.kvd, &la->k, &la->v);
    if (qk_norm) {
        la->q_pre = take(a, esz * T * d.qd);
        la->k_pre = take(a, esz * T * d.kvd);
        la->rstd_q = take(a, sizeof(float) * T * d.H);
        la->rstd_k = take(a, sizeof(float) * T * d.KV);
    }
    la->att = take(a, esz * T * d.qd);
    la->lse = take(a, sizeof(float) * T * d.H);
    la->rstd1 = take(a, sizeof(float) * T);
    la->res1 = take(a, esz * T * d.C);
    la->ln2 = take(a, esz * T * d.C);
    la->rstd2 = take(a, sizeof(float) * T);
    la->gate_up = take(a, esz * T * 2 * d.I);
    la->act = take(a, esz * T * d.I);
}

static void carve_mtp(weft_activations *a, mtp_acts *mk, dims d, size_t esz, bool backward) {
    size_t row = esz * d.T * d.C, f32 = sizeof(float) * d.T, ids = sizeof(int32_t) * d.T;
    mk->emb = take(a, row), mk->en = take(a, row), mk->hn = take(a, row);
    mk->out = take(a, row), mk->h = take(a, row);
    mk->d_head = backward ? take(a, row) : NULL;
    mk->rstd_e = take(a, f32), mk->rstd_h = take(a, f32), mk->rstd_f = take(a, f32);
    mk->inputs = take(a, ids), mk->targets = take(a, ids);
}

// The gradients a backward works in, one layer's worth.
static void carve_gradients(weft_activations *a, dims d, size_t esz, bool qk_norm) {
    size_t row = esz * d.T * d.C, inner = esz * d.T * d.I;
    a->d_head0 = take(a, row);
    a->d_res = take(a, row);
    a->d_ln = take(a, row);
    a->d_aux = take(a, row);
    a->d_carry = take(a, row);
    a->d_att = take(a, esz * d.T * d.qd);
    a->d_q = take(a, esz * d.T * d.qd);
    take_kv(a, esz * d.T * d.kvd, &a->d_k, &a->d_v);
    a->d_qk_pre = qk_norm ? take(a, esz * d.T * d.qd) : NULL; // qd >= kvd: q's and k's in turn
    a->d_act = take(a, inner);
    a->d_gate_up = take(a, 2 * inner);
}

static void carve(weft_activations *a, const weft_model_config *c, keep_mode keep, dims d,
                  bool provider, size_t esz) {
    size_t row = esz * d.T * d.C, f32 = sizeof(float) * d.T, ids = sizeof(int32_t) * d.T;
    bool backward = keep != KEEP_NONE;
    a->used = 0;
    for (int l = 0; l < c->num_layers + c->num_mtp; l++) {
        layer_acts *la = &a->layers[l];
        *la = (layer_acts){0};
        if (backward) la->x_in = take(a, row);
        if (keep == KEEP_ALL) carve_layer_inner(a, la, d, esz, c->qk_norm);
    }
    if (keep != KEEP_ALL) {
        a->scratch = (layer_acts){0};
        carve_layer_inner(a, &a->scratch, d, esz, c->qk_norm);
    }
    a->ping[0] = a->ping[1] = NULL;
    if (!backward) a->ping[0] = take(a, row), a->ping[1] = take(a, row);
    for (int k = 0; k < c->num_mtp; k++) {
        if (backward || k == 0) carve_mtp(a, &a->mtp[k], d, esz, backward);
        else a->mtp[k] = a->mtp[0];
    }
    a->x_out = take(a, row);
    a->lnf = take(a, row);
    a->qkv = take(a, esz * d.T * (d.qd + 2 * d.kvd));
    a->logits = take(a, esz * d.logits_rows * c->vocab_size);
    a->rstdf = take(a, f32);
    a->row_loss = take(a, f32);
    a->correct = take(a, f32);
    if (backward) carve_gradients(a, d, esz, c->qk_norm);
    // The batch's index arrays and (generation) the head's rows, one after another: upload_batch
    // (passes.c) sends their span.
    a->tokens = take(a, ids);
    a->positions = take(a, ids);
    a->targets = take(a, ids);
    a->cu_seqlens = take(a, sizeof(int32_t) * (d.n_docs + 1));
    a->cu_seqlens_kv = take(a, sizeof(int32_t) * (d.n_docs + 1));
    a->head_rows = backward ? NULL : take(a, ids);
    a->head_input = backward ? NULL : take(a, row);
    a->k_full = a->v_full = a->dk_full = a->dv_full = NULL;
    if (provider) {
        take_kv(a, esz * d.T_kv * d.kvd, &a->k_full, &a->v_full);
        take_kv(a, esz * d.T_kv * d.kvd, &a->dk_full, &a->dv_full);
    }
}

static void alloc_tables(weft_activations *a, const weft_model_config *c) {
    a->layers = weft_alloc(sizeof(layer_acts) * (c->num_layers + c->num_mtp));
    a->mtp = weft_alloc(sizeof(mtp_acts) * (c->num_mtp > 0 ? c->num_mtp : 1));
}

// Measures the layout and grows the arena to it; returns the arena's activations, laid out only
// by measurement (arena pointers NULL) until carved again.
static weft_activations *grow(weft_model *m, keep_mode keep, dims d, bool provider) {
    weft_activations *a = m->acts;
    if (!a) {
        a = m->acts = weft_alloc(sizeof *a);
        alloc_tables(a, &m->cfg);
    }
    char *arena = a->arena;
    a->arena = NULL;
    carve(a, &m->cfg, keep, d, provider, weft_dtype_size(m->be->act_dtype));
    if (a->used > a->capacity) {
        if (arena) m->be->free(m->be, arena);
        arena = m->be->alloc(m->be, a->used);
        a->capacity = a->used;
    }
    a->arena = arena;
    return a;
}

void weft_activations_reserve(weft_model *m, keep_mode keep, dims d, bool provider) {
    weft_activations *a = grow(m, keep, d, provider);
    if (a->used > a->peak) a->peak = a->used;
}

weft_activations *weft_activations_prepare(weft_model *m, keep_mode keep, dims d, bool provider) {
    weft_activations *a = grow(m, keep, d, provider);
    carve(a, &m->cfg, keep, d, provider, weft_dtype_size(m->be->act_dtype));
    if (a->used > a->peak) a->peak = a->used;
    a->keep = keep;
    a->d = d;
    a->kv_full_layer = -1;
    return a;
}

size_t weft_activations_bytes(const weft_model *m, keep_mode keep, dims d, bool provider) {
    weft_activations a = {0};
    alloc_tables(&a, &m->cfg);
    carve(&a, &m->cfg, keep, d, provider, weft_dtype_size(m->be->act_dtype));
    weft_free(a.layers);
    weft_free(a.mtp);
    return a.used;
}

void weft_activations_release(weft_model *m) {
    weft_activations *a = m->acts;
    if (!a || !a->arena) return;
    m->be->free(m->be, a->arena);
    a->arena = NULL, a->capacity = 0;
}

void weft_activations_free(weft_model *m) {
    weft_activations *a = m->acts;
    if (!a) return;
    if (a->arena) m->be->free(m->be, a->arena);
    weft_free(a->layers);
    weft_free(a->mtp);
    weft_free(a);
    m->acts = NULL;
}
