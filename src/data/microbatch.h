// Micro-batch planning: which documents of a global batch go into which micro-batch.
#pragma once
#include "core/core.h"

typedef struct weft_microbatch_plan {
    int n_micro;  // micro-batches
    int n_docs;
    int *offsets; // (n_micro + 1) into doc_index
    int *docs;    // (n_docs) document indices, micro-batch by micro-batch, ascending within each
} weft_microbatch_plan;

void weft_microbatch_plan_free(weft_microbatch_plan *p);

// Cuts documents 0..n-1, in order, into `parts` non-empty contiguous runs of about equal token
// counts. parts > n is a fatal error.
weft_microbatch_plan weft_plan_contiguous(const int *lengths, int n, int parts);

// Packs documents into as few micro-batches of at most `max_tokens` tokens as the longest-
// processing-time heuristic manages, balancing estimated cost alpha*L^2 + beta*L across them.
// Deterministic: ties break by document index. A document longer than max_tokens is a fatal error
// naming it.
weft_microbatch_plan weft_plan_packed(const int *lengths, int n, int max_tokens, double alpha,
                                      double beta);

// Spreads documents over exactly `parts` bins (some possibly empty), balancing estimated cost
// alpha*L^2 + beta*L by longest-processing-time; deterministic. Used to give each data-parallel
// rank its share of a global batch.
weft_microbatch_plan weft_plan_balanced(const int *lengths, int n, int parts, double alpha,
                                        double beta);
