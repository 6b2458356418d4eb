// libFuzzer target: weft's settings. An input starting with '@' is key=value overrides, one per
// line (the command line's form, dotted keys); anything else is a YAML config file. Either way the
// result is validated, and a valid one is saved as config.yaml and loaded back.
#include "fuzz.h"
#include "train/config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    weft_fuzz_init();
    return 0;
}

static void overrides(weft_job_config *cfg, const uint8_t *data, size_t size) {
    char *text = weft_alloc(size + 1), *argv[64];
    memcpy(text, data, size);
    int argc = 0;
    for (char *line = strtok(text, "\n"); line && argc < 64; line = strtok(NULL, "\n"))
        argv[argc++] = line;
    weft_job_config_apply_overrides(cfg, argc, argv);
    weft_free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    bool dotted = size > 0 && data[0] == '@';
    const char *path = weft_fuzz_file("config.yaml", data, size);
    const char *saved = weft_fuzz_file("saved.yaml", "", 0);
    WEFT_FUZZ_RUN({
        weft_job_config cfg = weft_job_config_default();
        if (dotted) overrides(&cfg, data + 1, size - 1);
        else weft_job_config_load_yaml(&cfg, path);
        weft_job_config_validate(&cfg);
        if (!weft_job_config_save_yaml(&cfg, saved)) abort();
        weft_job_config back = weft_job_config_default();
        weft_job_config_load_yaml(&back, saved); // what weft saved must load
    });
    return 0;
}
