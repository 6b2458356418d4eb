// libFuzzer target: a tokenizer.json, and text encoded with it. The input is the tokenizer file,
// then optionally a NUL byte and the text; without one, a few fixed texts are encoded. Every
// encoding, plain and inside the post_processor's special tokens, is decoded back.
#include "data/tokenizer.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    weft_fuzz_init();
    return 0;
}

static void round_trip(const weft_tokenizer *t, const char *text, size_t n) {
    for (int special = 0; special < 2; special++) {
        int n_ids;
        int32_t *ids = special ? weft_tokenizer_encode_special(t, text, n, &n_ids)
                               : weft_tokenizer_encode(t, text, n, &n_ids);
        size_t len;
        weft_free(weft_tokenizer_decode(t, ids, n_ids, &len));
        weft_free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    const char *path = weft_fuzz_file("tokenizer.json", data, json_len);
    WEFT_FUZZ_RUN({
        weft_tokenizer *t = weft_tokenizer_load(path);
        if (nul) {
            round_trip(t, (const char *)nul + 1, size - json_len - 1);
        } else {
            static const char *const texts[] = {"hello world", "a  b\n\n c", "12345 x-y.z!",
                                                "e\xcc\x81\xcc\x96 <|endoftext|>", "\xff\xfe"};
            for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
                round_trip(t, texts[i], strlen(texts[i]));
        }
        weft_tokenizer_free(t);
    });
    return 0;
}
