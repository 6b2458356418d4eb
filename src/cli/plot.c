// `weft plot METRICS.jsonl -o FILE.png|FILE.svg [--log]`: the run's curves through gnuplot.
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
#include "data/jsonl.h"

static const char USAGE[] = "usage: weft plot METRICS.jsonl -o FILE.png|FILE.svg [--log]";

static double field(json_t *r, const char *key) {
    json_t *v = json_object_get(r, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

// The columns plotted: SFT "step loss accuracy lr"; RL (records with reward_mean) "step reward
// accuracy eval_accuracy response_length entropy rollout_s logprob_s update_s reward_kl wait_s
// pass@N" (NaN: absent; pass@N the record's eval_pass_at_K of the largest K).
static const char *const SFT_COLUMNS[] = {"loss", "accuracy", "lr", NULL};
static const char *const RL_COLUMNS[] = {"reward_mean", "accuracy", "eval_accuracy",
                                         "response_length_mean", "entropy", "rollout_seconds",
                                         "old_logprob_seconds", "update_seconds",
                                         "reward_kl_penalty", "sample_wait_seconds", NULL};

typedef struct table_info {
    int rows;
    bool rl;                    // the metrics are an RL run's
    bool kl_in_reward;          // ... with the KL to the reference in its rewards
    bool waited;                // ... whose trainers waited for other ranks' samples
    int pass_k;                 // ... the held-out pass@k reported with the largest k (0: none)
    double loss_min, loss_max;  // over the rows, for the loss axis' scale
} table_info;

// The largest K of the record's eval_pass_at_K (0: none).
static int largest_pass_k(json_t *r) {
    const char *key;
    json_t *v;
    int most = 0;
    json_object_foreach(r, key, v) {
        int k;
        if (sscanf(key, "eval_pass_at_%d", &k) == 1 && k > most) most = k;
    }
    return most;
}

// Writes the rows for gnuplot.
static table_info write_table(const char *metrics, FILE *out) {
    weft_jsonl_reader *reader = weft_jsonl_open(metrics, "the metrics",
                                                "{\"step\": 1, \"loss\": 2.5, ...}");
    table_info info = {.loss_min = INFINITY, .loss_max = -INFINITY};
    for (json_t *r; (r = weft_jsonl_next(reader));) {
        WEFT_CHECK(json_is_integer(json_object_get(r, "step")) &&
                       json_is_number(json_object_get(r, "loss")),
                   "%s: not a metrics record (no step/loss); give the metrics.jsonl of a weft run",
                   weft_jsonl_where(reader));
        if (info.rows == 0) info.rl = json_object_get(r, "reward_mean") != NULL;
        if (info.rows == 0) info.kl_in_reward = json_object_get(r, "reward_kl_penalty") != NULL;
        double loss = field(r, "loss");
        info.loss_min = fmin(info.loss_min, loss), info.loss_max = fmax(info.loss_max, loss);
        fprintf(out, "%lld", (long long)json_integer_value(json_object_get(r, "step")));
        for (const char *const *c = info.rl ? RL_COLUMNS : SFT_COLUMNS; *c; c++)
            fprintf(out, " %.9g", field(r, *c));
        if (info.rl) {
            info.waited |= field(r, "sample_wait_seconds") > 0;
            int k = largest_pass_k(r);
            char key[48];
            snprintf(key, sizeof key, "eval_pass_at_%d", k);
            if (k > 0) info.pass_k = k;
            fprintf(out, " %.9g", k > 0 ? field(r, key) : NAN);
        }
        fprintf(out, "\n");
        json_decref(r);
        info.rows++;
    }
    weft_jsonl_close(reader);
    WEFT_CHECK(info.rows > 0, "%s: no metrics records to plot", metrics);
    return info;
}

// The loss (log scale when asked, or when it spans more than two decades) over accuracy and
// learning rate; fixed margins keep the two panels' step axes aligned, legends sit below.
static void plot_sft(FILE *gp, const char *title, const char *table, bool log_scale) {
    fprintf(gp,
            "set multiplot layout 2,1 title '%s'\n"
            "set lmargin at screen 0.09\n"
            "set rmargin at screen 0.88\n"
            "set grid\n"
            "set key below\n"
            "set ylabel 'loss (token mean)'\n"
            "%s"
            "plot '%s' using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'loss'\n"
            "unset logscale y\n"
            "set xlabel 'step'\n"
            "set ylabel 'top-1 accuracy'\n"
            "set y2label 'learning rate'\n"
            "set ytics nomirror\n"
            "set y2tics\n"
            "plot '%s' using 1:3 with lines lw 2 lc rgb '#2ca02c' title 'accuracy', "
            "'' using 1:4 axes x1y2 with lines dt 2 lc rgb '#888888' title 'lr'\n"
            "unset multiplot\n",
            title, log_scale ? "set logscale y\n" : "", table, table);
}

// Reward and accuracy (held-out points too: with several responses a problem their mean and
// pass@N), response length, entropy (and the KL to the reference the rewards were charged, in the
// same nats per token), and each phase's seconds (with rollout ranks, the trainers' wait too).
static void plot_rl(FILE *gp, const char *title, const char *table, const table_info *info) {
    char held_out[64] = "held-out (greedy)", pass[160] = "", wait[96] = "";
    if (info->pass_k > 0) {
        snprintf(held_out, sizeof held_out, "held-out (mean@%d)", info->pass_k);
        snprintf(pass, sizeof pass, ", '' using 1:12 with linespoints pt 6 dt 2 lc rgb '#d62728' "
                 "title 'held-out pass@%d'", info->pass_k);
    }
    if (info->waited)
        snprintf(wait, sizeof wait, ", '' using 1:11 with lines lw 2 dt 2 title 'trainers waiting "
                 "for samples'");
    fprintf(gp,
            "set datafile missing NaN\n"
            "set multiplot layout 2,2 title '%s'\n"
            "set grid\n"
            "set xlabel 'step'\n"
            "set key below\n"
            "set ylabel 'reward / accuracy'\n"
            "plot '%s' using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'reward (mean)', "
            "'' using 1:3 with lines lc rgb '#2ca02c' title 'accuracy (samples)', "
            "'' using 1:4 with linespoints pt 7 lc rgb '#d62728' title '%s'%s\n"
            "set ylabel 'tokens'\n"
            "plot '%s' using 1:5 with lines lw 2 lc rgb '#9467bd' title 'response length (mean)'\n"
            "set ylabel 'nats'\n"
            "plot '%s' using 1:6 with lines lw 2 lc rgb '#8c564b' title 'entropy'%s\n"
            "set ylabel 'seconds'\n"
            "plot '%s' using 1:7 with lines lw 2 title 'rollout%s', '' using 1:8 with lines lw 2 "
            "title 'old log-probs', '' using 1:9 with lines lw 2 title 'policy updates'%s\n"
            "unset multiplot\n",
            title, table, held_out, pass, table, table,
            info->kl_in_reward ? ", '' using 1:10 with lines dt 2 lc rgb '#17becf' title 'KL to "
                                 "reference (in the reward)'"
                               : "",
            table, info->waited ? " (rollout ranks)" : "", wait);
}

// The gnuplot terminal of the output's extension, after checking that the file can be written
// there: a bad -o is one error before gnuplot runs.
static const char *terminal_for(const char *out) {
    const char *dot = strrchr(out, '.');
    const char *term = dot && !strcmp(dot, ".png") ? "pngcairo" : dot && !strcmp(dot, ".svg") ? "svg" : NULL;
    WEFT_CHECK(term, "-o %s: give a file ending in .png or .svg", out);
    WEFT_CHECK(!strchr(out, '\'') && !strchr(out, '\n'), "-o %s: the name may not hold a quote "
               "or a newline", out);
    weft_prepare_output(out, "the plot");
    return term;
}

// gnuplot's own words when it fails: the last lines it wrote.
noreturn static void gnuplot_failed(const char *log, int status, const char *out) {
    size_t n = 0;
    char *text = weft_read_file(log, &n);
    const char *tail = text ? text + (n > 600 ? n - 600 : 0) : "";
    unlink(log);
    weft_fatal("gnuplot failed (status %d) drawing %s: %s", status, out, tail);
}

static void make_temp(char *name, const char *what) {
    int fd = mkstemp(name);
    WEFT_CHECK(fd >= 0, "cannot create a temporary file for the plot's %s", what);
    close(fd);
}

int weft_cmd_plot(int argc, char **argv) {
    const char *metrics = NULL, *out = NULL;
    bool log_scale = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--log")) log_scale = true;
        else if (argv[i][0] != '-' && !metrics) metrics = argv[i];
        else weft_fatal("plot: unexpected argument \"%s\"; %s", argv[i], USAGE);
    }
    WEFT_CHECK(metrics && out, "%s", USAGE);
    WEFT_CHECK(!strchr(metrics, '\''), "%s: the name may not hold a quote", metrics);
    const char *term = terminal_for(out);
    char table[] = "/tmp/weft-plot-XXXXXX", log[] = "/tmp/weft-plot-log-XXXXXX";
    make_temp(table, "data");
    FILE *t = fopen(table, "w");
    WEFT_CHECK(t, "cannot write the plot's data to %s", table);
    table_info info = write_table(metrics, t);
    fclose(t);
    log_scale = log_scale || (info.loss_min > 0 && info.loss_max > 100 * info.loss_min);

    // Render to a temporary name first: a failed plot never leaves a half-written file behind;
    // gnuplot's output goes to a log, never to the terminal.
    size_t n = strlen(out) + 16;
    char *tmp_out = weft_alloc(n), command[64];
    snprintf(tmp_out, n, "%s.tmp%s", out, strrchr(out, '.'));
    make_temp(log, "log");
    snprintf(command, sizeof command, "gnuplot > %s 2>&1", log);
    FILE *gp = popen(command, "w");
    WEFT_CHECK(gp, "cannot run gnuplot; install Debian's gnuplot-nox");
    fprintf(gp, "set terminal %s size %d,%d font 'sans,11'\nset termoption noenhanced\n"
            "set output '%s'\n", term, info.rl ? 1200 : 1000, info.rl ? 800 : 640, tmp_out);
    if (info.rl) plot_rl(gp, metrics, table, &info);
    else plot_sft(gp, metrics, table, log_scale);
    int status = pclose(gp);
    unlink(table);
    if (status != 0) {
        unlink(tmp_out);
        gnuplot_failed(log, status, out);
    }
    unlink(log);
    WEFT_CHECK(rename(tmp_out, out) == 0, "%s: cannot write (%s)", out, strerror(errno));
    weft_free(tmp_out);
    printf("wrote %s\n", out);
    return 0;
}
