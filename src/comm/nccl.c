#include "comm/nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

struct weft_nccl {
    ncclComm_t comm;
    cudaStream_t compute, stream;
};

struct weft_nccl_event {
    cudaEvent_t done;
};

bool weft_nccl_is_device_pointer(const void *p) {
    struct cudaPointerAttributes attr;
    if (!p || cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError(); // a host pointer from an old driver reports an error: clear it
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

weft_nccl *weft_nccl_create(MPI_Comm mpi, int rank, int size, void *compute_stream,
                            const char **error) {
    ncclUniqueId id;
    ncclResult_t rc = ncclSuccess;
    if (rank == 0) rc = ncclGetUniqueId(&id);
    // Every rank learns whether rank 0 got an id before anyone blocks in ncclCommInitRank.
    int ok = rc == ncclSuccess;
    MPI_Bcast(&ok, 1, MPI_INT, 0, mpi);
    if (!ok) {
        *error = rank == 0 ? ncclGetErrorString(rc) : "rank 0 could not create an NCCL id";
        return NULL;
    }
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi);
    weft_nccl *n = weft_alloc(sizeof *n);
    n->compute = compute_stream;
    rc = ncclCommInitRank(&n->comm, size, id, rank);
    if (rc != ncclSuccess) {
        *error = ncclGetErrorString(rc);
        weft_free(n);
        return NULL;
    }
    if (cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) != cudaSuccess) {
        *error = "could not create a CUDA stream for NCCL";
        ncclCommDestroy(n->comm);
        weft_free(n);
        return NULL;
    }
    return n;
}

void weft_nccl_free(weft_nccl *n) {
    if (!n) return;
    cudaStreamSynchronize(n->stream);
    ncclCommDestroy(n->comm);
    cudaStreamDestroy(n->stream);
    weft_free(n);
}

static ncclDataType_t nccl_type(weft_comm_type t) {
    return t == WEFT_COMM_F64 ? ncclFloat64 : t == WEFT_COMM_BF16 ? ncclBfloat16 : ncclFloat32;
}

weft_nccl_event *weft_nccl_start(weft_nccl *n, weft_nccl_kind kind, const void *send, void *recv,
                                 size_t count, weft_comm_type type, int root, const char **error) {
    // The collective reads what the compute stream has queued so far.
    cudaEvent_t ready;
    weft_nccl_event *e = weft_alloc(sizeof *e);
    if (cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&e->done, cudaEventDisableTiming) != cudaSuccess) {
        *error = "could not create CUDA events";
        weft_free(e);
        return NULL;
    }
    cudaEventRecord(ready, n->compute);
    cudaStreamWaitEvent(n->stream, ready, 0);
    cudaEventDestroy(ready); // destruction is deferred until the recorded work completes
    ncclResult_t rc;
    switch (kind) {
    case WEFT_NCCL_ALLREDUCE:
        rc = ncclAllReduce(send, recv, count, nccl_type(type), ncclSum, n->comm, n->stream);
        break;
    case WEFT_NCCL_REDUCE_SCATTER:
        rc = ncclReduceScatter(send, recv, count, nccl_type(type), ncclSum, n->comm, n->stream);
        break;
    case WEFT_NCCL_ALLGATHER:
        rc = ncclAllGather(send, recv, count, nccl_type(type), n->comm, n->stream);
        break;
    default:
        rc = ncclBroadcast(send, recv, count, ncclUint8, root, n->comm, n->stream);
        break;
    }
    if (rc != ncclSuccess) {
        *error = ncclGetErrorString(rc);
        cudaEventDestroy(e->done);
        weft_free(e);
        return NULL;
    }
    // No wait is put on the compute stream: comm's callers touch a collective's buffers only after
    // weft_comm_wait has seen this event complete, so backward keeps running beside the reduction.
    cudaEventRecord(e->done, n->stream);
    return e;
}

int weft_nccl_poll(weft_nccl *n, weft_nccl_event *e, const char **error) {
    ncclResult_t async_rc;
    if (ncclCommGetAsyncError(n->comm, &async_rc) == ncclSuccess && async_rc != ncclSuccess &&
        async_rc != ncclInProgress) {
        *error = ncclGetErrorString(async_rc);
        return -1;
    }
    cudaError_t q = cudaEventQuery(e->done);
    if (q == cudaErrorNotReady) return 0;
    if (q != cudaSuccess) {
        *error = cudaGetErrorString(q);
        return -1;
    }
    cudaEventDestroy(e->done);
    weft_free(e);
    return 1;
}

void weft_nccl_abort(weft_nccl *n) {
    if (n) ncclCommAbort(n->comm);
}
