#include "train/stats.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *numbers(const double *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

json_t *weft_stats_of_result(const weft_step_result *r) {
    return json_pack("{s:f, s:f, s:o, s:o, s:f, s:I, s:I, s:f, s:f, s:f, s:I}", "loss", r->loss,
                     "accuracy", r->accuracy, "mtp_loss", numbers(r->mtp_loss, r->mtp_depth),
                     "mtp_accuracy", numbers(r->mtp_accuracy, r->mtp_depth), "grad_norm",
                     r->grad_norm, "targets", (json_int_t)r->n_targets, "tokens",
                     (json_int_t)r->n_tokens, "seconds", r->seconds, "sync_wait_seconds",
                     r->sync_wait_seconds, "cp_comm_seconds", r->cp_comm_seconds, "host_waits",
                     (json_int_t)r->host_waits);
}

json_t *weft_stats_of_memory(const weft_memory_report *mine, weft_comm *world) {
    int W = weft_comm_size(world);
    double peak = (double)mine->peak_activations, most = 0;
    double *peaks = weft_alloc(sizeof(double) * W);
    weft_comm_allgather(world, &peak, peaks, 1, WEFT_COMM_F64);
    for (int r = 0; r < W; r++) most = peaks[r] > most ? peaks[r] : most;
    weft_free(peaks);
    return json_pack("{s:I, s:I, s:I, s:I, s:I}", "parameters", (json_int_t)mine->parameters,
                     "gradients", (json_int_t)mine->gradients, "optimizer_state",
                     (json_int_t)mine->optimizer_state, "peak_activations",
                     (json_int_t)mine->peak_activations, "peak_activations_max_rank",
                     (json_int_t)most);
}

json_t *weft_stats_of_collectives(const weft_comm_stats *s, int ranks) {
    json_t *o = json_pack("{s:i, s:I}", "ranks", ranks, "bytes", (json_int_t)s->bytes);
    for (int op = 0; op < WEFT_N_OPS; op++)
        json_object_set_new(o, weft_comm_op_name(op), json_integer(s->calls[op]));
    return o;
}

void weft_stats_save(json_t *root, const char *path) {
    if (path) {
        char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
        WEFT_CHECK(text && weft_write_file_atomic(path, text, strlen(text)),
                   "%s: cannot write the statistics (%s)", path, strerror(errno));
        free(text);
    }
    json_decref(root);
}

void weft_print_memory_report(const weft_memory_report *r) {
    char a[32], b[32], c[32], d[32];
    weft_format_bytes(a, sizeof a, r->parameters);
    weft_format_bytes(b, sizeof b, r->gradients);
    weft_format_bytes(c, sizeof c, r->optimizer_state);
    weft_format_bytes(d, sizeof d, r->peak_activations);
    printf("memory: parameters %s, gradients %s, optimizer state %s, peak activations %s\n", a, b,
           c, d);
    fflush(stdout);
}
