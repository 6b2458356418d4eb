#include "optim/adamw.h"

#include <math.h>

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

weft_optimizer *weft_optimizer_create(weft_backend *be, const weft_optim_config *cfg, size_t lo,
                                      size_t hi, const void *params) {
    weft_optimizer *o = weft_alloc(sizeof *o);
    *o = (weft_optimizer){.be = be, .cfg = *cfg, .lo = lo, .hi = hi};
    size_t n = hi - lo;
    o->m = be->alloc(be, n * sizeof(float));
    o->v = be->alloc(be, n * sizeof(float));
    if (be->param_dtype != WEFT_F32) {
        // Low-precision parameters keep an fp32 master copy of the shard the optimizer owns.
        float *host = weft_alloc(n * sizeof(float));
        be->to_f32(be, host, (const char *)params + lo * weft_dtype_size(be->param_dtype),
                   be->param_dtype, n);
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
    weft_free(o);
}

size_t weft_optimizer_state_bytes(const weft_optimizer *o) {
    return (o->hi - o->lo) * sizeof(float) * (o->master ? 3 : 2);
}

double weft_clip_factor(const weft_optim_config *c, double grad_norm) {
    if (c->clip_grad <= 0) return 1.0;
    double f = c->clip_grad / (grad_norm + 1e-6);
    return f < 1.0 ? f : 1.0;
}

double weft_optimizer_step(weft_optimizer *o, void *params, const float *grads,
                           const weft_optim_segment *segs, int n_segs) {
    o->step++;
    double lr = weft_lr_at(&o->cfg, o->step);
    size_t esz = weft_dtype_size(o->be->param_dtype);
    for (int i = 0; i < n_segs; i++) {
        // The part of this tensor that falls in [lo, hi).
        size_t a = segs[i].offset > o->lo ? segs[i].offset : o->lo;
        size_t b = segs[i].offset + segs[i].numel < o->hi ? segs[i].offset + segs[i].numel : o->hi;
        if (a >= b) continue;
        size_t k = a - o->lo;
        o->be->adamw(o->be, (char *)params + a * esz, o->master ? o->master + k : NULL, grads + a,
                     o->m + k, o->v + k, b - a, (float)lr, (float)o->cfg.beta1,
                     (float)o->cfg.beta2, (float)o->cfg.eps,
                     segs[i].weight_decay ? (float)o->cfg.weight_decay : 0.0f, o->step);
    }
    return lr;
}
