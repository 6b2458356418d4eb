// Tensors written by weft_safetensors_writer come back bit-exact, the bytes on disk follow the
// safetensors layout exactly (LE length, compact JSON header padded with spaces to 8 bytes, data in
// the order added), and hand-built BF16 / F16 / F64 tensors convert to the right floats.
#include "../testing.h"
#include "core/core.h"
#include "model/safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint64_t le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static void check_tensor(const weft_safetensors *st, const char *name, int ndim, const int64_t *shape,
                         const float *want) {
    const weft_st_tensor *t = weft_safetensors_find(st, name);
    CHECK(t != NULL);
    CHECK(strcmp(t->dtype, "F32") == 0);
    CHECK(t->ndim == ndim);
    for (int i = 0; i < ndim; i++) CHECK(t->shape[i] == shape[i]);
    int64_t n = weft_st_numel(t);
    CHECK(t->nbytes == (size_t)n * 4);
    float *got = weft_alloc((size_t)n * 4);
    weft_safetensors_read_f32(st, t, got);
    CHECK(n == 0 || memcmp(got, want, (size_t)n * 4) == 0); // bit-exact: -0, inf, NaN payloads
    weft_free(got);
}

// The exact bytes of a small file, as the reference implementation lays them out.
static void test_exact_layout(void) {
    weft_safetensors_writer *w = weft_safetensors_writer_create();
    const float a[2] = {1.0f, -2.0f};
    weft_safetensors_writer_add_f32(w, "a", a, 1, (const int64_t[]){2});
    weft_safetensors_writer_add_metadata(w, "k", "v");
    const char *path = weft_test_path("exact.safetensors");
    CHECK(weft_safetensors_writer_save(w, path));
    weft_safetensors_writer_free(w);

    const char *json =
        "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    size_t json_len = strlen(json), header_len = (json_len + 7) / 8 * 8;
    size_t len;
    unsigned char *bytes = (unsigned char *)weft_read_file(path, &len);
    CHECK(bytes != NULL);
    CHECK(len == 8 + header_len + 8);
    CHECK(le64(bytes) == header_len);
    CHECK(memcmp(bytes + 8, json, json_len) == 0);
    for (size_t i = json_len; i < header_len; i++) CHECK(bytes[8 + i] == ' ');
    const unsigned char data[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}; // 1.0f, -2.0f LE
    CHECK(memcmp(bytes + 8 + header_len, data, 8) == 0);
    weft_free(bytes);
}

static void test_roundtrip(void) {
    const float scalar = 3.5f;
    const float bias[6] = {0.0f, -0.0f, INFINITY, from_bits(0x7fc00123u), from_bits(0x00000001u), -1e30f};
    float weight[3 * 4];
    for (int i = 0; i < 12; i++) weight[i] = (float)i * 0.37f - 1.0f;
    const int64_t bias_shape[1] = {6}, weight_shape[2] = {3, 4}, empty_shape[2] = {2, 0};

    weft_safetensors_writer *w = weft_safetensors_writer_create();
    weft_safetensors_writer_add_f32(w, "model.layers.0.weight", weight, 2, weight_shape);
    weft_safetensors_writer_add_f32(w, "scale", &scalar, 0, NULL);
    weft_safetensors_writer_add_f32(w, "bias", bias, 1, bias_shape);
    weft_safetensors_writer_add_f32(w, "empty", NULL, 2, empty_shape);
    weft_safetensors_writer_add_metadata(w, "format", "pt");
    weft_safetensors_writer_add_metadata(w, "note", "quotes \" and \\ and \xc3\xa9");
    const char *path = weft_test_path("model.safetensors");
    CHECK(weft_safetensors_writer_save(w, path));
    weft_safetensors_writer_free(w);

    // On disk: padded header, metadata first, tensors back to back in the order added.
    size_t len;
    unsigned char *bytes = (unsigned char *)weft_read_file(path, &len);
    CHECK(bytes != NULL && len >= 8);
    uint64_t n = le64(bytes);
    CHECK(n % 8 == 0 && 8 + n <= len);
    json_error_t err;
    json_t *header = json_loadb((const char *)bytes + 8, n, 0, &err);
    CHECK(header != NULL);
    const char *order[] = {"__metadata__", "model.layers.0.weight", "scale", "bias", "empty"};
    const size_t sizes[] = {0, 48, 4, 24, 0};
    int k = 0;
    size_t offset = 0;
    const char *key;
    json_t *value;
    json_object_foreach(header, key, value) {
        CHECK(k < 5 && strcmp(key, order[k]) == 0);
        if (k > 0) {
            json_t *offs = json_object_get(value, "data_offsets");
            CHECK(json_integer_value(json_array_get(offs, 0)) == (json_int_t)offset);
            offset += sizes[k];
            CHECK(json_integer_value(json_array_get(offs, 1)) == (json_int_t)offset);
        }
        k++;
    }
    CHECK(k == 5);
    CHECK(8 + n + offset == len);
    json_t *meta = json_object_get(header, "__metadata__");
    CHECK(strcmp(json_string_value(json_object_get(meta, "format")), "pt") == 0);
    CHECK(strcmp(json_string_value(json_object_get(meta, "note")), "quotes \" and \\ and \xc3\xa9") == 0);
    CHECK(json_array_size(json_object_get(json_object_get(header, "scale"), "shape")) == 0);
    json_decref(header);
    weft_free(bytes);

    weft_safetensors *st = weft_safetensors_load(path);
    CHECK(st->n == 4);
    CHECK(strcmp(st->path, path) == 0);
    CHECK(strcmp(st->tensors[0].name, "model.layers.0.weight") == 0); // data order
    check_tensor(st, "scale", 0, NULL, &scalar);
    check_tensor(st, "bias", 1, bias_shape, bias);
    check_tensor(st, "model.layers.0.weight", 2, weight_shape, weight);
    check_tensor(st, "empty", 2, empty_shape, NULL);
    CHECK(weft_st_numel(weft_safetensors_find(st, "scale")) == 1);
    CHECK(weft_safetensors_find(st, "missing") == NULL);
    weft_safetensors_free(st);
}

