// `weft plot METRICS.jsonl -o FILE.png`: the run's curves through gnuplot.
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/core.h"

static double field(json_t *r, const char *key) {
    json_t *v = json_object_get(r, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

// The columns plotted: SFT "step loss accuracy lr"; RL (records with reward_mean) "step reward
// accuracy eval_accuracy response_length entropy rollout_s logprob_s update_s" (NaN: absent).
static const char *const SFT_COLUMNS[] = {"loss", "accuracy", "lr", NULL};
static const char *const RL_COLUMNS[] = {"reward_mean", "accuracy", "eval_accuracy",
                                         "response_length_mean", "entropy", "rollout_seconds",
                                         "old_logprob_seconds", "update_seconds", NULL};

// Writes the rows for gnuplot; returns the number of rows. *rl: the metrics are an RL run's.
static int write_table(const char *metrics, FILE *out, bool *rl) {
    FILE *f = fopen(metrics, "r");
    WEFT_CHECK(f, "%s: cannot open (%s)", metrics, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int rows = 0;
    long lineno = 0;
    while (getline(&line, &cap, f) != -1) {
        lineno++;
        json_error_t err;
        json_t *r = json_loads(line, 0, &err);
        WEFT_CHECK(r && json_is_integer(json_object_get(r, "step")) &&
                       json_is_number(json_object_get(r, "loss")),
                   "%s:%ld: not a metrics record (%s); give the metrics.jsonl of a weft run",
                   metrics, lineno, r ? "no step/loss" : err.text);
        if (rows == 0) *rl = json_object_get(r, "reward_mean") != NULL;
        fprintf(out, "%lld", (long long)json_integer_value(json_object_get(r, "step")));
        for (const char *const *c = *rl ? RL_COLUMNS : SFT_COLUMNS; *c; c++)
            fprintf(out, " %.9g", field(r, *c));
        fprintf(out, "\n");
        json_decref(r);
        rows++;
    }
    free(line);
    fclose(f);
    WEFT_CHECK(rows > 0, "%s: no metrics records to plot", metrics);
    return rows;
}

static void plot_sft(FILE *gp, const char *png, const char *metrics, const char *table) {
    fprintf(gp,
            "set terminal pngcairo size 1000,640 font 'sans,11'\n"
            "set output '%s'\n"
            "set multiplot layout 2,1 title '%s'\n"
            "set grid\n"
            "set ylabel 'loss (token mean)'\n"
            "set key top right\n"
            "plot '%s' using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'loss'\n"
            "set xlabel 'step'\n"
            "set ylabel 'top-1 accuracy'\n"
            "set y2label 'learning rate'\n"
            "set ytics nomirror\n"
            "set y2tics\n"
            "set key bottom right\n"
            "plot '%s' using 1:3 with lines lw 2 lc rgb '#2ca02c' title 'accuracy', "
            "'' using 1:4 axes x1y2 with lines dt 2 lc rgb '#888888' title 'lr'\n"
            "unset multiplot\n",
            png, metrics, table, table);
}

// Reward and accuracy (held-out points too), response length, entropy, and each phase's seconds.
static void plot_rl(FILE *gp, const char *png, const char *metrics, const char *table) {
    fprintf(gp,
            "set terminal pngcairo size 1200,800 font 'sans,11'\n"
            "set output '%s'\n"
            "set datafile missing NaN\n"
            "set multiplot layout 2,2 title '%s'\n"
            "set grid\n"
            "set xlabel 'step'\n"
            "set key bottom right\n"
            "set ylabel 'reward / accuracy'\n"
            "plot '%s' using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'reward (mean)', "
            "'' using 1:3 with lines lc rgb '#2ca02c' title 'accuracy (samples)', "
            "'' using 1:4 with linespoints pt 7 lc rgb '#d62728' title 'held-out (greedy)'\n"
            "set ylabel 'tokens'\n"
            "plot '%s' using 1:5 with lines lw 2 lc rgb '#9467bd' title 'response length (mean)'\n"
            "set ylabel 'nats'\n"
            "plot '%s' using 1:6 with lines lw 2 lc rgb '#8c564b' title 'entropy'\n"
            "set ylabel 'seconds'\n"
            "set key top right\n"
            "plot '%s' using 1:7 with lines lw 2 title 'rollout', '' using 1:8 with lines lw 2 "
            "title 'old log-probs', '' using 1:9 with lines lw 2 title 'policy updates'\n"
            "unset multiplot\n",
            png, metrics, table, table, table, table);
}

int weft_cmd_plot(int argc, char **argv) {
    const char *metrics = NULL, *out = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (argv[i][0] != '-' && !metrics) metrics = argv[i];
        else weft_fatal("plot: unexpected argument \"%s\"; usage: weft plot METRICS.jsonl -o FILE.png", argv[i]);
    }
    WEFT_CHECK(metrics && out, "usage: weft plot METRICS.jsonl -o FILE.png");
    char table[] = "/tmp/weft-plot-XXXXXX";
    int fd = mkstemp(table);
    WEFT_CHECK(fd >= 0, "cannot create a temporary file for the plot data");
    FILE *t = fdopen(fd, "w");
    bool rl = false;
    write_table(metrics, t, &rl);
    fclose(t);

    // Render to a temporary name first: a failed plot never leaves a half-written PNG behind.
    size_t n = strlen(out) + 16;
    char *tmp_png = weft_alloc(n);
    snprintf(tmp_png, n, "%s.tmp.png", out);
    FILE *gp = popen("gnuplot 2>&1", "w");
    WEFT_CHECK(gp, "cannot run gnuplot; install Debian's gnuplot-nox");
    if (rl) plot_rl(gp, tmp_png, metrics, table);
    else plot_sft(gp, tmp_png, metrics, table);
    int status = pclose(gp);
    unlink(table);
    if (status != 0) {
        unlink(tmp_png);
        weft_fatal("gnuplot failed (status %d) drawing %s", status, out);
    }
    WEFT_CHECK(rename(tmp_png, out) == 0, "%s: cannot write (%s)", out, strerror(errno));
    weft_free(tmp_png);
    printf("wrote %s\n", out);
    return 0;
}
