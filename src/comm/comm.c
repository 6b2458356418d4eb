#include "comm/comm.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/nccl.h"
#include "core/fault.h"

struct weft_comm {
    bool mpi;          // false: a one-rank group without MPI
    MPI_Comm handle;
    int rank, size;
    int world_rank; // for messages: a subgroup's rank numbers are its own
    int local_rank; // among the ranks on this node (which GPU is this rank's)
    char name[32];
    bool debug;
    double timeout;
    long seq;          // collectives issued on this group
    weft_comm_stats stats;
    bool is_world;     // fault injection (core/fault.h) counts the world group's calls
    weft_backend *be;  // whose buffers may be passed (NULL: host memory only)
    weft_nccl *nccl;   // for buffers in GPU memory; NULL on one rank or without a GPU backend
};

// A collective in flight: an MPI request, or the completion event of an NCCL op.
struct weft_comm_request {
    weft_comm *comm;
    MPI_Request req;
    weft_nccl_event *event;
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

// weft_fatal's end under MPI: every rank stops now, not when mpirun notices one exit.
static void end_mpi_job(void) { MPI_Abort(MPI_COMM_WORLD, 1); }

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
        MPI_Comm node;
        MPI_Comm_split_type(c->handle, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &c->local_rank);
        MPI_Comm_free(&node);
        weft_set_error_rank(c->rank, end_mpi_job);
    }
    c->world_rank = c->rank;
    c->is_world = true;
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
    c->local_rank = parent->local_rank;
    if (c->mpi) {
        // Blocking, but only at set-up, where every rank of the parent calls it in one order.
        int rc = MPI_Comm_split(parent->handle, color, key, &c->handle);
        if (rc != MPI_SUCCESS) comm_abort(parent, "could not create process group %s", name);
        MPI_Comm_set_errhandler(c->handle, MPI_ERRORS_RETURN);
        MPI_Comm_rank(c->handle, &c->rank);
        MPI_Comm_size(c->handle, &c->size);
    }
    if (parent->be) weft_comm_use_backend(c, parent->be);
    return c;
}

void weft_comm_use_backend(weft_comm *c, weft_backend *be) {
    c->be = be;
    if (!be->device_memory || !c->mpi || c->size < 2 || c->nccl) return;
    const char *error = "";
    c->nccl = weft_nccl_create(c->handle, c->rank, c->size, be->stream, &error);
    if (!c->nccl)
        comm_abort(c, "could not set up NCCL for group %s (%s); check that every rank sees its "
                      "own GPU and that NCCL works (NCCL_DEBUG=WARN tells more)", c->name, error);
}

void weft_comm_free(weft_comm *c) {
    if (!c) return;
    weft_nccl_free(c->nccl);
    if (c->mpi) MPI_Comm_free(&c->handle);
    weft_free(c);
}

void weft_comm_finalize(weft_comm *c) {
    weft_nccl_free(c->nccl);
    if (c->mpi) {
        MPI_Comm_free(&c->handle);
        MPI_Finalize();
    }
    weft_free(c);
}

int weft_comm_rank(const weft_comm *c) { return c->rank; }
int weft_comm_local_rank(const weft_comm *c) { return c->local_rank; }
int weft_comm_size(const weft_comm *c) { return c->size; }
const char *weft_comm_name(const weft_comm *c) { return c->name; }
weft_comm_stats weft_comm_get_stats(const weft_comm *c) { return c->stats; }

void weft_comm_configure(weft_comm *c, bool debug, double timeout) {
    c->debug = debug;
    c->timeout = timeout;
}

