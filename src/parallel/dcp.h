// parallel: the dynamic context-parallel planner, uniform mode (DESIGN.md section 7). The W
// ranks are one pool; a global batch becomes a sequence of micro-batch steps, each with one CP
// degree c (a power of two) shared by its W/c aligned groups of c consecutive ranks, every group
// with at least one document and at most max_seqlen_per_rank rows per rank. Deterministic: every
// rank computes the same plan from the batch's lengths alone.
#pragma once
#include "core/core.h"
#include "parallel/cp.h"

// Estimated time of a document of L tokens: alpha*L^2 + beta*L (+ gamma), in arbitrary units.
typedef struct weft_cost_model {
    double alpha, beta, gamma;
} weft_cost_model;

double weft_cost_of(const weft_cost_model *cm, int len);

typedef struct weft_dcp_step {
    int degree;        // c
    int n_groups;      // W / c
    int *offsets;      // (n_groups + 1) into docs
    int *docs;         // document indices, group by group, ascending within a group
    double *cost;      // (n_groups) estimated cost per rank of each group
    int *rows;         // (n_groups) rows per rank of each group
} weft_dcp_step;

typedef struct weft_dcp_plan {
    int n_steps, world;
    weft_dcp_step *steps;
} weft_dcp_plan;

// Plans documents 0..n-1 of the given lengths over `world` ranks (a power of two). A document
// that cannot fit max_seqlen_per_rank rows per rank even at c = world is a fatal error naming it
// and the limit, raised before anything else happens.
weft_dcp_plan weft_dcp_plan_uniform(const int *lengths, int n, int world, int max_seqlen_per_rank,
                                    const weft_cost_model *cm);
void weft_dcp_plan_free(weft_dcp_plan *p);
