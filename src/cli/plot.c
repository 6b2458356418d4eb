// `weft plot METRICS.jsonl -o FILE.png`: the run's curves through gnuplot.
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/core.h"

// Writes "step loss accuracy lr" rows for gnuplot; returns the number of rows.
static int write_table(const char *metrics, FILE *out) {
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
        fprintf(out, "%lld %.9g %.6g %.6g\n", (long long)json_integer_value(json_object_get(r, "step")),
                json_number_value(json_object_get(r, "loss")),
                json_number_value(json_object_get(r, "accuracy")),
                json_number_value(json_object_get(r, "lr")));
        json_decref(r);
        rows++;
    }
    free(line);
    fclose(f);
    WEFT_CHECK(rows > 0, "%s: no metrics records to plot", metrics);
    return rows;
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
    write_table(metrics, t);
    fclose(t);

    // Render to a temporary name first: a failed plot never leaves a half-written PNG behind.
    size_t n = strlen(out) + 16;
    char *tmp_png = weft_alloc(n);
    snprintf(tmp_png, n, "%s.tmp.png", out);
    FILE *gp = popen("gnuplot 2>&1", "w");
    WEFT_CHECK(gp, "cannot run gnuplot; install Debian's gnuplot-nox");
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
            tmp_png, metrics, table, table);
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
