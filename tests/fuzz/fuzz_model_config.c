// libFuzzer target: a model's config.json (Hugging Face keys), loaded and validated, and the
// parameter count it implies computed as building the model would (without allocating it).
#include "fuzz.h"
#include "model/config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    weft_fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = weft_fuzz_file("config.json", data, size);
    const char *saved = weft_fuzz_file("saved.json", "", 0);
    WEFT_FUZZ_RUN({
        weft_model_config cfg;
        weft_model_config_load(path, &cfg);
        if (!weft_model_config_save(&cfg, saved)) abort();
        weft_model_config back;
        weft_model_config_load(saved, &back); // what weft saved must load
    });
    return 0;
}
