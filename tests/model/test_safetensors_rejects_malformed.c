// Every kind of malformed or truncated safetensors file ends the process with status 1 and one
// line "weft: error: <path>: ..." on stderr, never a crash, a hang or a silent partial load.
#include "../testing.h"
#include "core/core.h"
#include "model/safetensors.h"

#include <stdint.h>
#include <string.h>

// A file with the given header text (unpadded) followed by data_len zero bytes.
static const char *write_with_header(const char *name, const char *json, size_t data_len) {
    size_t json_len = strlen(json), total = 8 + json_len + data_len;
    unsigned char *buf = weft_alloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)json_len >> (8 * i));
    memcpy(buf + 8, json, json_len);
    const char *path = weft_test_write_file(name, buf, total);
    weft_free(buf);
    return path;
}

static void load(const char *path) {
    weft_safetensors *st = weft_safetensors_load(path);
    weft_safetensors_free(st);
}

static void read_first_as_f32(const char *path) {
    weft_safetensors *st = weft_safetensors_load(path);
    float x[4];
    weft_safetensors_read_f32(st, &st->tensors[0], x);
    weft_safetensors_free(st);
}

int main(void) {
    weft_test_make_dir("weft_st");

    // A valid file cut inside its data section.
    float values[100];
    for (int i = 0; i < 100; i++) values[i] = (float)i;
    weft_safetensors_writer *w = weft_safetensors_writer_create();
    weft_safetensors_writer_add_f32(w, "w", values, 2, (const int64_t[]){10, 10});
    const char *good = weft_test_path("good.safetensors");
    CHECK(weft_safetensors_writer_save(w, good));
    weft_safetensors_writer_free(w);
    size_t len;
    char *bytes = weft_read_file(good, &len);
    CHECK(bytes && len > 400);
    const char *cut = weft_test_write_file("truncated.safetensors", bytes, len - 100);
    EXPECT_FATAL(load, cut, "truncated (header says 400 data bytes");

    // Shorter than the length field itself.
    const char *tiny = weft_test_write_file("tiny.safetensors", bytes, 5);
    EXPECT_FATAL(load, tiny, "too short");

    // Header length larger than the file.
    const unsigned char big_len[16] = {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'};
    const char *bad_len = weft_test_write_file("bad_length.safetensors", big_len, sizeof big_len);
    EXPECT_FATAL(load, bad_len, "header length");
    weft_free(bytes);

    EXPECT_FATAL(load, write_with_header("not_json.safetensors", "this is not json", 0), "not valid JSON");
    EXPECT_FATAL(load, write_with_header("array.safetensors", "[1, 2, 3]", 0), "not a JSON object");
    EXPECT_FATAL(load,
                 write_with_header("out_of_range.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[1000,1016]}}", 16),
                 "truncated");
    EXPECT_FATAL(load,
                 write_with_header("reversed.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 16),
                 "data_offsets");
    EXPECT_FATAL(load,
                 write_with_header("inconsistent.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 16),
                 "needs 8 bytes");
    EXPECT_FATAL(load,
                 write_with_header("bad_dtype.safetensors",
                                   "{\"w\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,2]}}", 16),
                 "dtype \"Q7\"");
    EXPECT_FATAL(load, write_with_header("no_dtype.safetensors", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 16),
                 "dtype");
    EXPECT_FATAL(load,
                 write_with_header("bad_shape.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 16),
                 "shape");
    EXPECT_FATAL(load,
                 write_with_header("huge_shape.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                                   "\"data_offsets\":[0,0]}}",
                                   16),
                 "overflows");
    EXPECT_FATAL(load, write_with_header("entry_not_object.safetensors", "{\"w\":[1,2]}", 0), "not a JSON object");
    EXPECT_FATAL(load, write_with_header("bad_metadata.safetensors", "{\"__metadata__\":{\"k\":1}}", 0),
                 "__metadata__");
    EXPECT_FATAL(load,
                 write_with_header("duplicate.safetensors",
                                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                   "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                                   8),
                 "not valid JSON");
    EXPECT_FATAL(load,
                 write_with_header("overlap.safetensors",
                                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                                   12),
                 "\"a\" and \"b\" overlap");
    // A header length of 2^63: refused from the length field alone, nothing allocated for it.
    const unsigned char len63[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'};
    EXPECT_FATAL(load, weft_test_write_file("len63.safetensors", len63, sizeof len63),
                 "header length field says 9223372036854775808");
    EXPECT_FATAL(load, weft_test_path("does_not_exist.safetensors"), "cannot open");
    EXPECT_FATAL(
        read_first_as_f32,
        write_with_header("int.safetensors", "{\"i\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
        "I32");

    weft_test_remove_dir();
    printf("ok\n");
    return 0;
}