static noreturn void comm_abort(weft_comm *c, const char *fmt, ...) {
    char prefix[48];
    snprintf(prefix, sizeof prefix, "weft: error: rank %d: ", c->world_rank);
    va_list ap;
    va_start(ap, fmt);
    weft_print_line(prefix, fmt, ap);
    va_end(ap);
    weft_nccl_abort(c->nccl); // GPU work of a dead collective would otherwise never end
    if (c->mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

// One poll of a request: true once it is complete. A failure ends the job, naming the call.
static bool request_done(weft_comm_request *r) {
    weft_comm *c = r->comm;
    if (r->event) {
        const char *error = "";
        int state = weft_nccl_poll(c->nccl, r->event, &error);
        if (state < 0)
            comm_abort(c, "%s #%ld on group %s failed in NCCL: %s", OP_NAMES[r->op], r->seq,
                       c->name, error);
        if (state > 0) r->event = NULL;
        return state > 0;
    }
    int done = 0, rc = MPI_Test(&r->req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        comm_abort(c, "%s #%ld on group %s failed: %s (ranks called different collectives, "
                      "or a peer died)", OP_NAMES[r->op], r->seq, c->name, text);
    }
    return done;
}

// Polls instead of blocking in MPI or CUDA so the wait can expire; sleeps between polls because
// ranks often share cores, where a spinning waiter steals time from the rank it waits for.
static void wait_request(weft_comm_request *r) {
    double start = weft_now_seconds();
    for (long spins = 0; !request_done(r); spins++) {
        if (weft_now_seconds() - start > r->comm->timeout)
            comm_abort(r->comm,
                       "%s #%ld on group %s timed out after %.0f s: a peer rank died, hangs, or "
                       "took another path (rerun with parallel.debug_collectives=true to find it)",
                       OP_NAMES[r->op], r->seq, r->comm->name, r->comm->timeout);
        if (spins > 100) {
            struct timespec ts = {0, spins > 10000 ? 1000000 : 50000};
            nanosleep(&ts, NULL);
        }
    }
}

static weft_comm_request pending(weft_comm *c, weft_comm_op op, long seq) {
    return (weft_comm_request){.comm = c, .req = MPI_REQUEST_NULL, .op = op, .seq = seq};
}

// Debug mode: all ranks exchange (seq, op, count) of the call they are about to make; any
// difference is reported with every rank's call, then the job ends.
static void cross_check(weft_comm *c, long seq, weft_comm_op op, size_t count) {
    long mine[3] = {seq, (long)op, (long)count};
    long *all = weft_alloc(sizeof(long) * 3 * c->size);
    weft_comm_request r = pending(c, op, seq);
    MPI_Iallgather(mine, 3, MPI_LONG, all, 3, MPI_LONG, c->handle, &r.req);
    wait_request(&r);
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
    bool skip = c->is_world && weft_fault_skip("COLLECTIVE", c->rank, seq);
    if (!c->mpi || skip) return false;
    if (c->debug) cross_check(c, seq, op, count);
    return true;
}

weft_comm_type weft_comm_type_of(weft_dtype t) {
    return t == WEFT_BF16 ? WEFT_COMM_BF16 : WEFT_COMM_F32;
}

static size_t type_size(weft_comm_type t) {
    return t == WEFT_COMM_F64 ? 8 : t == WEFT_COMM_BF16 ? 2 : 4;
}

// MPI has no bf16: it moves bf16 as 16-bit words and never sums it (GPU buffers, the only bf16
// ones, are summed by NCCL).
static MPI_Datatype mpi_type(weft_comm *c, weft_comm_type t, bool sums) {
    if (t == WEFT_COMM_BF16 && sums)
        comm_abort(c, "internal: a bf16 sum on group %s has host buffers; it needs NCCL", c->name);
    return t == WEFT_COMM_F64 ? MPI_DOUBLE : t == WEFT_COMM_BF16 ? MPI_UINT16_T : MPI_FLOAT;
}

// Whether a call's buffers are the GPU backend's, which NCCL moves instead of MPI.
static bool on_device(const weft_comm *c, const void *buf) {
    return c->be && c->be->device_memory && weft_nccl_is_device_pointer(buf);
}

// Whether a call goes through NCCL: a multi-rank group with a GPU backend always has it
// (weft_comm_use_backend ends the job otherwise), and uses it for GPU buffers.
static bool via_nccl(const weft_comm *c, const void *buf) { return c->nccl && on_device(c, buf); }

// A one-rank group's reduce-scatter or all-gather is a copy, on whichever side the data lives.
static void local_copy(weft_comm *c, void *dst, const void *src, size_t bytes) {
    if (on_device(c, dst)) c->be->copy(c->be, dst, src, bytes);
    else memmove(dst, src, bytes);
}

// Starts an NCCL op for r, ending the job with the op's name if NCCL refuses it.
static void start_nccl(weft_comm_request *r, weft_nccl_kind kind, const void *send, void *recv,
                       size_t count, weft_comm_type t, int root) {
    weft_comm *c = r->comm;
    const char *error = "";
    r->event = weft_nccl_start(c->nccl, kind, send, recv, count, t, root, &error);
    if (!r->event)
        comm_abort(c, "%s #%ld on group %s: NCCL refused it: %s", OP_NAMES[r->op], r->seq,
                   c->name, error);
}

weft_comm_request *weft_comm_iallreduce_sum(weft_comm *c, void *buf, size_t n, weft_comm_type t) {
    weft_comm_request *r = weft_alloc(sizeof *r);
    *r = pending(c, WEFT_OP_ALLREDUCE, c->seq);
    if (!begin(c, WEFT_OP_ALLREDUCE, n, n * type_size(t))) return r;
    if (via_nccl(c, buf))
        start_nccl(r, WEFT_NCCL_ALLREDUCE, buf, buf, n, t, 0);
    else
        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(c, t, true), MPI_SUM, c->handle,
                       &r->req);
    return r;
}

// A request with nothing left to poll: complete, or never started (one rank, injected skip).
static bool finished(const weft_comm_request *r) { return r->req == MPI_REQUEST_NULL && !r->event; }

bool weft_comm_test(weft_comm_request *r) { return finished(r) || request_done(r); }

void weft_comm_wait(weft_comm_request *r) {
    if (!finished(r)) wait_request(r);
    weft_free(r);
}

void weft_comm_allreduce_sum(weft_comm *c, void *buf, size_t n, weft_comm_type t) {
    weft_comm_wait(weft_comm_iallreduce_sum(c, buf, n, t));
}

weft_comm_request *weft_comm_ireduce_scatter_sum(weft_comm *c, const void *send, void *recv,
                                                 size_t n, weft_comm_type t) {
    weft_comm_request *r = weft_alloc(sizeof *r);
    *r = pending(c, WEFT_OP_REDUCE_SCATTER, c->seq);
    if (!begin(c, WEFT_OP_REDUCE_SCATTER, n, n * c->size * type_size(t))) {
        if (!c->mpi) local_copy(c, recv, send, n * type_size(t));
        return r;
    }
    if (via_nccl(c, recv))
        start_nccl(r, WEFT_NCCL_REDUCE_SCATTER, send, recv, n, t, 0);
    else
        MPI_Ireduce_scatter_block(send, recv, (int)n, mpi_type(c, t, true), MPI_SUM, c->handle,
                                  &r->req);
    return r;
}

void weft_comm_reduce_scatter_sum(weft_comm *c, const void *send, void *recv, size_t n,
                                  weft_comm_type t) {
    weft_comm_wait(weft_comm_ireduce_scatter_sum(c, send, recv, n, t));
}

void weft_comm_allgather(weft_comm *c, const void *send, void *recv, size_t n, weft_comm_type t) {
    weft_comm_request r = pending(c, WEFT_OP_ALLGATHER, c->seq);
    size_t bytes = n * type_size(t);
    if (!begin(c, WEFT_OP_ALLGATHER, n, bytes * c->size)) {
        if (!c->mpi) local_copy(c, recv, send, bytes);
        return;
    }
    const char *own = (const char *)recv + bytes * c->rank;
    if (via_nccl(c, recv)) {
        start_nccl(&r, WEFT_NCCL_ALLGATHER, send, recv, n, t, 0);
    } else {
        MPI_Datatype mt = mpi_type(c, t, false);
        MPI_Iallgather(send == own ? MPI_IN_PLACE : send, (int)n, mt, recv, (int)n, mt, c->handle,
                       &r.req);
    }
    wait_request(&r);
}

void weft_comm_broadcast(weft_comm *c, void *buf, size_t bytes, int root) {
    weft_comm_request r = pending(c, WEFT_OP_BROADCAST, c->seq);
    if (!begin(c, WEFT_OP_BROADCAST, bytes, bytes)) return;
    if (via_nccl(c, buf))
        start_nccl(&r, WEFT_NCCL_BROADCAST, buf, buf, bytes, WEFT_COMM_F32, root);
    else
        MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, c->handle, &r.req);
    wait_request(&r);
}

void weft_comm_barrier(weft_comm *c) {
    weft_comm_request r = pending(c, WEFT_OP_BARRIER, c->seq);
    if (!begin(c, WEFT_OP_BARRIER, 0, 0)) return;
    MPI_Ibarrier(c->handle, &r.req);
    wait_request(&r);
}
