#include "backend/backend.h"
#include "backend/cpu/blas_setup.h"

size_t weft_dtype_size(weft_dtype t) { return t == WEFT_BF16 ? 2 : 4; }

void weft_backend_destroy(weft_backend *b) {
    if (!b) return;
    if (b->destroy) b->destroy(b);
    weft_free(b->impl);
    weft_free(b);
}

weft_backend *weft_backend_create(weft_device device, int local_rank) {
    return device == WEFT_DEVICE_CUDA ? weft_backend_cuda_create(local_rank)
                                      : weft_backend_cpu_create();
}

void weft_backend_count_bytes(weft_backend *b, long long bytes) {
    b->bytes_in_use = (size_t)((long long)b->bytes_in_use + bytes);
    b->allocations++;
    if (b->bytes_in_use > b->peak_bytes) b->peak_bytes = b->bytes_in_use;
}

void weft_backend_reset_peak(weft_backend *b) { b->peak_bytes = b->bytes_in_use; }

void weft_backend_set_wait_timeout(weft_backend *b, double seconds) { b->wait_timeout = seconds; }

void weft_backend_prepare_process(void) { weft_blas_fix_coretype(); }
