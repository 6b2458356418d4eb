#include "data/microbatch.h"

void weft_split_contiguous(const int *lengths, int n, int parts, int *starts) {
    WEFT_CHECK(parts >= 1 && parts <= n,
               "cannot cut %d documents into %d micro-batches; use at most %d micro-batches", n,
               parts, n);
    long total = 0;
    for (int i = 0; i < n; i++) total += lengths[i];
    starts[0] = 0;
    long seen = 0;
    int doc = 0;
    for (int p = 1; p < parts; p++) {
        // Close run p-1 once it reaches its share, leaving at least one document per later run.
        long goal = total * p / parts;
        while (doc < n - (parts - p) && (doc < starts[p - 1] + 1 || seen + lengths[doc] / 2 < goal))
            seen += lengths[doc++];
        starts[p] = doc;
    }
    starts[parts] = n;
}
