// The CUDA backend (backend/cuda/ and comm/nccl.c) is a plugin, libweft_cuda.so, built beside the
// weft binary and opened on the first call that needs it. Linked into the program, the CUDA
// runtime, cuBLASLt and NCCL cost every process about 0.2 s and 200 MB before main(), device=cpu
// too, twice where blas_setup.c re-executes the program, and once per rank of a CPU job. The
// plugin keeps the entry points' names; this file stands in for them and calls the plugin's.
// The plugin calls back into this program's core (allocation, errors), which every program that
// links weftlib exports for it (-rdynamic, CMakeLists.txt).
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"

static struct {
    pthread_once_t once;
    void *handle;                   // NULL when it could not be opened
    char error[2 * PATH_MAX + 256]; // why not (two paths at most)
} plugin = {.once = PTHREAD_ONCE_INIT};

// WEFT_CUDA_PLUGIN when set (another build's plugin; CI's emulated one), else beside the
// executable (build/weft, an installed copy), else where CMake built it (test programs live in
// build/tests).
static void open_plugin(void) {
    char exe[PATH_MAX], beside[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    const char *dir = n > 0 ? dirname(exe) : ".", *chosen = getenv("WEFT_CUDA_PLUGIN");
    bool named = chosen && *chosen;
    snprintf(beside, sizeof beside, "%s/libweft_cuda.so", dir);
    const char *path = named ? chosen : access(beside, F_OK) == 0 ? beside : WEFT_CUDA_PLUGIN_BUILT;
    if (access(path, F_OK) != 0) {
        if (named)
            snprintf(plugin.error, sizeof plugin.error, "WEFT_CUDA_PLUGIN=%s: no such file", path);
        else
            snprintf(plugin.error, sizeof plugin.error,
                     "libweft_cuda.so is neither in %s nor at %s", dir, WEFT_CUDA_PLUGIN_BUILT);
        return;
    }
    plugin.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!plugin.handle) snprintf(plugin.error, sizeof plugin.error, "%s", dlerror());
}

void *weft_cuda_plugin_symbol(const char *name, const char **error) {
    static _Thread_local char missing[256]; // plugin.error is written once, by open_plugin
    pthread_once(&plugin.once, open_plugin);
    void *sym = plugin.handle ? dlsym(plugin.handle, name) : NULL;
    if (!sym && plugin.handle) snprintf(missing, sizeof missing, "libweft_cuda.so has no %s", name);
    if (!sym && error) *error = plugin.handle ? missing : plugin.error;
    return sym;
}

// The plugin's `name`, or the end of the job saying what to do.
static void *required(const char *name) {
    const char *error = NULL;
    void *sym = weft_cuda_plugin_symbol(name, &error);
    WEFT_CHECK(sym, "this weft's CUDA backend could not be loaded (%s); rebuild it with `make`, "
                    "which builds libweft_cuda.so beside the weft binary, or use device=cpu",
               error);
    return sym;
}

weft_backend *weft_backend_cuda_create(int local_rank) {
    weft_backend *(*create)(int) = required("weft_backend_cuda_create");
    return create(local_rank);
}

int weft_cuda_device_count(void) {
    int (*count)(void) = required("weft_cuda_device_count");
    return count();
}

int weft_cuda_compute_capability(int device) {
    int (*capability)(int) = required("weft_cuda_compute_capability");
    return capability(device);
}
