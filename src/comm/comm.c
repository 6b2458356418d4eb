#include "comm/comm.h"

#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct weft_comm {
    bool mpi;          // false: a one-rank group without MPI
    MPI_Comm handle;
    int rank, size;
    int world_rank; // for messages: a subgroup's rank numbers are its own
    char name[32];
    bool debug;
    double timeout;
    long seq;          // collectives issued on this group
    weft_comm_stats stats;
    long fault_skip, fault_kill; // test hooks: this rank skips / dies at that call (-1: never)
};

struct weft_comm_request {
    weft_comm *comm;
    MPI_Request req;
    weft_comm_op op;
    long seq;
};

static noreturn void comm_abort(weft_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static const char *const OP_NAMES[WEFT_N_OPS] = {"allreduce", "reduce_scatter", "allgather",
                                                 "broadcast", "barrier"};
const char *weft_comm_op_name(weft_comm_op op) { return OP_NAMES[op]; }

static bool launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") ||
           getenv("SLURM_STEP_NUM_TASKS");
}

// WEFT_TEST_SKIP_COLLECTIVE / WEFT_TEST_KILL_AT_COLLECTIVE = "RANK:CALL": fault injection for the
// tests that prove a diverged or dead rank ends the job instead of hanging it.
static long fault_at(const char *var, int rank) {
    const char *v = getenv(var);
    int r;
    long call;
    return v && sscanf(v, "%d:%ld", &r, &call) == 2 && r == rank ? call : -1;
}

weft_comm *weft_comm_init(int *argc, char ***argv) {
    weft_comm *c = weft_alloc(sizeof *c);
    snprintf(c->name, sizeof c->name, "world");
    c->timeout = 600.0;
    c->size = 1;
    c->mpi = launched_by_mpi();
    if (c->mpi) {
        int provided;
        MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        MPI_Comm_dup(MPI_COMM_WORLD, &c->handle);
        // Errors come back to the waiter, which names the op and group before ending the job.
        MPI_Comm_set_errhandler(c->handle, MPI_ERRORS_RETURN);
        MPI_Comm_rank(c->handle, &c->rank);
        MPI_Comm_size(c->handle, &c->size);
    }
    c->world_rank = c->rank;
    c->fault_skip = fault_at("WEFT_TEST_SKIP_COLLECTIVE", c->rank);
    c->fault_kill = fault_at("WEFT_TEST_KILL_AT_COLLECTIVE", c->rank);
    return c;
}

