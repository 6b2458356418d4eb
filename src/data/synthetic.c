#include "data/synthetic.h"

#include <math.h>
#include <stdio.h>

enum { MAX_TERMS = 48 };

static int draw_terms(weft_rng *rng) {
    // 2 + a lognormal tail: median about 3 terms, about 1 in 50 over 20.
    double tail = exp(0.4 + 1.0 * weft_rng_normal(rng));
    int n = 2 + (int)tail;
    return n > MAX_TERMS ? MAX_TERMS : n;
}

// below: the terms' bound; 0: 10, 100, 1000 or 10000, drawn per term.
static long draw_number(weft_rng *rng, long below) {
    static const long limits[] = {10, 100, 1000, 10000};
    long limit = below > 0 ? below : limits[weft_rng_next(rng) % 4];
    return (long)(weft_rng_next(rng) % (uint64_t)limit);
}

void weft_synthetic_addition(weft_rng *rng, char *prompt, size_t pcap, char *response,
                             size_t rcap) {
    weft_synthetic_addition_of(rng, draw_terms(rng), 0, prompt, pcap, response, rcap);
}

long weft_synthetic_addition_of(weft_rng *rng, int n, long below, char *prompt, size_t pcap,
                                char *response, size_t rcap) {
    long terms[MAX_TERMS];
    n = n < 2 ? 2 : n > MAX_TERMS ? MAX_TERMS : n;
    size_t p = 0, r = 0;
    for (int i = 0; i < n; i++) {
        terms[i] = draw_number(rng, below);
        p += (size_t)snprintf(prompt + p, pcap - p, i ? "+%ld" : "%ld", terms[i]);
    }
    snprintf(prompt + p, pcap - p, "=");
    long sum = terms[0];
    for (int i = 1; i < n; i++) {
        r += (size_t)snprintf(response + r, rcap - r, "%ld+%ld=%ld ", sum, terms[i], sum + terms[i]);
        sum += terms[i];
    }
    snprintf(response + r, rcap - r, "so %ld\n", sum);
    return sum;
}
