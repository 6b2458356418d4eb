// parallel: the planner. One module turns a global batch into every rank's micro-batches, for every
// layout (DESIGN.md sections 5-7): data parallelism, static context parallelism and dynamic
// context parallelism (uniform and heterogeneous). The W ranks form aligned groups of c
// consecutive ranks (c a power of two under DCP, the CP size under static CP, 1 for plain data
// parallelism); each micro-batch is run by one group, at most `limit` rows per rank. Every rank
// runs, in list order, the micro-batches whose group holds it; as every group is entered in one
// global order, no two ranks can wait on each other crosswise.
//  - static: the documents are spread over the W/c groups, then each group's packed;
//  - uniform DCP: steps of one degree each, whose W/c groups run side by side;
//  - heterogeneous DCP: every document its own degree, groups of mixed sizes side by side.
// One cost formula (weft_cost_model) and one balancing routine (longest-processing-time list
// scheduling onto the group free soonest, within the row limit) serve every layout.
// Deterministic: every rank computes the same plan from the batch's lengths alone. The same plans,
// simulated on the cost model, give `weft plan` its critical path against the lower bound.
#pragma once
#include "core/core.h"
#include "parallel/config.h"

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
weft_cost_model weft_cost_model_of(const weft_parallel_config *cfg);
double weft_cost_compute(const weft_cost_model *cm, int len, int c);
double weft_cost_comm(const weft_cost_model *cm, int len, int c);

// Rows one rank holds of a document of len tokens at CP degree c: 2 chunks of ceil(len / 2c)
// (the document padded to a multiple of 2c), or the whole document at c = 1.
int weft_cp_rows(int len, int c);
// The longest document whose rows at degree c fit `rows` per rank.
int weft_cp_max_len(int rows, int c);
// Key/value rows a group of c ranks exchanges for one document per layer and direction:
// every rank receives the other c-1 ranks' rows.
long weft_plan_exchanged_rows(int len, int c);
// The smallest power of two whose rows per rank of a document of len tokens fit the limit.
int weft_plan_min_degree(int len, int limit);

// What the planner needs of a job.
typedef struct weft_plan_layout {
    int world;        // ranks
    int cp_size;      // static: the context-parallel degree (1: plain data parallelism)
    bool dynamic;     // a degree per micro-batch (DCP) in `mode`; cp_size is not used
    weft_dcp_mode mode;
    int limit;        // most rows a rank holds in a micro-batch; 0: none (static only)
    int parts;        // static without a limit: micro-batches per group (at most its documents),
                      // cut contiguously in document order
    weft_cost_model cost;
    char why[192];    // the settings behind the limit, for the error a too-long document gets
} weft_plan_layout;

// The layout of a job's settings on `world` ranks: DCP's max_seqlen_per_rank, or static CP with
// train.max_tokens_per_microbatch rows per rank (0: `micro_batches` per group).
weft_plan_layout weft_plan_layout_of(const weft_parallel_config *pc, int world,
                                     int max_tokens_per_microbatch, int micro_batches);
// The longest document the layout can run; *why receives the settings that make the limit
// (INT_MAX without one).
int weft_plan_max_document_len(const weft_plan_layout *l);

typedef struct weft_plan_micro {
    int first_rank, degree; // run by ranks [first_rank, first_rank + degree)
    int step;               // how many micro-batches its ranks ran before it
    int rows;               // rows per rank, at most the plan's limit
    double compute, comm;   // estimated seconds per rank (compute with epsilon)
} weft_plan_micro;

static inline bool weft_plan_micro_holds(const weft_plan_micro *m, int rank) {
    return rank >= m->first_rank && rank < m->first_rank + m->degree;
}

typedef struct weft_plan {
    int world, limit, n_micro, n_steps;
    weft_plan_micro *micro;
    int *offsets; // (n_micro + 1) into docs
    int *docs;    // document indices, micro-batch by micro-batch, ascending within each
} weft_plan;

// Plans documents 0..n-1 of the given lengths. A document that cannot fit is a fatal error naming
// it and the limit (with l->why), raised before anything else happens.
weft_plan weft_plan_make(const weft_plan_layout *l, const int *lengths, int n);
// The building blocks, for tests and for `weft plan`: one group's documents packed into the
// fewest micro-batches of at most `limit` rows that balancing manages (cost-balanced); cut in
// document order into `parts` runs of about equal tokens.
weft_plan weft_plan_pack(const int *lengths, int n, int limit, const weft_cost_model *cm);
weft_plan weft_plan_contiguous(const int *lengths, int n, int parts);
void weft_plan_free(weft_plan *p);

// This rank's micro-batches of a plan, in plan order: micro-batch p has CP degree degree[p] and
// the documents docs[offsets[p] .. offsets[p+1]).
typedef struct weft_local_plan {
    int n_micro, n_docs;
    int *degree, *offsets, *docs;
} weft_local_plan;
weft_local_plan weft_plan_local(const weft_plan *p, int rank);
void weft_local_plan_free(weft_local_plan *p);

typedef struct weft_plan_estimate {
    double critical_path; // when the last rank is done; a group starts once all its ranks are free
    double lower_bound;   // perfect balance at each document's least degree, or the longest
                          // document at its best degree, whichever is larger
    double max_busy, mean_busy; // per rank, compute and exchange
    long exchanged_rows;        // sum of weft_plan_exchanged_rows over the documents
} weft_plan_estimate;

// Runs the plan on the cost model. rank_compute, if given, receives each rank's estimated
// compute seconds (world entries): what `weft grad --busy` measures.
weft_plan_estimate weft_plan_simulate(const weft_plan *p, const int *lengths,
                                      const weft_cost_model *cm, double *rank_compute);
