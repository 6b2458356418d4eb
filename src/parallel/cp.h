// parallel: context parallelism (DESIGN.md section 6). The world's ranks form dp x cp replicas:
// ranks [i*cp, (i+1)*cp) are the context-parallel group of data-parallel index i. Every document
// such a group trains is padded to a multiple of 2*cp, cut into 2*cp chunks, and CP rank r holds
// chunks r and 2*cp-1-r, which balances causal attention. Attention gathers each layer's keys and
// values over the group and reduce-scatters their gradients, through the exchange handed to the
// model. Gradients are summed over all dp x cp ranks by the data-parallel layer, so no cp factor
// appears anywhere (section 3).
#pragma once
#include "comm/comm.h"
#include "model/model.h"
#include "parallel/dp.h"

typedef struct weft_cp weft_cp;

// Splits the world into context-parallel groups: of cfg->context_parallel_size ranks (a size
// that does not divide the world is a fatal error naming both), or with
// cfg->dynamic_context_parallel groups of every power of two up to the world (which must be one).
// Collective over the world (set-up time).
weft_cp *weft_cp_create(weft_comm *world, const weft_parallel_config *cfg);
void weft_cp_free(weft_cp *cp);
int weft_cp_size(const weft_cp *cp);
int weft_cp_rank(const weft_cp *cp);
// Rows one rank holds of a document of len tokens at CP degree c: 2 chunks of ceil(len / 2c)
// (the document padded to a multiple of 2c), or the whole document at c = 1.
int weft_cp_rows(int len, int c);
// The longest document whose rows at degree c fit `rows` per rank.
int weft_cp_max_len(int rows, int c);

// Static CP: this rank's data-parallel coordinate, which share of the global batch its group
// trains. Dynamic CP (parallel.dynamic_context_parallel) has none: the planner spreads documents.
bool weft_cp_is_dynamic(const weft_cp *cp);
int weft_cp_dp_rank(const weft_cp *cp);
int weft_cp_dp_size(const weft_cp *cp);

// Selects the CP degree of the next micro-batches: this rank's group becomes its aligned run of
// `degree` ranks, prebuilt (static CP: only its own size exists; dynamic CP: every power of two).
// The model gets the exchange for degree > 1 and none at 1.
void weft_cp_select(weft_cp *cp, int degree);

// Gives the model its key/value exchange over this rank's group, for micro-batches built in
// *batch with weft_cp_chunks (the layout is read when attention runs); none when cp_size is 1.
void weft_cp_attach(weft_cp *cp, weft_model *m, const weft_batch *batch);

// This rank's chunks of a document of len tokens: fills start[0..n) with the first position of
// each chunk and returns n (1 when cp_size is 1: the whole document); *chunk_len and *padded_len
// receive the chunk length and the padded document length.
int weft_cp_chunks(const weft_cp *cp, int len, int start[2], int *chunk_len, int *padded_len);

// Seconds spent in the exchange's collectives since the last call (the share of a step that is
// context-parallel communication).
double weft_cp_take_comm_seconds(weft_cp *cp);
