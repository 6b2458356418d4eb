// core: errors, logging, allocation, RNG, timers. Every other layer includes this header.
#pragma once
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <stdnoreturn.h>

// Prints "weft: error: <message>" to stderr and exits with status 1. Bad input ends here: one clear
// line naming the input and what to do.
noreturn void weft_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// weft_fatal for an error raised while the GPU runs work that will never end (a stuck kernel):
// the same message and end of the job, then _exit(1), since the CUDA runtime's clean-up at exit
// would wait for that work and the process would hang instead of ending.
noreturn void weft_fatal_without_cleanup(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
void weft_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Writes prefix, the formatted message and a newline to stderr in one write(2). stderr is
// unbuffered, so a line printed in pieces is several writes, and under mpirun another rank's
// output or the launcher's abort banner can land between them (a CI run printed
// "weft: error: ----" and the message on another line).
void weft_print_line(const char *prefix, const char *fmt, va_list ap);
// Called by weft_fatal after the message, before exit(1); NULL (the default): none. For fuzz
// harnesses (tests/fuzz), which longjmp out of it so that a clean error is not counted as a crash
// and the next input runs in the same process. Must not return into weft_fatal's caller.
void weft_set_fatal_hook(void (*hook)(void));
// In an MPI job (comm sets it): this process's rank and how to end the whole job. weft_fatal then
// ends the job after its message, and on a rank other than 0 waits 3 seconds before printing: an
// error every rank hits (a bad file, a bad setting) is printed once, by rank 0, whose end of the
// job comes first; an error of one rank alone still prints. (A second was too little for 4 ranks
// on 2 cores busy with other work: rank 0 reached the error, or its end of the job reached the
// others, later than that, and every rank printed.)
void weft_set_error_rank(int rank, void (*end_job)(void));

#define WEFT_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) weft_fatal(__VA_ARGS__);                                                      \
    } while (0)

// bf16 on the host, as 16 bits: from f32 rounded to nearest, ties to even (the device's
// __float2bfloat16_rn), a NaN kept a NaN; and back, exactly.
uint16_t weft_bf16_from_f32(float x);
float weft_f32_from_bf16(uint16_t h);

// Host allocation, 64-byte aligned and zeroed; aborts on exhaustion instead of returning NULL.
void *weft_alloc(size_t bytes);
void weft_free(void *p);
char *weft_strdup(const char *s);
// Makes room for one more element in an array of n (weft_alloc'd or NULL) of *cap elements of
// `size` bytes: doubles the capacity when full (first: first_cap), keeping the n elements.
// Returns the array (new when grown, the old one freed).
void *weft_grow(void *array, int n, int *cap, size_t size, int first_cap);

// Scratch that lives until the next reset: a step's lists and host staging rows without a malloc
// and a free each (fresh pages of a large one cost a fault per 4 KB, every step). Allocations are
// 64-byte aligned; one that does not fit gets its own block, freed at the reset, which grows the
// arena to what the span asked for, so steady state allocates nothing.
typedef struct weft_arena {
    char *base;
    size_t cap, used, asked;     // asked: the bytes since the last reset
    struct weft_arena_spill *spills; // the allocations that did not fit
} weft_arena;
void *weft_arena_alloc(weft_arena *a, size_t bytes); // zeroed
void *weft_arena_stage(weft_arena *a, size_t bytes); // not zeroed: for what a copy fills whole
void weft_arena_reset(weft_arena *a);
void weft_arena_free(weft_arena *a);

// Reads a whole file into a NUL-terminated buffer; NULL with errno set on failure (EISDIR for a
// directory).
char *weft_read_file(const char *path, size_t *len);
// Opens a file to read, or fails the weft way naming it and `what` it should hold ("the prompts"):
// a directory is refused too (fopen takes one on Linux, and reading it fails later, obscurely).
FILE *weft_open_input(const char *path, const char *what);
// Makes path's missing directories, then fails the weft way, naming the path and `what` goes
// there, unless weft_write_file_atomic could write it: a file (not a directory) in a directory
// this process may write. Called before a job's work, so that hours of it are not lost to an
// output path that cannot be written.
void weft_prepare_output(const char *path, const char *what);
// Creates a directory and its missing parents; false (errno set) if it cannot.
bool weft_mkdirs(const char *path);
// Removes a file or a directory tree; true if nothing is left at path.
bool weft_remove_tree(const char *path);
// Writes bytes to path atomically: a temporary file beside it, fsync, then rename.
bool weft_write_file_atomic(const char *path, const void *data, size_t len);
// The same for a file made of n parts written one after another (a header, then tensors), so that
// the caller needs no buffer holding the whole file.
bool weft_write_parts_atomic(const char *path, int n, const void *const *parts, const size_t *lens);

// Deterministic random numbers (xoshiro256**), seeded with splitmix64.
typedef struct weft_rng {
    uint64_t s[4];
} weft_rng;
void weft_rng_seed(weft_rng *rng, uint64_t seed);
uint64_t weft_rng_next(weft_rng *rng);
double weft_rng_uniform(weft_rng *rng); // [0, 1)
double weft_rng_normal(weft_rng *rng);

// Host memory a new allocation can still get (MemAvailable: free plus reclaimable page cache),
// for checks that refuse work which cannot fit before starting it.
size_t weft_host_memory_available(void);

double weft_now_seconds(void); // monotonic
int weft_num_threads(void);

// Byte counters by kind, for the memory report of a job.
typedef struct weft_memory_report {
    size_t parameters, gradients, optimizer_state, peak_activations;
} weft_memory_report;
void weft_format_bytes(char *buf, size_t n, size_t bytes);
