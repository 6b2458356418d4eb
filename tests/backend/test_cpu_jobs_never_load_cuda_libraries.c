// A CPU job maps none of CUDA's libraries (the runtime, cuBLASLt, NCCL, the driver): they come
// with the CUDA plugin (backend/cuda_plugin.c), which the first call that needs CUDA opens. In a
// build with CUDA that call then opens it with every symbol resolved (RTLD_NOW), its calls back
// into the program's core included, which is what every GPU job relies on.
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"

// Whether a file whose path contains `name` is mapped into this process.
static bool mapped(const char *name) {
    FILE *f = fopen("/proc/self/maps", "r");
    WEFT_CHECK(f, "cannot read /proc/self/maps");
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, name) != NULL;
    fclose(f);
    return found;
}

static const char *const cuda_libraries[] = {"libcudart", "libcublas", "libnccl", "libcuda.so",
                                              "libweft_cuda"};
enum { N_LIBRARIES = sizeof cuda_libraries / sizeof *cuda_libraries };

int main(void) {
    weft_backend_prepare_process();
    weft_backend *cpu = weft_backend_create(WEFT_DEVICE_CPU, 0);
    float host[64] = {1}, *device = cpu->alloc(cpu, sizeof host);
    cpu->to_device(cpu, device, host, sizeof host);
    int failures = 0;
    for (int i = 0; i < N_LIBRARIES; i++)
        if (mapped(cuda_libraries[i])) {
            printf("FAIL: a process with a CPU backend maps %s\n", cuda_libraries[i]);
            failures++;
        }
    cpu->free(cpu, device);
    weft_backend_destroy(cpu);
#ifdef WEFT_WITH_CUDA_PLUGIN
    int gpus = weft_cuda_device_count(); // opens the plugin, or ends the job saying why not
    const char *needed[] = {"libweft_cuda", "libcudart", "libcublasLt"};
    for (int i = 0; i < 3; i++)
        if (!mapped(needed[i])) {
            printf("FAIL: asking for the GPU count did not load %s\n", needed[i]);
            failures++;
        }
    printf("plugin opened: %d GPU(s) visible\n", gpus);
#else
    printf("built without CUDA: the plugin half does not apply\n");
#endif
    printf("%s\n", failures ? "FAILED" : "OK");
    return failures ? 1 : 0;
}
