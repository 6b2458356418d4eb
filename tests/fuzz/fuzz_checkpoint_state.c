// libFuzzer target: a checkpoint's trainer_state.json, as resume reads it: the checkpoint is
// validated against it (file sizes and hashes) by weft_checkpoint_find, then its step, epoch,
// cursor and seed are read. The other files are small fixed ones.
#include "fuzz.h"
#include "train/checkpoint.h"

#include <sys/stat.h>

static char dir[128];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    weft_fuzz_init();
    snprintf(dir, sizeof dir, "%s/step_00000001", weft_fuzz_dir);
    if (mkdir(dir, 0755) != 0) abort();
    static const char *const names[] = {"config.json", "model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 3; i++) {
        char name[160];
        snprintf(name, sizeof name, "step_00000001/%s", names[i]);
        weft_fuzz_file(name, "{}", 2); // the seed corpus records their size (2) and hash
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *state = weft_fuzz_file("step_00000001/trainer_state.json", data, size);
    WEFT_FUZZ_RUN({
        char *found = weft_checkpoint_find(dir);
        weft_free(found);
    });
    WEFT_FUZZ_RUN({ (void)weft_checkpoint_read_state(state); });
    return 0;
}
