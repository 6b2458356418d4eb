// libFuzzer target: a JSONL documents file: pre-tokenized rows (input_ids, loss_mask,
// logprob_weights, as weft grad and RL rows carry them), and text / prompt-response rows
// through the byte-level tokenizer, as training data.
#include "data/jsonl.h"
#include "data/tokenizer.h"
#include "fuzz.h"

static weft_tokenizer *bytes;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    weft_fuzz_init();
    bytes = weft_tokenizer_byte_level();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = weft_fuzz_file("input.jsonl", data, size);
    WEFT_FUZZ_RUN({ weft_document_set_free(weft_read_token_jsonl(path, 1000)); });
    WEFT_FUZZ_RUN({ weft_document_set_free(weft_read_jsonl_dataset(path, bytes, 0)); });
    return 0;
}
