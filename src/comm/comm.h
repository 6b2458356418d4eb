// comm: process groups and collectives. The only code that calls MPI (and, later, NCCL).
//
// Every collective is issued non-blocking and waited on with a timeout: a peer that died or took
// another path ends the job with the op, the group and the rank instead of a hang (DESIGN.md
// section 4). In debug mode each collective is preceded by a cross-check of every rank's call
// (sequence number, op, element count), which names the first divergent call and the ranks.
#pragma once
#include "backend/backend.h"

typedef struct weft_comm weft_comm;
typedef struct weft_comm_request weft_comm_request;

typedef enum weft_comm_type { WEFT_COMM_F32, WEFT_COMM_F64, WEFT_COMM_BF16 } weft_comm_type;
// The element type of a backend dtype's buffers.
weft_comm_type weft_comm_type_of(weft_dtype t);

typedef enum weft_comm_op {
    WEFT_OP_ALLREDUCE,
    WEFT_OP_REDUCE_SCATTER,
    WEFT_OP_ALLGATHER,
    WEFT_OP_BROADCAST,
    WEFT_OP_BARRIER,
    WEFT_N_OPS
} weft_comm_op;

// The world group. Under mpirun/srun it initialises MPI; launched as a plain process it is a
// one-rank group that never touches MPI.
weft_comm *weft_comm_init(int *argc, char ***argv);
void weft_comm_finalize(weft_comm *world);
// The subgroup of `parent`'s ranks that pass the same color, ordered by key, named `name` in
// errors. Every rank of the parent calls it, in the same order (set-up time only). It inherits
// the parent's debug checks and timeout.
weft_comm *weft_comm_split(weft_comm *parent, int color, int key, const char *name);
void weft_comm_free(weft_comm *c);
int weft_comm_rank(const weft_comm *c);
int weft_comm_size(const weft_comm *c);
const char *weft_comm_name(const weft_comm *c);
void weft_comm_configure(weft_comm *c, bool debug_checks, double timeout_seconds);
// This rank's index among the ranks on its node: which GPU it drives.
int weft_comm_local_rank(const weft_comm *c);
// Lets collectives take `be`'s buffers. With a GPU backend on several ranks this sets up NCCL
// (collective over the group, set-up time); groups split off later inherit it. A call whose
// buffers are GPU memory then goes through NCCL, one on host memory (metrics, counts) through MPI,
// both in the group's one call order and under its timeout.
void weft_comm_use_backend(weft_comm *c, weft_backend *be);

// Sums n elements over the group, in place.
void weft_comm_allreduce_sum(weft_comm *c, void *buf, size_t n, weft_comm_type t);
weft_comm_request *weft_comm_iallreduce_sum(weft_comm *c, void *buf, size_t n, weft_comm_type t);
// send (size * n) -> recv (n): rank r receives the sum of every rank's block r. send must not
// change until the request completes; recv must not overlap send.
void weft_comm_reduce_scatter_sum(weft_comm *c, const void *send, void *recv, size_t n,
                                  weft_comm_type t);
weft_comm_request *weft_comm_ireduce_scatter_sum(weft_comm *c, const void *send, void *recv,
                                                 size_t n, weft_comm_type t);
// send (n) -> recv (size * n), in rank order; send may alias recv's own block.
void weft_comm_allgather(weft_comm *c, const void *send, void *recv, size_t n, weft_comm_type t);
void weft_comm_broadcast(weft_comm *c, void *buf, size_t bytes, int root);
void weft_comm_barrier(weft_comm *c);
// One poll without waiting: true once the request is complete. MPI's non-blocking collectives
// advance only inside MPI calls, so a rank that computes between launching and waiting polls
// now and then to move them on. Never frees: every request still goes to weft_comm_wait.
bool weft_comm_test(weft_comm_request *r);
// Waits (with the group's timeout) and frees the request.
void weft_comm_wait(weft_comm_request *r);

// Calls issued so far, by op, and bytes moved (this rank's buffers).
typedef struct weft_comm_stats {
    long calls[WEFT_N_OPS];
    size_t bytes;
} weft_comm_stats;
weft_comm_stats weft_comm_get_stats(const weft_comm *c);
const char *weft_comm_op_name(weft_comm_op op);
