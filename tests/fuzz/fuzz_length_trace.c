// libFuzzer target: a `weft plan --lengths` trace (one document length per line).
#include "data/trace.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    weft_fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = weft_fuzz_file("lengths.txt", data, size);
    WEFT_FUZZ_RUN({
        int n;
        int *lengths = weft_read_length_trace(path, &n);
        for (int i = 0; i < n; i++)
            if (lengths[i] < 1) abort(); // the reader promises positive lengths
        weft_free(lengths);
    });
    return 0;
}
