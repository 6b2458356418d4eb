// Built instead of backend/cuda/ when CMake found no CUDA toolkit: the CPU build never needs it.
#include "backend/backend.h"

weft_backend *weft_backend_cuda_create(int local_rank) {
    (void)local_rank;
    weft_fatal("device=cuda: this weft was built without CUDA (no nvcc when CMake configured "
               "it); install the CUDA toolkit and NCCL, rebuild (make clean && make), or use "
               "device=cpu");
}

int weft_cuda_device_count(void) { return 0; }

int weft_cuda_compute_capability(int device) {
    (void)device;
    return 0;
}
