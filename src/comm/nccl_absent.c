// Built instead of nccl.c where CMake found no CUDA or no NCCL: no pointer is a device pointer,
// so every collective takes the MPI path.
#include "comm/nccl.h"

bool weft_nccl_is_device_pointer(const void *p) {
    (void)p;
    return false;
}

weft_nccl *weft_nccl_create(MPI_Comm mpi, int rank, int size, void *compute_stream,
                            const char **error) {
    (void)mpi, (void)rank, (void)size, (void)compute_stream;
    *error = "this weft was built without NCCL (install libnccl-dev and rebuild)";
    return NULL;
}

void weft_nccl_free(weft_nccl *n) { (void)n; }

weft_nccl_event *weft_nccl_start(weft_nccl *n, weft_nccl_kind kind, const void *send, void *recv,
                                 size_t count, weft_comm_type type, int root, const char **error) {
    (void)n, (void)kind, (void)send, (void)recv, (void)count, (void)type, (void)root;
    *error = "this weft was built without NCCL";
    return NULL;
}

int weft_nccl_poll(weft_nccl *n, weft_nccl_event *e, const char **error) {
    (void)n, (void)e;
    *error = "this weft was built without NCCL";
    return -1;
}

void weft_nccl_abort(weft_nccl *n) { (void)n; }
