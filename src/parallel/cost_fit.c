#include "parallel/cost_fit.h"

#include <math.h>
#include <string.h>

// LAPACK's least-squares driver (OpenBLAS ships LAPACK; Debian has no LAPACKE header for it).
extern void dgels_(const char *trans, const int *m, const int *n, const int *nrhs, double *a,
                   const int *lda, double *b, const int *ldb, double *work, const int *lwork,
                   int *info);

enum { N_TERMS = 4 }; // alpha, beta, gamma, epsilon

// The compute terms of a sample (one micro-batch), per the model: n_docs * ((L^2, L) / c, 1), 1.
static void compute_terms(const weft_cost_sample *s, double f[N_TERMS]) {
    double L = s->len, k = s->n_docs;
    f[0] = k * L * L / s->degree;
    f[1] = k * L / s->degree;
    f[2] = k;
    f[3] = 1;
}

// Minimizes sum ((f . x - y) / y)^2 over the terms in `active`, the others held at 0.
static void solve(const weft_cost_sample *s, int n, const bool active[N_TERMS], double x[N_TERMS]) {
    int cols[N_TERMS], m = 0;
    for (int j = 0; j < N_TERMS; j++)
        if (active[j]) cols[m++] = j;
    memset(x, 0, sizeof(double) * N_TERMS);
    if (m == 0 || n < m) return;
    // Columns are scaled to unit size first: L^2 and 1 differ by many orders of magnitude.
    double *a = weft_alloc(sizeof(double) * n * m), *b = weft_alloc(sizeof(double) * n);
    double scale[N_TERMS] = {0};
    for (int i = 0; i < n; i++) {
        double f[N_TERMS];
        compute_terms(&s[i], f);
        for (int c = 0; c < m; c++) scale[c] = fmax(scale[c], f[cols[c]] / s[i].compute);
    }
    for (int i = 0; i < n; i++) {
        double f[N_TERMS];
        compute_terms(&s[i], f);
        for (int c = 0; c < m; c++) a[c * n + i] = f[cols[c]] / s[i].compute / scale[c];
        b[i] = 1.0;
    }
    int one = 1, lwork = -1, info = 0;
    double query;
    dgels_("N", &n, &m, &one, a, &n, b, &n, &query, &lwork, &info);
    lwork = (int)query;
    double *work = weft_alloc(sizeof(double) * (lwork > 0 ? lwork : 1));
    dgels_("N", &n, &m, &one, a, &n, b, &n, work, &lwork, &info);
    WEFT_CHECK(info == 0, "calibrate: the timings do not determine the cost model (LAPACK dgels "
               "info %d); time more distinct lengths", info);
    for (int c = 0; c < m; c++) x[cols[c]] = b[c] / scale[c];
    weft_free(a), weft_free(b), weft_free(work);
}

double weft_cost_sample_compute(const weft_cost_model *cm, const weft_cost_sample *s) {
    return weft_cost_compute(cm, s->len, s->degree) * s->n_docs + cm->epsilon;
}

weft_cost_model weft_cost_fit(const weft_cost_sample *s, int n, weft_cost_fit_error *err) {
    for (int i = 0; i < n; i++)
        WEFT_CHECK(s[i].compute > 0 && s[i].len > 0 && s[i].n_docs > 0 && s[i].degree > 0,
                   "calibrate: sample %d (%d documents of %d tokens at degree %d) has no "
                   "positive time", i + 1, s[i].n_docs, s[i].len, s[i].degree);
    // Non-negative least squares by elimination: a term that fits negative is dropped and the
    // rest refitted.
    bool active[N_TERMS] = {true, true, true, true};
    double x[N_TERMS];
    for (;;) {
        solve(s, n, active, x);
        int worst = -1;
        for (int j = 0; j < N_TERMS; j++)
            if (active[j] && x[j] < 0 && (worst < 0 || x[j] < x[worst])) worst = j;
        if (worst < 0) break;
        active[worst] = false;
    }
    weft_cost_model cm = {.alpha = x[0], .beta = x[1], .gamma = x[2], .epsilon = x[3]};
    // delta: one term through the origin, relative error: sum(u/y) / sum((u/y)^2), u the rows.
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].degree == 1 || s[i].comm <= 0) continue;
        double u = weft_cost_comm(&(weft_cost_model){.delta = 1}, s[i].len, s[i].degree) * s[i].n_docs;
        num += u / s[i].comm;
        den += (u / s[i].comm) * (u / s[i].comm);
    }
    cm.delta = den > 0 ? num / den : 0;

    weft_cost_fit_error e = {0};
    int n_comm = 0;
    for (int i = 0; i < n; i++) {
        double c = weft_cost_sample_compute(&cm, &s[i]);
        double rel = fabs(c - s[i].compute) / s[i].compute;
        e.compute_rms += rel * rel / n;
        e.compute_max = fmax(e.compute_max, rel);
        if (s[i].degree == 1 || s[i].comm <= 0) continue;
        double x_comm = weft_cost_comm(&cm, s[i].len, s[i].degree) * s[i].n_docs;
        rel = fabs(x_comm - s[i].comm) / s[i].comm;
        e.comm_rms += rel * rel;
        e.comm_max = fmax(e.comm_max, rel);
        n_comm++;
    }
    e.compute_rms = sqrt(e.compute_rms);
    e.comm_rms = n_comm > 0 ? sqrt(e.comm_rms / n_comm) : 0;
    if (err) *err = e;
    return cm;
}