static void put_u16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

// A file built by hand: BF16, F16 and F64 tensors (the F64 one at an unaligned offset, after a
// one-byte U8 tensor), an I32 tensor that loads but is not converted, and an unpadded header.
static void test_half_precision_conversion(void) {
    const uint16_t bf16[6] = {0x3f80, 0xc020, 0x3e20, 0x7f80, 0x0001, 0x477f};
    const float bf16_want[6] = {1.0f, -2.5f, 0.15625f, INFINITY, 0x1p-133f, 65280.0f};
    const uint16_t f16[8] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x7c00, 0x8000, 0x7e00};
    const float f16_want[7] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 1023 * 0x1p-24f, INFINITY, -0.0f};
    const double f64[2] = {0.1, -1e300};
    const char *json = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                       "\"h\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[12,28]},"
                       "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[28,29]},"
                       "\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[29,45]},"
                       "\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[45,49]}}";
    size_t json_len = strlen(json), data_len = 49, total = 8 + json_len + data_len;
    unsigned char *buf = weft_alloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)json_len >> (8 * i));
    memcpy(buf + 8, json, json_len);
    unsigned char *data = buf + 8 + json_len;
    for (int i = 0; i < 6; i++) put_u16(data + 2 * i, bf16[i]);
    for (int i = 0; i < 8; i++) put_u16(data + 12 + 2 * i, f16[i]);
    memcpy(data + 29, f64, sizeof f64);
    const char *path = weft_test_write_file("half.safetensors", buf, total);
    weft_free(buf);

    weft_safetensors *st = weft_safetensors_load(path);
    CHECK(st->n == 5);
    float got[8];
    const weft_st_tensor *t = weft_safetensors_find(st, "w");
    CHECK(t && strcmp(t->dtype, "BF16") == 0 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    weft_safetensors_read_f32(st, t, got);
    CHECK(memcmp(got, bf16_want, sizeof bf16_want) == 0);
    t = weft_safetensors_find(st, "h");
    CHECK(t && strcmp(t->dtype, "F16") == 0);
    weft_safetensors_read_f32(st, t, got);
    CHECK(memcmp(got, f16_want, sizeof f16_want) == 0);
    CHECK(isnan(got[7]));
    t = weft_safetensors_find(st, "d");
    CHECK(t && t->offset == 29 && t->nbytes == 16);
    weft_safetensors_read_f32(st, t, got);
    CHECK(got[0] == 0.1f && isinf(got[1]) && got[1] < 0);
    t = weft_safetensors_find(st, "i");
    CHECK(t && strcmp(t->dtype, "I32") == 0 && weft_st_numel(t) == 1);
    weft_safetensors_free(st);
}

int main(void) {
    weft_test_make_dir("weft_st");
    test_exact_layout();
    test_roundtrip();
    test_half_precision_conversion();
    weft_test_remove_dir();
    printf("ok\n");
    return 0;
}
