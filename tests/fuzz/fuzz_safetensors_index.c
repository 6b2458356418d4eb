// libFuzzer target: a sharded model's model.safetensors.index.json, read with the two small
// shards beside it as a model load reads them (index parsed, shards checked against it, mapped),
// then every tensor converted to f32.
#include "fuzz.h"
#include "model/safetensors.h"

#include <sys/stat.h>

static char dir[128];

// The shards the seed corpus's index lists: "a" in the first, "b" and "c" in the second.
static void write_shard(const char *name, const char *const *tensors, int n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    weft_safetensors_writer *w = weft_safetensors_writer_create();
    const float values[4] = {1, 2, 3, 4};
    for (int i = 0; i < n; i++) weft_safetensors_writer_add_f32(w, tensors[i], values, 1, (const int64_t[]){4});
    if (!weft_safetensors_writer_save(w, path)) abort();
    weft_safetensors_writer_free(w);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    weft_fuzz_init();
    snprintf(dir, sizeof dir, "%s/model", weft_fuzz_dir);
    if (mkdir(dir, 0755) != 0) abort();
    write_shard("model-00001-of-00002.safetensors", (const char *const[]){"a"}, 1);
    write_shard("model-00002-of-00002.safetensors", (const char *const[]){"b", "c"}, 2);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    weft_fuzz_file("model/model.safetensors.index.json", data, size);
    WEFT_FUZZ_RUN({
        weft_safetensors *st = weft_safetensors_open_model(dir);
        float out[4];
        for (int i = 0; i < st->n; i++)
            if (weft_st_numel(&st->tensors[i]) == 4) weft_safetensors_read_f32(st, &st->tensors[i], out);
        weft_safetensors_free(st);
    });
    return 0;
}
