// rollout: drawing tokens. Randomness is a pure function of (seed, prompt index, sample index,
// position) through a counter-based generator (Philox-4x64-10, see sampling.c), so the same seed
// gives the same completions whatever the batch, the pool size, preemptions or the number of ranks
// (DESIGN.md section 11).
//
// The processed distribution of a row of logits z (V): temperature T scales z / T and a softmax
// (in double) gives p; top_k keeps the k most likely tokens; top_p keeps the smallest set of the
// most likely tokens whose probability reaches top_p (the token that crosses it included); min_p
// keeps the tokens whose probability is at least min_p times the most likely one's; the kept
// probabilities are renormalized. Filters apply in that order (Hugging Face's order), each to the
// survivors of the previous one, their probabilities renormalized over those survivors (which
// matters to top_p after top_k; min_p's ratio is the same either way); ties in probability break
// by lower token id. Temperature 0 is greedy: the token of the largest logit (the first on ties),
// probability 1. A filter at its "off" value (top_k 0 or >= V, top_p 1, min_p 0) keeps all.
#pragma once
#include "rollout/config.h"

// What a uniform decides at a position: the token (drawn from the processed distribution, or from
// speculative decoding's residual), a draft token, or speculative decoding's accept test.
typedef enum { WEFT_DRAW_TOKEN, WEFT_DRAW_DRAFT, WEFT_DRAW_ACCEPT } weft_draw_kind;

// A uniform double in [0, 1) from the four counters (53 random bits, a multiple of 2^-53). Distinct
// (prompt, sample, position, kind) give independent draws; each seed is its own generator.
double weft_sampling_uniform(uint64_t seed, uint64_t prompt, uint64_t sample, uint64_t position,
                             weft_draw_kind kind);

// The processed distribution of logits (V) under c: probs (V) doubles summing to 1 (0 outside the
// kept set). scratch: at least weft_sampling_scratch_bytes(V) bytes.
void weft_sampling_distribution(const weft_sampling_config *c, const float *logits, int V,
                                double *probs, void *scratch);
size_t weft_sampling_scratch_bytes(int V);

// The token drawn from the processed distribution with uniform u (inverse CDF over token ids in
// ascending order; tokens of probability 0 are never drawn, and a u past the rounded total gives
// the last kept token), and in *logprob_processed (if not NULL) its log-probability under it (0 for
// greedy). scratch: at least weft_sampling_scratch_bytes(V) bytes, 8-byte aligned; nothing is
// allocated per call.
int weft_sample_token(const weft_sampling_config *c, const float *logits, int V, double u,
                      double *logprob_processed, void *scratch);
