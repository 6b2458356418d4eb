#include "parallel/dp.h"

#include <string.h>

enum { SHARD_ALIGN = 64 }; // elements: slices start on cache-line multiples

typedef struct bucket {
    size_t lo, hi;   // element range of the flat gradient buffer
    int first_param; // the parameter holding element lo: ready once backward has finished it
    weft_comm_request *req;
} bucket;

struct weft_dp {
    weft_comm *world;
    weft_model *model;
    bool sharded, overlap;
    // Buckets launch and complete in list order (reverse layout order), the same on every rank.
    int n_buckets, next_launch, next_done;
    bucket *buckets;
    bool armed;
    float *shard_grad; // (n_padded / world) reduce-scatter targets, distributed optimizer only
    weft_optim_range *owned; // this rank's elements, ascending: all (DDP) or a slice per bucket
    int n_owned;
};

size_t weft_dp_pad_multiple(const weft_comm *world) {
    return (size_t)weft_comm_size(world) * SHARD_ALIGN;
}

// The parameter holding element e; the padding after a tensor counts as the tensor's.
static int param_at(const weft_model *m, size_t e) {
    int i = m->n_params - 1;
    while (m->params[i].offset > e) i--;
    return i;
}

// DDP's cut below hi: the fewest whole parameters that reach bucket_elements (all that are left
// if none do).
static size_t whole_params_below(const weft_model *m, size_t hi, size_t bucket_elements) {
    int i = param_at(m, hi - 1);
    while (i > 0 && hi - m->params[i].offset < bucket_elements) i--;
    return m->params[i].offset;
}

// Buckets of about bucket_elements from the end of the buffer down, so the first bucket is the
// first that backward completes. DDP cuts at parameter boundaries. The distributed optimizer cuts
// at multiples of world x SHARD_ALIGN, wherever parameters end, so every rank's slice of every
// bucket has one size; a bucket then waits for the parameter holding its first element.
static void build_buckets(weft_dp *dp, size_t bucket_elements) {
    weft_model *m = dp->model;
    size_t unit = weft_dp_pad_multiple(dp->world);
    size_t sharded_size = (bucket_elements + unit - 1) / unit * unit;
    dp->buckets = weft_alloc(sizeof(bucket) * (m->n_params + m->n_padded / sharded_size + 1));
    for (size_t hi = m->n_padded, lo; hi > 0; hi = lo) {
        if (dp->sharded) lo = hi > sharded_size ? hi - sharded_size : 0;
        else lo = whole_params_below(m, hi, bucket_elements);
        dp->buckets[dp->n_buckets++] = (bucket){.lo = lo, .hi = hi, .first_param = param_at(m, lo)};
    }
}

// The distributed optimizer's bucket [lo, hi) is world slices of (hi - lo) / world elements; rank
// r owns slice r. Its slices, bucket after bucket in ascending order, are where the reduce-scatter
// leaves them (shard_grad) and how the optimizer holds its state: bucket b's starts at lo / world.
static size_t slice_size(const weft_dp *dp, const bucket *b) {
    return (b->hi - b->lo) / (size_t)weft_comm_size(dp->world);
}

static size_t own_slice_start(const weft_dp *dp, const bucket *b) {
    return b->lo + slice_size(dp, b) * (size_t)weft_comm_rank(dp->world);
}

static size_t packed_start(const weft_dp *dp, const bucket *b) {
    return b->lo / (size_t)weft_comm_size(dp->world);
}

// DDP owns everything; the distributed optimizer its slice of every bucket, merged where they
// touch (one rank: everything again).
static void find_owned(weft_dp *dp) {
    dp->owned = weft_alloc(sizeof(weft_optim_range) * (dp->n_buckets + 1));
    if (!dp->sharded) {
        dp->owned[dp->n_owned++] = (weft_optim_range){0, dp->model->n_padded};
        return;
    }
    for (int i = dp->n_buckets - 1; i >= 0; i--) {
        size_t lo = own_slice_start(dp, &dp->buckets[i]);
        size_t hi = lo + slice_size(dp, &dp->buckets[i]);
        weft_optim_range *last = dp->n_owned > 0 ? &dp->owned[dp->n_owned - 1] : NULL;
        if (last && last->hi == lo) last->hi = hi;
        else dp->owned[dp->n_owned++] = (weft_optim_range){lo, hi};
    }
}

