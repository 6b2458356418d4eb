// Stands in for nccl.c, which lives in the CUDA plugin with the backend it serves
// (backend/cuda_plugin.c says why): each call goes to the plugin's function of the same name.
// NCCL is only reached once a CUDA backend exists, so the plugin is open by then.
#include "backend/backend.h"
#include "comm/nccl.h"

// The plugin's `name`; NULL with *error set when it is missing.
static void *nccl_function(const char *name, const char **error) {
    return weft_cuda_plugin_symbol(name, error);
}

bool weft_nccl_is_device_pointer(const void *p) {
    bool (*is_device)(const void *) = nccl_function("weft_nccl_is_device_pointer", NULL);
    return is_device && is_device(p);
}

weft_nccl *weft_nccl_create(MPI_Comm mpi, int rank, int size, void *compute_stream,
                            const char **error) {
    weft_nccl *(*create)(MPI_Comm, int, int, void *, const char **) =
        nccl_function("weft_nccl_create", error);
    return create ? create(mpi, rank, size, compute_stream, error) : NULL;
}

void weft_nccl_free(weft_nccl *n) {
    void (*free_nccl)(weft_nccl *) = n ? nccl_function("weft_nccl_free", NULL) : NULL;
    if (free_nccl) free_nccl(n);
}

weft_nccl_event *weft_nccl_start(weft_nccl *n, weft_nccl_kind kind, const void *send, void *recv,
                                 size_t count, weft_comm_type type, int root, const char **error) {
    weft_nccl_event *(*start)(weft_nccl *, weft_nccl_kind, const void *, void *, size_t,
                              weft_comm_type, int, const char **) =
        nccl_function("weft_nccl_start", error);
    return start ? start(n, kind, send, recv, count, type, root, error) : NULL;
}

int weft_nccl_poll(weft_nccl *n, weft_nccl_event *e, const char **error) {
    int (*poll)(weft_nccl *, weft_nccl_event *, const char **) =
        nccl_function("weft_nccl_poll", error);
    return poll ? poll(n, e, error) : -1;
}

void weft_nccl_abort(weft_nccl *n) {
    void (*abort_nccl)(weft_nccl *) = n ? nccl_function("weft_nccl_abort", NULL) : NULL;
    if (abort_nccl) abort_nccl(n);
}
