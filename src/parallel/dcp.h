// parallel: the dynamic context-parallel planner (DESIGN.md section 7). The W ranks are one pool;
// a global batch becomes a list of micro-batches, each run by an aligned group of c consecutive
// ranks (c a power of two, its CP degree) with at most max_seqlen_per_rank rows per rank.
// Every rank runs, in list order, the micro-batches whose group holds it; as every group is
// entered in one global order, no two ranks can wait on each other crosswise.
//  - uniform mode: steps of one degree each, whose W/c groups run side by side;
//  - heterogeneous mode: every document its own degree, groups of mixed sizes side by side.
// Deterministic: every rank computes the same plan from the batch's lengths alone. The same
// plans, simulated on a cost model, give `weft plan` its critical path against the lower bound.
#pragma once
#include "core/core.h"
#include "parallel/cp.h"

// Estimated seconds one rank spends on a document of L tokens at CP degree c:
//   compute  (alpha*L^2 + beta*L) / c + gamma   (the 2c-chunk split balances causal attention;
//                                                gamma is the fixed cost every rank pays)
//   exchange delta * (c-1) * rows(L, c)          (the other ranks' key/value rows arriving)
// and epsilon per micro-batch (a forward-backward pass's fixed cost), whatever it holds.
// `weft calibrate` fits the coefficients on the machine at hand.
typedef struct weft_cost_model {
    double alpha, beta, gamma, delta, epsilon;
} weft_cost_model;

// The job's cost model: parallel.cost_alpha, _beta, _gamma, _delta and _epsilon.
weft_cost_model weft_dcp_cost_model(const weft_parallel_config *cfg);
double weft_cost_compute(const weft_cost_model *cm, int len, int c);
double weft_cost_comm(const weft_cost_model *cm, int len, int c);
// Key/value rows a group of c ranks exchanges for one document per layer and direction:
// every rank receives the other c-1 ranks' rows.
long weft_dcp_exchanged_rows(int len, int c);

typedef enum { WEFT_DCP_UNIFORM, WEFT_DCP_HETEROGENEOUS } weft_dcp_mode;

typedef struct weft_dcp_micro {
    int first_rank, degree; // run by ranks [first_rank, first_rank + degree)
    int step;               // how many micro-batches its ranks ran before it
    int rows;               // rows per rank, at most the plan's limit
    double compute, comm;   // estimated seconds per rank (compute with epsilon)
} weft_dcp_micro;

static inline bool weft_dcp_micro_holds(const weft_dcp_micro *m, int rank) {
    return rank >= m->first_rank && rank < m->first_rank + m->degree;
}

typedef struct weft_dcp_plan {
    int world, limit, n_micro, n_steps;
    weft_dcp_micro *micro;
    int *offsets; // (n_micro + 1) into docs
    int *docs;    // document indices, micro-batch by micro-batch, ascending within each
} weft_dcp_plan;

// Plans documents 0..n-1 of the given lengths over `world` ranks (a power of two) with at most
// `limit` rows per rank. A document that cannot fit even at c = world is a fatal error naming it
// and the limit, raised before anything else happens.
weft_dcp_plan weft_dcp_plan_make(weft_dcp_mode mode, const int *lengths, int n, int world,
                                 int limit, const weft_cost_model *cm);
// Static CP for comparison: world/c data-parallel groups of c ranks, documents spread over them
// by cost, each group's packed into micro-batches of at most `limit` rows per rank.
weft_dcp_plan weft_dcp_plan_static(const int *lengths, int n, int world, int c, int limit,
                                   const weft_cost_model *cm);
void weft_dcp_plan_free(weft_dcp_plan *p);
// The smallest power of two whose rows per rank of a document of len tokens fit the limit.
int weft_dcp_min_degree(int len, int limit);

typedef struct weft_dcp_estimate {
    double critical_path; // when the last rank is done; a group starts once all its ranks are free
    double lower_bound;   // perfect balance at each document's least degree, or the longest
                          // document at its best degree, whichever is larger
    double max_busy, mean_busy; // per rank, compute and exchange
    long exchanged_rows;        // sum of weft_dcp_exchanged_rows over the documents
} weft_dcp_estimate;

// Runs the plan on the cost model. rank_compute, if given, receives each rank's estimated
// compute seconds (world entries): what `weft grad --busy` measures.
weft_dcp_estimate weft_dcp_simulate(const weft_dcp_plan *p, const int *lengths,
                                    const weft_cost_model *cm, double *rank_compute);