// The distributed optimizer's slice of every bucket, one rank's share of the gradient, where the
// model has gradients to reduce (a forward-only model reduces nothing).
static size_t shard_bytes(const weft_dp *dp) {
    return dp->model->n_padded / (size_t)weft_comm_size(dp->world) * sizeof(float);
}

static void alloc_shard(weft_dp *dp) {
    if (dp->sharded && weft_model_grad_bytes(dp->model) > 0)
        dp->shard_grad = dp->model->be->alloc(dp->model->be, shard_bytes(dp));
}

weft_dp *weft_dp_create(weft_comm *world, weft_model *m, const weft_parallel_config *cfg) {
    weft_dp *dp = weft_alloc(sizeof *dp);
    dp->world = world;
    dp->model = m;
    dp->sharded = cfg->use_distributed_optimizer; // the one place the flag is read
    dp->overlap = cfg->overlap_grad_reduce;
    weft_comm_configure(world, cfg->debug_collectives, cfg->collective_timeout);
    WEFT_CHECK(m->n_padded % weft_dp_pad_multiple(world) == 0,
               "internal: model buffers are not padded for %d ranks", weft_comm_size(world));
    build_buckets(dp, (size_t)(cfg->bucket_mb > 0 ? cfg->bucket_mb : 16) << 20 >> 2);
    find_owned(dp);
    alloc_shard(dp);
    return dp;
}

void weft_dp_free(weft_dp *dp) {
    if (!dp) return;
    if (dp->shard_grad) dp->model->be->free(dp->model->be, dp->shard_grad);
    weft_free(dp->buckets);
    weft_free(dp->owned);
    weft_free(dp);
}

bool weft_dp_is_sharded(const weft_dp *dp) { return dp->sharded; }

void weft_dp_release_buffers(weft_dp *dp) {
    dp->model->be->free(dp->model->be, dp->shard_grad);
    dp->shard_grad = NULL;
}

void weft_dp_restore_buffers(weft_dp *dp) {
    WEFT_CHECK(!dp->shard_grad, "internal: restoring reduce-scatter targets never released");
    alloc_shard(dp);
}

weft_optimizer *weft_dp_create_optimizer(weft_dp *dp, const weft_optim_config *cfg) {
    return weft_optimizer_create(dp->model->be, cfg, dp->owned, dp->n_owned, dp->model->param_buf);
}

// ------------------------------------------------------------------------ gradient sync ----

static void launch_bucket(weft_dp *dp) {
    bucket *b = &dp->buckets[dp->next_launch++];
    float *grads = dp->model->grad_buf + b->lo;
    if (dp->sharded)
        b->req = weft_comm_ireduce_scatter_sum(dp->world, grads,
                                               dp->shard_grad + packed_start(dp, b),
                                               slice_size(dp, b), WEFT_COMM_F32);
    else
        b->req = weft_comm_iallreduce_sum(dp->world, grads, b->hi - b->lo, WEFT_COMM_F32);
}

// OpenMPI moves non-blocking collectives on only inside MPI calls, and backward makes none: a
// test of the oldest bucket still in flight runs its progress engine for all of them.
static void progress(weft_dp *dp) {
    while (dp->next_done < dp->next_launch && weft_comm_test(dp->buckets[dp->next_done].req))
        dp->next_done++;
}

static void on_grads_ready(void *ctx, int first_param) {
    weft_dp *dp = ctx;
    if (!dp->armed) return;
    while (dp->next_launch < dp->n_buckets &&
           dp->buckets[dp->next_launch].first_param >= first_param)
        launch_bucket(dp);
    progress(dp);
}

weft_grad_hook weft_dp_grad_hook(weft_dp *dp) {
    return (weft_grad_hook){.ready = on_grads_ready, .ctx = dp};
}

