#include "optim/adamw.h"

#include <math.h>
#include <string.h>

weft_optim_config weft_optim_config_default(void) {
    return (weft_optim_config){.lr = 1e-3, .min_lr = 0.0, .beta1 = 0.9, .beta2 = 0.95,
                               .eps = 1e-8, .weight_decay = 0.1, .clip_grad = 1.0,
                               .warmup_steps = 0, .total_steps = 1};
}

double weft_lr_at(const weft_optim_config *c, int step) {
    if (c->warmup_steps > 0 && step <= c->warmup_steps)
        return c->lr * step / c->warmup_steps;
    int decay_steps = c->total_steps - c->warmup_steps;
    double progress = (double)(step - c->warmup_steps) / (decay_steps > 1 ? decay_steps : 1);
    if (progress > 1.0) progress = 1.0;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * progress));
}

weft_optimizer *weft_optimizer_create(weft_backend *be, const weft_optim_config *cfg,
                                      const weft_optim_range *ranges, int n_ranges,
                                      const void *params) {
    weft_optimizer *o = weft_alloc(sizeof *o);
    *o = (weft_optimizer){.be = be, .cfg = *cfg, .n_ranges = n_ranges};
    o->ranges = weft_alloc(sizeof *ranges * (n_ranges > 0 ? n_ranges : 1));
    memcpy(o->ranges, ranges, sizeof *ranges * n_ranges);
    for (int r = 0; r < n_ranges; r++) o->numel += ranges[r].hi - ranges[r].lo;
    size_t n = o->numel;
    o->m = be->alloc(be, n * sizeof(float));
    o->v = be->alloc(be, n * sizeof(float));
    if (be->param_dtype != WEFT_F32) {
        // Low-precision parameters keep an fp32 master copy of the elements the optimizer owns.
        float *host = weft_alloc(n * sizeof(float)), *at = host;
        size_t esz = weft_dtype_size(be->param_dtype);
        for (int r = 0; r < n_ranges; at += ranges[r].hi - ranges[r].lo, r++)
            be->to_f32(be, at, (const char *)params + ranges[r].lo * esz, be->param_dtype,
                       ranges[r].hi - ranges[r].lo);
        o->master = be->alloc(be, n * sizeof(float));
        be->to_device(be, o->master, host, n * sizeof(float));
        weft_free(host);
    }
    return o;
}

void weft_optimizer_free(weft_optimizer *o) {
    if (!o) return;
    o->be->free(o->be, o->m);
    o->be->free(o->be, o->v);
    if (o->master) o->be->free(o->be, o->master);
    if (o->host_state && o->be->host_free) o->be->host_free(o->be, o->host_state);
    else weft_free(o->host_state);
    weft_free(o->ranges);
    weft_free(o);
}

// m and v, and the fp32 master copy of low-precision parameters.
static int state_count(const weft_optimizer *o) { return o->be->param_dtype != WEFT_F32 ? 3 : 2; }

size_t weft_optimizer_state_bytes(const weft_optimizer *o) {
    return o->numel * sizeof(float) * (size_t)state_count(o);
}

void weft_optimizer_offload(weft_optimizer *o) {
    WEFT_CHECK(!o->offloaded, "internal: offloading an optimizer state that is offloaded");
    float **state[] = {&o->m, &o->v, &o->master};
    size_t bytes = weft_optimizer_state_bytes(o);
    if (!o->host_state)
        o->host_state = o->be->host_alloc ? o->be->host_alloc(o->be, bytes) : weft_alloc(bytes);
    for (int i = 0, count = state_count(o); i < count; i++) {
        o->be->to_host(o->be, o->host_state + i * o->numel, *state[i], o->numel * sizeof(float));
        o->be->free(o->be, *state[i]);
        *state[i] = NULL;
    }
    o->offloaded = true;
}

void weft_optimizer_reload(weft_optimizer *o) {
    WEFT_CHECK(o->offloaded, "internal: reloading an optimizer state that is not offloaded");
    float **state[] = {&o->m, &o->v, &o->master};
    for (int i = 0, count = state_count(o); i < count; i++) {
        *state[i] = o->be->alloc(o->be, o->numel * sizeof(float));
        o->be->to_device(o->be, *state[i], o->host_state + i * o->numel, o->numel * sizeof(float));
    }
    o->offloaded = false;
}

double weft_clip_factor(const weft_optim_config *c, double grad_norm) {
    if (c->clip_grad <= 0) return 1.0;
    double f = c->clip_grad / (grad_norm + 1e-6);
    return f < 1.0 ? f : 1.0;
}

// AdamW on elements [a, b) of the flat buffer, whose state starts at element k of m, v, master.
static void update(weft_optimizer *o, void *params, const float *grads, size_t a, size_t b,
                   size_t k, double lr, bool decays) {
    size_t esz = weft_dtype_size(o->be->param_dtype);
    o->be->adamw(o->be, (char *)params + a * esz, o->master ? o->master + k : NULL, grads + a,
                 o->m + k, o->v + k, b - a, (float)lr, (float)o->cfg.beta1, (float)o->cfg.beta2,
                 (float)o->cfg.eps, decays ? (float)o->cfg.weight_decay : 0.0f, o->step);
}

double weft_optimizer_step(weft_optimizer *o, void *params, const float *grads,
                           const weft_optim_segment *segs, int n_segs) {
    WEFT_CHECK(!o->offloaded, "internal: an optimizer step while its state is offloaded");
    o->step++;
    double lr = weft_lr_at(&o->cfg, o->step);
    size_t k = 0; // where the current range's state starts
    for (int r = 0; r < o->n_ranges; k += o->ranges[r].hi - o->ranges[r].lo, r++)
        for (int i = 0; i < n_segs; i++) {
            // The part of this tensor that falls in the range.
            size_t lo = o->ranges[r].lo, hi = o->ranges[r].hi, end = segs[i].offset + segs[i].numel;
            size_t a = segs[i].offset > lo ? segs[i].offset : lo, b = end < hi ? end : hi;
            if (a < b) update(o, params, grads, a, b, k + a - lo, lr, segs[i].weight_decay);
        }
    return lr;
}
