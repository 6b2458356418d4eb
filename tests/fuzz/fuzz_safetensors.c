// libFuzzer target: a safetensors file (header, offsets, dtypes), loaded, every tensor of a float
// dtype converted to f32 as a checkpoint load does.
#include "fuzz.h"
#include "model/safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    weft_fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = weft_fuzz_file("input.safetensors", data, size);
    WEFT_FUZZ_RUN({
        weft_safetensors *st = weft_safetensors_load(path);
        for (int i = 0; i < st->n; i++) {
            const weft_st_tensor *t = &st->tensors[i];
            bool is_float = !strcmp(t->dtype, "F32") || !strcmp(t->dtype, "F16") ||
                            !strcmp(t->dtype, "BF16") || !strcmp(t->dtype, "F64");
            if (!is_float || weft_st_numel(t) > (1 << 20)) continue;
            float *out = weft_alloc(sizeof(float) * (size_t)weft_st_numel(t));
            weft_safetensors_read_f32(st, t, out);
            weft_free(out);
        }
        weft_safetensors_free(st);
    });
    return 0;
}