void weft_dp_arm_last_microbatch(weft_dp *dp) {
    dp->armed = dp->overlap;
    dp->next_launch = dp->next_done = 0;
}

void weft_dp_finish_gradients(weft_dp *dp) {
    weft_model *m = dp->model;
    // A rank whose backward did not launch every bucket (no documents this step, or no overlap)
    // launches the rest in the same order as everyone else.
    while (dp->next_launch < dp->n_buckets) launch_bucket(dp);
    for (int i = 0; i < dp->n_buckets; i++) {
        bucket *b = &dp->buckets[i];
        weft_comm_wait(b->req);
        b->req = NULL;
        // The optimizer reads its gradients in place.
        if (dp->sharded)
            m->be->copy(m->be, m->grad_buf + own_slice_start(dp, b),
                        dp->shard_grad + packed_start(dp, b), slice_size(dp, b) * sizeof(float));
    }
    dp->armed = false;
}

// ----------------------------------------------------------------------- owned elements ----

void weft_dp_owned_sumsq(weft_dp *dp, double *acc) {
    weft_backend *be = dp->model->be;
    float *grads = dp->model->grad_buf;
    if (!dp->sharded) { // every rank holds the whole summed gradient: each adds up 1/world of it
        size_t share = dp->model->n_padded / (size_t)weft_comm_size(dp->world);
        be->accumulate_f32(be, grads + share * (size_t)weft_comm_rank(dp->world), share, true, 1.0,
                           acc);
        return;
    }
    for (const weft_optim_range *r = dp->owned; r < dp->owned + dp->n_owned; r++)
        be->accumulate_f32(be, grads + r->lo, r->hi - r->lo, true, 1.0, acc);
}

void weft_dp_scale_owned(weft_dp *dp, float factor) {
    weft_backend *be = dp->model->be;
    for (const weft_optim_range *r = dp->owned; r < dp->owned + dp->n_owned; r++)
        be->scale_f32(be, dp->model->grad_buf + r->lo, factor, r->hi - r->lo);
}

// Every rank's slice of every bucket to every rank, into `whole` (laid out like the flat buffer,
// elements of esz bytes): from `packed` (this rank's slices in optimizer order) when given, else
// in place from whole's own slices. One all-gather per bucket, in list order on every rank.
static void gather_slices(weft_dp *dp, const void *packed, void *whole, size_t esz,
                          weft_comm_type type) {
    for (int i = 0; i < dp->n_buckets; i++) {
        const bucket *b = &dp->buckets[i];
        const char *from = packed ? (const char *)packed + packed_start(dp, b) * esz
                                  : (const char *)whole + own_slice_start(dp, b) * esz;
        weft_comm_allgather(dp->world, from, (char *)whole + b->lo * esz, slice_size(dp, b), type);
    }
}

void weft_dp_gather_owned(weft_dp *dp, const float *owned, float *whole) {
    weft_backend *be = dp->model->be;
    if (dp->sharded) gather_slices(dp, owned, whole, sizeof(float), WEFT_COMM_F32);
    else be->copy(be, whole, owned, dp->model->n_padded * sizeof(float));
}

void weft_dp_select_owned(const weft_dp *dp, const float *whole, float *owned) {
    weft_backend *be = dp->model->be;
    for (const weft_optim_range *r = dp->owned; r < dp->owned + dp->n_owned; r++) {
        be->copy(be, owned, whole + r->lo, (r->hi - r->lo) * sizeof(float));
        owned += r->hi - r->lo;
    }
}

void weft_dp_gather_parameters(weft_dp *dp) {
    if (!dp->sharded) return;
    weft_dtype t = dp->model->be->param_dtype;
    gather_slices(dp, NULL, dp->model->param_buf, weft_dtype_size(t), weft_comm_type_of(t));
}

void weft_dp_gather_gradients(weft_dp *dp) {
    if (!dp->sharded) return;
    gather_slices(dp, NULL, dp->model->grad_buf, sizeof(float), WEFT_COMM_F32);
}
