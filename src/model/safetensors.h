// model: the Hugging Face safetensors format, read and written.
//
// Layout of a file: an 8-byte little-endian u64 N, then N bytes of JSON header
//   {"__metadata__": {str: str}?, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
// then the data section; data_offsets are byte offsets into the data section.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WEFT_ST_MAX_DIMS 8

typedef struct weft_st_tensor {
    char *name;
    char dtype[8]; // the format's name: "F32", "BF16", ...
    int ndim;      // 0 for a scalar
    int64_t shape[WEFT_ST_MAX_DIMS];
    size_t offset, nbytes; // offset relative to the data section
} weft_st_tensor;

typedef struct weft_safetensors {
    char *path;
    weft_st_tensor *tensors; // sorted by offset, i.e. in the order of the data section
    int n;
    unsigned char *data; // the data section, 64-byte aligned
    size_t data_len;
} weft_safetensors;

// Reads the whole file. Any malformed or truncated input ends in weft_fatal naming the path, what
// is wrong and what to do. Accepts the dtypes F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL
// F8_E4M3 F8_E5M2 (only the float ones can be converted by weft_safetensors_read_f32).
weft_safetensors *weft_safetensors_load(const char *path);
const weft_st_tensor *weft_safetensors_find(const weft_safetensors *st, const char *name); // NULL if absent
int64_t weft_st_numel(const weft_st_tensor *t);
// Converts F32, BF16, F16 or F64 to f32 into dst (numel floats); any other dtype is fatal.
void weft_safetensors_read_f32(const weft_safetensors *st, const weft_st_tensor *t, float *dst);
void weft_safetensors_free(weft_safetensors *st);

// Writer: collects F32 tensors and metadata, then saves them in one atomic write.
typedef struct weft_safetensors_writer weft_safetensors_writer;
weft_safetensors_writer *weft_safetensors_writer_create(void);
// Copies data. ndim 0 is a scalar (shape []); shape may then be NULL.
void weft_safetensors_writer_add_f32(weft_safetensors_writer *w, const char *name, const float *data, int ndim,
                                     const int64_t *shape);
void weft_safetensors_writer_add_metadata(weft_safetensors_writer *w, const char *key, const char *value);
// Tensors are laid out in the order added; the header is padded with spaces to a multiple of 8
// bytes as the reference implementation does. Atomic (weft_write_file_atomic); false if the
// write failed (errno says why).
bool weft_safetensors_writer_save(weft_safetensors_writer *w, const char *path);
void weft_safetensors_writer_free(weft_safetensors_writer *w);