weft_comm *weft_comm_split(weft_comm *parent, int color, int key, const char *name) {
    weft_comm *c = weft_alloc(sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->mpi = parent->mpi;
    c->debug = parent->debug;
    c->timeout = parent->timeout;
    c->size = 1;
    c->world_rank = parent->world_rank;
    c->fault_skip = c->fault_kill = -1; // fault injection counts the world group's calls only
    if (c->mpi) {
        // Blocking, but only at set-up, where every rank of the parent calls it in one order.
        int rc = MPI_Comm_split(parent->handle, color, key, &c->handle);
        if (rc != MPI_SUCCESS) comm_abort(parent, "could not create process group %s", name);
        MPI_Comm_set_errhandler(c->handle, MPI_ERRORS_RETURN);
        MPI_Comm_rank(c->handle, &c->rank);
        MPI_Comm_size(c->handle, &c->size);
    }
    return c;
}

void weft_comm_free(weft_comm *c) {
    if (!c) return;
    if (c->mpi) MPI_Comm_free(&c->handle);
    weft_free(c);
}

void weft_comm_finalize(weft_comm *c) {
    if (c->mpi) {
        MPI_Comm_free(&c->handle);
        MPI_Finalize();
    }
    weft_free(c);
}

int weft_comm_rank(const weft_comm *c) { return c->rank; }
int weft_comm_size(const weft_comm *c) { return c->size; }
const char *weft_comm_name(const weft_comm *c) { return c->name; }
weft_comm_stats weft_comm_get_stats(const weft_comm *c) { return c->stats; }

void weft_comm_configure(weft_comm *c, bool debug, double timeout) {
    c->debug = debug;
    c->timeout = timeout;
}

static noreturn void comm_abort(weft_comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "weft: error: rank %d: ", c->world_rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    if (c->mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

// Polls instead of blocking in MPI so the wait can expire; sleeps between polls because ranks
// often share cores, where a spinning waiter steals time from the rank it waits for.
static void wait_request(weft_comm *c, MPI_Request *req, weft_comm_op op, long seq) {
    double start = weft_now_seconds();
    int done = 0;
    for (long spins = 0;; spins++) {
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, text, &len);
            comm_abort(c, "%s #%ld on group %s failed: %s (ranks called different collectives, "
                          "or a peer died)", OP_NAMES[op], seq, c->name, text);
        }
        if (done) return;
        if (weft_now_seconds() - start > c->timeout)
            comm_abort(c,
                       "%s #%ld on group %s timed out after %.0f s: a peer rank died, hangs, or "
                       "took another path (rerun with parallel.debug_collectives=true to find it)",
                       OP_NAMES[op], seq, c->name, c->timeout);
        if (spins > 100) {
            struct timespec ts = {0, spins > 10000 ? 1000000 : 50000};
            nanosleep(&ts, NULL);
        }
    }
}

// Debug mode: all ranks exchange (seq, op, count) of the call they are about to make; any
// difference is reported with every rank's call, then the job ends.
static void cross_check(weft_comm *c, long seq, weft_comm_op op, size_t count) {
    long mine[3] = {seq, (long)op, (long)count};
    long *all = weft_alloc(sizeof(long) * 3 * c->size);
    MPI_Request req;
    MPI_Iallgather(mine, 3, MPI_LONG, all, 3, MPI_LONG, c->handle, &req);
    wait_request(c, &req, op, seq);
    bool same = true;
    for (int r = 1; r < c->size; r++)
        same = same && !memcmp(all, all + 3 * r, sizeof(long) * 3);
    if (!same) {
        char msg[2048];
        size_t n = 0;
        for (int r = 0; r < c->size && n < sizeof msg - 96; r++)
            n += (size_t)snprintf(msg + n, sizeof msg - n, "%srank %d: call #%ld %s of %ld elements",
                                  r ? "; " : "", r, all[3 * r],
                                  all[3 * r + 1] < WEFT_N_OPS ? OP_NAMES[all[3 * r + 1]] : "?",
                                  all[3 * r + 2]);
        // Every rank sees the same table; rank 0 speaks for the group, the others give it a moment.
        if (c->rank != 0) {
            struct timespec ts = {2, 0};
            nanosleep(&ts, NULL);
        }
        comm_abort(c, "collective sequence diverged on group %s: %s", c->name, msg);
    }
    weft_free(all);
}

// Bookkeeping common to every collective; false when the call is a no-op (one rank, or the
// injected skip).
static bool begin(weft_comm *c, weft_comm_op op, size_t count, size_t bytes) {
    long seq = c->seq++;
    c->stats.calls[op]++;
    c->stats.bytes += bytes;
    if (seq == c->fault_kill) raise(SIGKILL);
    if (!c->mpi || seq == c->fault_skip) return false;
    if (c->debug) cross_check(c, seq, op, count);
    return true;
}

static MPI_Datatype mpi_type(weft_comm_type t) { return t == WEFT_COMM_F64 ? MPI_DOUBLE : MPI_FLOAT; }
static size_t type_size(weft_comm_type t) { return t == WEFT_COMM_F64 ? 8 : 4; }

weft_comm_request *weft_comm_iallreduce_sum(weft_comm *c, void *buf, size_t n, weft_comm_type t) {
    weft_comm_request *r = weft_alloc(sizeof *r);
    *r = (weft_comm_request){.comm = c, .req = MPI_REQUEST_NULL, .op = WEFT_OP_ALLREDUCE, .seq = c->seq};
    if (begin(c, WEFT_OP_ALLREDUCE, n, n * type_size(t)))
        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(t), MPI_SUM, c->handle, &r->req);
    return r;
}

void weft_comm_wait(weft_comm_request *r) {
    if (r->req != MPI_REQUEST_NULL) wait_request(r->comm, &r->req, r->op, r->seq);
    weft_free(r);
}

void weft_comm_allreduce_sum(weft_comm *c, void *buf, size_t n, weft_comm_type t) {
    weft_comm_wait(weft_comm_iallreduce_sum(c, buf, n, t));
}

void weft_comm_reduce_scatter_sum(weft_comm *c, const void *send, void *recv, size_t n,
                                  weft_comm_type t) {
    long seq = c->seq;
    if (!begin(c, WEFT_OP_REDUCE_SCATTER, n, n * c->size * type_size(t))) {
        if (!c->mpi) memmove(recv, send, n * type_size(t));
        return;
    }
    MPI_Request req;
    MPI_Ireduce_scatter_block(send, recv, (int)n, mpi_type(t), MPI_SUM, c->handle, &req);
    wait_request(c, &req, WEFT_OP_REDUCE_SCATTER, seq);
}

void weft_comm_allgather(weft_comm *c, const void *send, void *recv, size_t n, weft_comm_type t) {
    long seq = c->seq;
    size_t bytes = n * type_size(t);
    if (!begin(c, WEFT_OP_ALLGATHER, n, bytes * c->size)) {
        if (!c->mpi) memmove(recv, send, bytes);
        return;
    }
    const char *own = (const char *)recv + bytes * c->rank;
    MPI_Request req;
    MPI_Iallgather(send == own ? MPI_IN_PLACE : send, (int)n, mpi_type(t), recv, (int)n,
                   mpi_type(t), c->handle, &req);
    wait_request(c, &req, WEFT_OP_ALLGATHER, seq);
}

void weft_comm_broadcast(weft_comm *c, void *buf, size_t bytes, int root) {
    long seq = c->seq;
    if (!begin(c, WEFT_OP_BROADCAST, bytes, bytes)) return;
    MPI_Request req;
    MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, c->handle, &req);
    wait_request(c, &req, WEFT_OP_BROADCAST, seq);
}

void weft_comm_barrier(weft_comm *c) {
    long seq = c->seq;
    if (!begin(c, WEFT_OP_BARRIER, 0, 0)) return;
    MPI_Request req;
    MPI_Ibarrier(c->handle, &req);
    wait_request(c, &req, WEFT_OP_BARRIER, seq);
}
