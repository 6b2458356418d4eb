#include "parallel/dp.h"

#include <string.h>

enum { SHARD_ALIGN = 64 }; // elements: shards start on cache-line multiples

typedef struct bucket {
    size_t lo, hi;    // element range of the flat gradient buffer
    int first_param;  // lowest parameter index inside: ready once backward passed it
    weft_comm_request *req;
} bucket;

struct weft_dp {
    weft_comm *world;
    weft_model *model;
    bool sharded;
    int n_buckets, next_launch; // buckets launch in list order (reverse layout order)
    bucket *buckets;
    bool armed;
    float *shard_grad; // (shard) reduce-scatter target, distributed optimizer only
};

size_t weft_dp_pad_multiple(const weft_comm *world) {
    return (size_t)weft_comm_size(world) * SHARD_ALIGN;
}

// Buckets of about bucket_mb, built from the last parameter backwards so the first bucket is the
// first whose gradients backward completes.
static void build_buckets(weft_dp *dp, size_t bucket_elements) {
    weft_model *m = dp->model;
    dp->buckets = weft_alloc(sizeof(bucket) * m->n_params);
    size_t hi = m->n_padded;
    for (int i = m->n_params - 1; i >= 0; i--) {
        size_t lo = m->params[i].offset;
        if (hi - lo >= bucket_elements || i == 0) {
            dp->buckets[dp->n_buckets++] = (bucket){.lo = lo, .hi = hi, .first_param = i};
            hi = lo;
        }
    }
}

static void launch_bucket(weft_dp *dp) {
    bucket *b = &dp->buckets[dp->next_launch++];
    b->req = weft_comm_iallreduce_sum(dp->world, dp->model->grad_buf + b->lo, b->hi - b->lo,
                                      WEFT_COMM_F32);
}

static void on_grads_ready(void *ctx, int first_param) {
    weft_dp *dp = ctx;
    if (!dp->armed) return;
    while (dp->next_launch < dp->n_buckets && dp->buckets[dp->next_launch].first_param >= first_param)
        launch_bucket(dp);
}

weft_grad_hook weft_dp_grad_hook(weft_dp *dp) {
    return (weft_grad_hook){.ready = on_grads_ready, .ctx = dp};
}

weft_dp *weft_dp_create(weft_comm *world, weft_model *m, const weft_parallel_config *cfg) {
    weft_dp *dp = weft_alloc(sizeof *dp);
    dp->world = world;
    dp->model = m;
    dp->sharded = cfg->use_distributed_optimizer; // the one place the flag is read
    weft_comm_configure(world, cfg->debug_collectives, cfg->collective_timeout);
    WEFT_CHECK(m->n_padded % weft_dp_pad_multiple(world) == 0,
               "internal: model buffers are not padded for %d ranks", weft_comm_size(world));
    if (dp->sharded) {
        size_t shard = m->n_padded / (size_t)weft_comm_size(world);
        dp->shard_grad = m->be->alloc(m->be, shard * sizeof(float));
    } else {
        size_t elements = (size_t)(cfg->bucket_mb > 0 ? cfg->bucket_mb : 16) << 20 >> 2;
        build_buckets(dp, elements);
    }
    return dp;
}

void weft_dp_free(weft_dp *dp) {
    if (!dp) return;
    if (dp->shard_grad) dp->model->be->free(dp->model->be, dp->shard_grad);
    weft_free(dp->buckets);
    weft_free(dp);
}

bool weft_dp_is_sharded(const weft_dp *dp) { return dp->sharded; }

void weft_dp_owned_range(const weft_dp *dp, size_t *lo, size_t *hi) {
    size_t shard = dp->model->n_padded / (size_t)weft_comm_size(dp->world);
    *lo = shard * (size_t)weft_comm_rank(dp->world);
    *hi = *lo + shard;
}

weft_optimizer *weft_dp_create_optimizer(weft_dp *dp, const weft_optim_config *cfg) {
    weft_optim_range owned = {0, dp->model->n_padded};
    if (dp->sharded) weft_dp_owned_range(dp, &owned.lo, &owned.hi);
    return weft_optimizer_create(dp->model->be, cfg, &owned, 1, dp->model->param_buf);
}

void weft_dp_arm_last_microbatch(weft_dp *dp) {
    dp->armed = !dp->sharded;
    dp->next_launch = 0;
}

void weft_dp_finish_gradients(weft_dp *dp) {
    weft_model *m = dp->model;
    if (dp->sharded) {
        size_t lo, hi;
        weft_dp_owned_range(dp, &lo, &hi);
        weft_comm_reduce_scatter_sum(dp->world, m->grad_buf, dp->shard_grad, hi - lo, WEFT_COMM_F32);
        m->be->copy(m->be, m->grad_buf + lo, dp->shard_grad, (hi - lo) * sizeof(float));
        return;
    }
    // A rank whose backward did not launch every bucket (no documents this step) launches the
    // rest in the same order as everyone else.
    while (dp->next_launch < dp->n_buckets) launch_bucket(dp);
    for (int i = 0; i < dp->n_buckets; i++) weft_comm_wait(dp->buckets[i].req);
    dp->armed = false;
}

void weft_dp_gather_parameters(weft_dp *dp) {
    if (!dp->sharded) return;
    weft_model *m = dp->model;
    size_t lo, hi, esz = weft_dtype_size(m->be->param_dtype);
    weft_dp_owned_range(dp, &lo, &hi);
    weft_comm_allgather(dp->world, (char *)m->param_buf + lo * esz, m->param_buf, hi - lo,
                        weft_comm_type_of(m->be->param_dtype));
}

void weft_dp_gather_gradients(weft_dp *dp) {
    if (!dp->sharded) return;
    size_t lo, hi;
    weft_dp_owned_range(dp, &lo, &hi);
    weft_comm_allgather(dp->world, dp->model->grad_buf + lo, dp->model->grad_buf, hi - lo,
                        WEFT_COMM_F32);
}
