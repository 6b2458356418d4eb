// weft_arena: a span's allocations are 64-byte aligned, disjoint and keep what was written in
// them while later ones are made (also those past the arena's capacity, which spill into blocks
// of their own); weft_arena_alloc zeroes, also memory an earlier span wrote; and after a reset
// that followed a spill, the same span fits the arena: no spill, the same base.
#include "../testing.h"
#include "core/core.h"

#include <stdint.h>
#include <string.h>

enum { N = 40 };

// One span: N allocations of growing, odd sizes, each filled with its index; then all checked.
static void span(weft_arena *a, bool expect_spill) {
    unsigned char *p[N];
    size_t size[N];
    for (int i = 0; i < N; i++) {
        size[i] = (size_t)(i * 37 + 1) * (i % 2 ? 1 : 13);
        p[i] = i % 3 ? weft_arena_alloc(a, size[i]) : weft_arena_stage(a, size[i]);
        CHECK((uintptr_t)p[i] % 64 == 0);
        if (i % 3)
            for (size_t b = 0; b < size[i]; b++) CHECK(p[i][b] == 0);
        memset(p[i], i + 1, size[i]);
    }
    for (int i = 0; i < N; i++)
        for (size_t b = 0; b < size[i]; b++) CHECK(p[i][b] == i + 1);
    CHECK((a->spills != NULL) == expect_spill);
}

int main(void) {
    weft_arena a = {0};
    span(&a, true); // an empty arena: everything spills
    weft_arena_reset(&a);
    CHECK(a.base != NULL && a.spills == NULL && a.used == 0);
    const char *base = a.base;
    size_t cap = a.cap;
    for (int round = 0; round < 3; round++) {
        span(&a, false);
        weft_arena_reset(&a);
        CHECK(a.base == base && a.cap == cap);
    }
    // A span larger than the arena spills the rest, and the reset grows it to hold that span.
    span(&a, false);
    unsigned char *big = weft_arena_alloc(&a, 2 * cap);
    CHECK(a.spills != NULL && big[0] == 0 && big[2 * cap - 1] == 0);
    weft_arena_reset(&a);
    CHECK(a.cap >= 3 * cap && a.spills == NULL);
    span(&a, false);
    CHECK(weft_arena_alloc(&a, 2 * cap) != NULL && a.spills == NULL);
    weft_arena_free(&a);
    CHECK(a.base == NULL && a.cap == 0);
    printf("{\"ok\": true}\n");
    return 0;
}
