// comm's NCCL side (private to comm): communicators over GPU buffers, bootstrapped through the
// group's MPI communicator. Ops run on the communicator's own stream after the compute stream's
// queued work, so gradient reduction overlaps the backward pass that continues on the compute
// stream; completion is polled, never blocked on, so the group's timeout still applies.
#pragma once
#include <mpi.h>

#include "comm/comm.h"

typedef struct weft_nccl weft_nccl;
typedef struct weft_nccl_event weft_nccl_event;

// Whether p is GPU memory (what decides NCCL over MPI for a call's buffers).
bool weft_nccl_is_device_pointer(const void *p);
// Collective over `mpi` (set-up time only): rank 0 makes the NCCL id, MPI broadcasts it. NULL
// with *error set when NCCL is unavailable or fails.
weft_nccl *weft_nccl_create(MPI_Comm mpi, int rank, int size, void *compute_stream,
                            const char **error);
void weft_nccl_free(weft_nccl *n);

typedef enum { WEFT_NCCL_ALLREDUCE, WEFT_NCCL_REDUCE_SCATTER, WEFT_NCCL_ALLGATHER,
               WEFT_NCCL_BROADCAST } weft_nccl_kind;

// Queues one collective: count is the per-rank element count (recv count for reduce-scatter,
// send count for all-gather, bytes for broadcast). Returns its completion event, or NULL with
// *error set.
weft_nccl_event *weft_nccl_start(weft_nccl *n, weft_nccl_kind kind, const void *send, void *recv,
                                 size_t count, weft_comm_type type, int root, const char **error);
// 1: done (the event is freed), 0: still running, -1: failed with *error set.
int weft_nccl_poll(weft_nccl *n, weft_nccl_event *e, const char **error);
// Aborts the communicator's outstanding work so a timed-out job can exit.
void weft_nccl_abort(weft_nccl *n);
