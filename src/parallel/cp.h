// parallel: context parallelism (DESIGN.md section 6). The world's ranks form dp x cp replicas:
// ranks [i*cp, (i+1)*cp) are the context-parallel group of data-parallel index i. Every document
// such a group trains is padded to a multiple of 2*cp, cut into 2*cp chunks, and CP rank r holds
// chunks r and 2*cp-1-r, which balances causal attention. Attention gathers each layer's keys and
// values over the group and reduce-scatters their gradients, through the key/value provider
// handed to the model's passes. Gradients are summed over all dp x cp ranks by the data-parallel
// layer, so no cp factor appears anywhere (section 3).
#pragma once
#include "comm/comm.h"
#include "model/model.h"
#include "parallel/config.h"
#include "parallel/planner.h"

typedef struct weft_cp weft_cp;

// Splits the world into context-parallel groups: of cfg->context_parallel_size ranks (a size
// that does not divide the world is a fatal error naming both), or with
// cfg->dynamic_context_parallel groups of every power of two up to the world (which must be one).
// Collective over the world (set-up time).
weft_cp *weft_cp_create(weft_comm *world, const weft_parallel_config *cfg);
void weft_cp_free(weft_cp *cp);
int weft_cp_size(const weft_cp *cp);
int weft_cp_rank(const weft_cp *cp);
// How many groups of the selected degree the world holds (static CP: the data-parallel size).
int weft_cp_dp_size(const weft_cp *cp);

// Selects the CP degree of the next micro-batches: this rank's group becomes its aligned run of
// `degree` ranks, prebuilt (static CP: only its own size exists; dynamic CP: every power of two).
void weft_cp_select(weft_cp *cp, int degree);

// The key/value provider of the selected group, for micro-batches built in *batch with
// weft_cp_chunks (their layout is read when attention runs); NULL at degree 1.
const weft_kv_provider *weft_cp_kv_provider(weft_cp *cp, weft_backend *be,
                                            const weft_batch *batch);

// This rank's chunks of a document of len tokens: fills start[0..n) with the first position of
// each chunk and returns n (1 when cp_size is 1: the whole document); *chunk_len and *padded_len
// receive the chunk length and the padded document length.
int weft_cp_chunks(const weft_cp *cp, int len, int start[2], int *chunk_len, int *padded_len);

// Seconds spent in the exchange's collectives since the last call (the share of a step that is
// context-parallel communication).
double weft_cp_take_comm_seconds(weft_cp *cp);
