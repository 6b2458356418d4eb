// The NCCL calls of src/comm/nccl.c, implemented with MPI on the emulated runtime's host memory,
// so weft_emulated runs multi-rank device=cuda jobs: data and context parallelism through weft's
// real NCCL path (device-pointer routing, bf16 collectives, events) without a GPU. Every call
// completes before it returns, which is one legal schedule of NCCL's asynchronous ones.
//
// A communicator is an MPI communicator split off MPI_COMM_WORLD: ncclCommInitRank is collective
// over the world here, which holds for weft because every rank sets up its groups in the same
// order (DESIGN.md section 4), each group's id naming it by its creator's world rank.
#define OMPI_SKIP_MPICXX 1 // MPI's C API only: the C++ bindings need a library weft does not link
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include <cuda_bf16.h>

namespace {

struct emulated_comm {
    MPI_Comm mpi;
    int rank, size;
};

struct id_contents {
    int magic, color;
};
constexpr int ID_MAGIC = 0x57454654; // "WEFT"

emulated_comm *of(ncclComm_t c) { return reinterpret_cast<emulated_comm *>(c); }

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclFloat64: return 8;
    case ncclFloat32: return 4;
    case ncclBfloat16: return 2;
    case ncclUint8: return 1;
    default: return 0;
    }
}

void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *) {
    const __nv_bfloat16 *a = static_cast<const __nv_bfloat16 *>(in);
    __nv_bfloat16 *b = static_cast<__nv_bfloat16 *>(inout);
    for (int i = 0; i < *len; i++)
        b[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

// The MPI element type and sum of an NCCL type (bf16: 2-byte elements and bf16_sum).
bool mpi_type(ncclDataType_t t, MPI_Datatype *type, MPI_Op *sum) {
    static MPI_Op bf16_op = MPI_OP_NULL;
    *sum = MPI_SUM;
    switch (t) {
    case ncclFloat64: *type = MPI_DOUBLE; return true;
    case ncclFloat32: *type = MPI_FLOAT; return true;
    case ncclUint8: *type = MPI_UINT8_T; return true;
    case ncclBfloat16:
        if (bf16_op == MPI_OP_NULL) MPI_Op_create(bf16_sum, 1, &bf16_op);
        *type = MPI_UINT16_T;
        *sum = bf16_op;
        return true;
    default: return false;
    }
}

// A private copy of n bytes, so MPI never sees overlapping send and receive buffers (NCCL's
// in-place forms put the send buffer inside the receive one).
std::vector<char> copy_of(const void *p, size_t n) {
    const char *c = static_cast<const char *>(p);
    return std::vector<char>(c, c + n);
}

int g_ids_made = 0;

// With WEFT_EMULATED_NCCL_TRACE=1, one stderr line per collective ("emulated nccl: allgather
// bf16"), so a test can tell that GPU buffers took the NCCL path rather than MPI's.
void trace(const char *op, ncclDataType_t t) {
    static const char *on = getenv("WEFT_EMULATED_NCCL_TRACE");
    if (!on || strcmp(on, "1") != 0) return;
    const char *type = t == ncclBfloat16 ? "bf16" : t == ncclFloat32 ? "f32"
                       : t == ncclFloat64 ? "f64" : "bytes";
    fprintf(stderr, "emulated nccl: %s %s\n", op, type);
}

} // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    id_contents contents = {ID_MAGIC, world_rank * 4096 + g_ids_made++};
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &contents, sizeof contents);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    id_contents contents;
    memcpy(&contents, id.internal, sizeof contents);
    if (contents.magic != ID_MAGIC) return ncclInvalidArgument;
    emulated_comm *c = new emulated_comm;
    MPI_Comm_split(MPI_COMM_WORLD, contents.color, rank, &c->mpi);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
    if (c->size != nranks || c->rank != rank) {
        MPI_Comm_free(&c->mpi);
        delete c;
        return ncclInvalidUsage;
    }
    *comm = reinterpret_cast<ncclComm_t>(c);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    MPI_Comm_free(&of(comm)->mpi);
    delete of(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; } // nothing is ever in flight

ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *error) {
    *error = ncclSuccess;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : "emulated NCCL error";
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
    trace("allreduce", t);
    MPI_Datatype type;
    MPI_Op sum;
    if (op != ncclSum || !mpi_type(t, &type, &sum)) return ncclInvalidArgument;
    std::vector<char> in = copy_of(send, count * type_size(t));
    MPI_Allreduce(in.data(), recv, (int)count, type, sum, of(comm)->mpi);
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
    trace("reduce_scatter", t);
    MPI_Datatype type;
    MPI_Op sum;
    if (op != ncclSum || !mpi_type(t, &type, &sum)) return ncclInvalidArgument;
    std::vector<char> in = copy_of(send, recvcount * of(comm)->size * type_size(t));
    MPI_Reduce_scatter_block(in.data(), recv, (int)recvcount, type, sum, of(comm)->mpi);
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t) {
    trace("allgather", t);
    MPI_Datatype type;
    MPI_Op sum;
    if (!mpi_type(t, &type, &sum)) return ncclInvalidArgument;
    std::vector<char> in = copy_of(send, sendcount * type_size(t));
    MPI_Allgather(in.data(), (int)sendcount, type, recv, (int)sendcount, type, of(comm)->mpi);
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t) {
    trace("broadcast", t);
    size_t bytes = count * type_size(t);
    if (of(comm)->rank == root && send != recv) memmove(recv, send, bytes);
    MPI_Bcast(recv, (int)bytes, MPI_BYTE, root, of(comm)->mpi);
    return ncclSuccess;
}

} // extern "C"
