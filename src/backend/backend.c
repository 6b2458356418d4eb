#include "backend/backend.h"

size_t weft_dtype_size(weft_dtype t) { return t == WEFT_BF16 ? 2 : 4; }

void weft_backend_destroy(weft_backend *b) {
    if (!b) return;
    if (b->destroy) b->destroy(b);
    weft_free(b->impl);
    weft_free(b);
}
