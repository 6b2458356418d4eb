#include "rl/exchange.h"

struct weft_rl_exchange {
    weft_comm *side;   // the trainers, or the rollout ranks
    weft_comm *bridge; // trainer 0 (rank 0) and the rollout ranks (1..R); the other trainers'
                       // is a group of their own that nothing uses
    weft_comm *inbox;  // trainers: trainer 0 passes each batch on (rollout ranks: NULL)
    weft_comm *all;    // every rank, with the exchange's timeout
    bool generates, bridged; // bridged: trainer 0 or a rollout rank
    int trainers;
};

weft_rl_exchange *weft_rl_exchange_create(weft_comm *world, weft_backend *be,
                                          const weft_job_config *cfg) {
    int R = cfg->rl.rollout_ranks, W = weft_comm_size(world), rank = weft_comm_rank(world);
    if (R == 0) return NULL;
    WEFT_CHECK(R < W, "rl.rollout_ranks=%d on %d rank(s) leaves no rank to train; launch more "
               "ranks (mpirun -np), or give fewer to generation", R, W);
    weft_rl_exchange *x = weft_alloc(sizeof *x);
    x->trainers = W - R;
    x->generates = rank >= x->trainers;
    double timeout = cfg->rl.exchange_timeout;
    bool debug = cfg->parallel.debug_collectives;
    x->side = weft_comm_split(world, x->generates, rank,
                              x->generates ? "rl-rollout" : "rl-trainers");
    weft_comm_configure(x->side, debug, cfg->parallel.collective_timeout);
    x->bridged = rank == 0 || x->generates;
    x->bridge = weft_comm_split(world, x->bridged ? 0 : 1, rank, "rl-bridge");
    weft_comm_configure(x->bridge, debug, timeout);
    if (x->bridged) weft_comm_use_backend(x->bridge, be); // weights go device to device
    if (!x->generates) {
        x->inbox = weft_comm_split(x->side, 0, rank, "rl-inbox");
        weft_comm_configure(x->inbox, debug, timeout);
    }
    x->all = weft_comm_split(world, 0, rank, "rl-exchange");
    weft_comm_configure(x->all, debug, timeout);
    return x;
}

void weft_rl_exchange_free(weft_rl_exchange *x) {
    if (!x) return;
    weft_comm_free(x->side), weft_comm_free(x->bridge), weft_comm_free(x->all);
    if (x->inbox) weft_comm_free(x->inbox);
    weft_free(x);
}

bool weft_rl_exchange_generates(const weft_rl_exchange *x) { return x && x->generates; }
weft_comm *weft_rl_exchange_side(const weft_rl_exchange *x) { return x->side; }
int weft_rl_exchange_trainers(const weft_rl_exchange *x) { return x->trainers; }

// MPI counts are ints: large buffers go in pieces of 1 GiB.
static void broadcast(weft_comm *c, void *buf, size_t bytes, int root) {
    const size_t piece = (size_t)1 << 30;
    for (size_t at = 0; at < bytes; at += piece)
        weft_comm_broadcast(c, (char *)buf + at, bytes - at < piece ? bytes - at : piece, root);
}

void weft_rl_exchange_weights(weft_rl_exchange *x, weft_model *m) {
    if (!x->bridged) return;
    broadcast(x->bridge, m->param_buf, m->n_elements * weft_dtype_size(m->be->param_dtype), 0);
}

void weft_rl_exchange_share(weft_rl_exchange *x, void *buf, size_t bytes) {
    broadcast(x->all, buf, bytes, 0);
}

double *weft_rl_exchange_batch(weft_rl_exchange *x, const double *packed, size_t *len) {
    double *got = NULL;
    double count = x->generates ? (double)*len : 0;
    // Every rollout rank takes part, though all hold the batch: waiting here, they wait with the
    // exchange's timeout for trainer 0 to finish its update, not inside the next rollout's
    // collectives (parallel.collective_timeout) for a first rollout rank waiting here.
    if (x->bridged) { // the first rollout rank (bridge rank 1) sends
        broadcast(x->bridge, &count, sizeof count, 1);
        bool root = weft_comm_rank(x->bridge) == 1;
        got = root ? (double *)packed : weft_alloc(sizeof(double) * ((size_t)count + 1));
        broadcast(x->bridge, got, sizeof(double) * (size_t)count, 1);
        if (x->generates) {
            if (!root) weft_free(got);
            return NULL;
        }
    }
    broadcast(x->inbox, &count, sizeof count, 0);
    if (!got) got = weft_alloc(sizeof(double) * ((size_t)count + 1));
    broadcast(x->inbox, got, sizeof(double) * (size_t)count, 0);
    *len = (size_t)count;
    return got;
}
