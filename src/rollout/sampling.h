// rollout: drawing tokens. Randomness is a pure function of (seed, prompt index, sample index,
// position) through a counter-based generator, so the same seed gives the same completions
// whatever the batch, the pool size, preemptions or the number of ranks (DESIGN.md section 11).
//
// The processed distribution of a row of logits z (V): temperature T scales z / T; top_k keeps
// the k most likely tokens; top_p keeps the smallest set of the most likely tokens whose
// probability reaches top_p (the token that crosses it included); min_p keeps the tokens whose
// probability is at least min_p times the most likely one's; the kept probabilities are
// renormalized. Filters apply in that order (Hugging Face's order), each to the survivors of the
// previous one; ties in probability break by lower token id. Temperature 0 is greedy: the token
// of the largest logit (the first on ties), probability 1.
#pragma once
#include "rollout/config.h"

// A uniform double in [0, 1) from the four counters (53 random bits).
double weft_sampling_uniform(uint64_t seed, uint64_t prompt, uint64_t sample, uint64_t position);

// The processed distribution of logits (V) under c: probs (V) doubles summing to 1 (0 outside the
// kept set). scratch: at least weft_sampling_scratch_bytes(V) bytes.
void weft_sampling_distribution(const weft_sampling_config *c, const float *logits, int V,
                                double *probs, void *scratch);
size_t weft_sampling_scratch_bytes(int V);

// The token drawn from the processed distribution with uniform u (inverse CDF over token ids in
// ascending order), and in *logprob_processed (if not NULL) its log-probability under it.
int weft_sample_token(const weft_sampling_config *c, const float *logits, int V, double u,
                      double *logprob_processed, void *scratch);
