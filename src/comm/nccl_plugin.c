// Stands in for nccl.c, which lives in the CUDA plugin with the backend it serves
// (backend/cuda_plugin.c says why): each call goes to the plugin's function of the same name,
// looked up once (a wait polls weft_nccl_poll in a loop). NCCL is only reached once a CUDA
// backend exists, so the plugin is open by then.
#include <pthread.h>

#include "backend/backend.h"
#include "comm/nccl.h"

static struct {
    pthread_once_t once;
    const char *error; // why a function is missing (then every one is NULL)
    bool (*is_device_pointer)(const void *);
    weft_nccl *(*create)(MPI_Comm, int, int, void *, const char **);
    void (*free)(weft_nccl *);
    weft_nccl_event *(*start)(weft_nccl *, weft_nccl_kind, const void *, void *, size_t,
                              weft_comm_type, int, const char **);
    int (*poll)(weft_nccl *, weft_nccl_event *, const char **);
    void (*abort)(weft_nccl *);
} nccl = {.once = PTHREAD_ONCE_INIT};

static void look_up(void) {
    const char *names[] = {"weft_nccl_is_device_pointer", "weft_nccl_create", "weft_nccl_free",
                           "weft_nccl_start", "weft_nccl_poll", "weft_nccl_abort"};
    enum { N = sizeof names / sizeof *names };
    void *f[N];
    for (int i = 0; i < N; i++)
        if (!(f[i] = weft_cuda_plugin_symbol(names[i], &nccl.error))) return;
    nccl.is_device_pointer = f[0], nccl.create = f[1], nccl.free = f[2];
    nccl.start = f[3], nccl.poll = f[4], nccl.abort = f[5];
}

// Whether the plugin's functions are there; *error says why not.
static bool plugin_ready(const char **error) {
    pthread_once(&nccl.once, look_up);
    if (!nccl.create && error) *error = nccl.error;
    return nccl.create != NULL;
}

bool weft_nccl_is_device_pointer(const void *p) {
    return plugin_ready(NULL) && nccl.is_device_pointer(p);
}

weft_nccl *weft_nccl_create(MPI_Comm mpi, int rank, int size, void *compute_stream,
                            const char **error) {
    return plugin_ready(error) ? nccl.create(mpi, rank, size, compute_stream, error) : NULL;
}

void weft_nccl_free(weft_nccl *n) {
    if (n && plugin_ready(NULL)) nccl.free(n);
}

weft_nccl_event *weft_nccl_start(weft_nccl *n, weft_nccl_kind kind, const void *send, void *recv,
                                 size_t count, weft_comm_type type, int root, const char **error) {
    return plugin_ready(error) ? nccl.start(n, kind, send, recv, count, type, root, error) : NULL;
}

int weft_nccl_poll(weft_nccl *n, weft_nccl_event *e, const char **error) {
    return plugin_ready(error) ? nccl.poll(n, e, error) : -1;
}

void weft_nccl_abort(weft_nccl *n) {
    if (n && plugin_ready(NULL)) nccl.abort(n);
}
