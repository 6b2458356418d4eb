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
    size_t offset, nbytes; // offset relative to its file's data section
    int file;              // which of the set's files holds it
} weft_st_tensor;

typedef struct weft_st_file {
    char *path;
    const unsigned char *data; // the data section, inside the mapping (no alignment promised)
    size_t data_len;
    void *map; // the whole file, mapped read-only (the page cache holds the bytes, not weft); NULL
    size_t map_len; // until weft_safetensors_map
    size_t data_start;    // the data section's offset in the file
    uint64_t identity[4]; // device, inode, size, mtime when the header was read: the file mapped
                          // must be the file checked
} weft_st_file;

// One file, or every shard of a sharded model directory as one set of tensors.
typedef struct weft_safetensors {
    char *path;              // the file, or the directory of a sharded model
    weft_st_tensor *tensors; // file by file, each file's in the order of its data section
    int n;
    weft_st_file *files;
    int n_files;
} weft_safetensors;

// Maps one file read-only (the file must not be truncated while mapped). Any malformed or
// truncated input ends in weft_fatal naming the path, what is wrong and what to do. Accepts the
// dtypes F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2 (only the float ones
// can be converted by weft_safetensors_read_f32).
weft_safetensors *weft_safetensors_load(const char *path);
// weft_safetensors_load in two halves: the header read and checked (nothing mapped, so an error
// leaves no mapping behind), then every file mapped. A sharded set checks all its shards' headers
// before mapping any.
weft_safetensors *weft_safetensors_read_header(const char *path);
void weft_safetensors_map(weft_safetensors *st);
// The weights of a Hugging Face model: `path` is a .safetensors file, or a directory holding
// model.safetensors or model.safetensors.index.json and the shards it lists. A missing shard, a
// shard whose tensors disagree with the index, a malformed index, or a directory with neither
// file (the error says what it holds) is one fatal error.
weft_safetensors *weft_safetensors_open_model(const char *path);
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
// The same for tensors [first, end) in the order added (one shard); metadata goes in every file.
bool weft_safetensors_writer_save_range(weft_safetensors_writer *w, int first, int end,
                                        const char *path);
int weft_safetensors_writer_count(const weft_safetensors_writer *w);
const char *weft_safetensors_writer_name(const weft_safetensors_writer *w, int i);
size_t weft_safetensors_writer_nbytes(const weft_safetensors_writer *w, int i);
// Writes the tensors as a Hugging Face model's weights into the existing directory dir, as
// save_pretrained does: model.safetensors when they fit in max_shard_bytes, else shards of at most
// that size (a larger tensor alone in its own), named model-00001-of-0000N.safetensors in the
// order added, and model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}),
// written last. Each file atomic; false if a write failed (errno says why).
bool weft_safetensors_writer_save_model(weft_safetensors_writer *w, const char *dir,
                                        size_t max_shard_bytes);
void weft_safetensors_writer_free(weft_safetensors_writer *w);
