// `weft grad`: the loss and full gradients of one global batch, written as safetensors. The tool
// users run to check a model or a data pipeline against another implementation, and our tests run
// against the PyTorch reference.
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "train/loop.h"
#include "data/jsonl.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "train/step.h"

typedef struct grad_args {
    const char *model_dir, *batch, *out;
    bool logits, logprobs, busy;
    int n_overrides;
    char **overrides;
} grad_args;

static grad_args parse_args(int argc, char **argv) {
    grad_args a = {0};
    a.overrides = argv;
    for (int i = 0; i < argc; i++) {
        const char **slot = !strcmp(argv[i], "--model") ? &a.model_dir
                          : !strcmp(argv[i], "--batch") ? &a.batch
                          : !strcmp(argv[i], "--out")   ? &a.out
                                                        : NULL;
        if (slot) {
            WEFT_CHECK(i + 1 < argc, "%s needs a value", argv[i]);
            *slot = argv[++i];
        } else if (!strcmp(argv[i], "--logits")) {
            a.logits = true;
        } else if (!strcmp(argv[i], "--logprobs")) {
            a.logprobs = true;
        } else if (!strcmp(argv[i], "--busy")) {
            a.busy = true;
        } else if (argv[i][0] == '-') {
            weft_fatal("grad: unknown option \"%s\"; see weft --help", argv[i]);
        } else {
            a.overrides[a.n_overrides++] = argv[i];
        }
    }
    WEFT_CHECK(a.model_dir && a.batch && a.out,
               "grad needs --model DIR --batch FILE.jsonl --out FILE.safetensors");
    return a;
}

// Prints column p of every rank's row (values[r * stride + p]), with its max over mean.
static void print_spread(const char *what, const double *values, int W, int stride, int p) {
    double most = 0, sum = 0;
    printf("busy: %s:", what);
    for (int r = 0; r < W; r++) {
        double b = values[r * stride + p];
        printf(" %.4f", b);
        most = b > most ? b : most;
        sum += b;
    }
    printf(" s; max %.4f mean %.4f imbalance %.3f\n", most, sum / W, sum > 0 ? most * W / sum : 1.0);
}

// The last gradient computation's micro-batches, gathered from every rank (all ranks enter) and
// printed by rank 0: each rank's degrees and busy seconds; per micro-batch across ranks when all
// ranks ran the same degrees (uniform DCP, static CP), so the p-th ran side by side; and each
// rank's total, with max over mean: the load balance of the plan.
static void report_busy(const weft_trainer *t, weft_comm *world) {
    int W = weft_comm_size(world);
    double mine = t->n_micro, *counts = weft_alloc(sizeof(double) * W);
    weft_comm_allgather(world, &mine, counts, 1, WEFT_COMM_F64);
    int M = 0;
    for (int r = 0; r < W; r++) M = counts[r] > M ? (int)counts[r] : M;
    int stride = 2 * M + 1; // busy, degree per micro-batch, then the total
    double *local = weft_alloc(sizeof(double) * stride), *all = weft_alloc(sizeof(double) * W * stride);
    for (int p = 0; p < t->n_micro; p++) {
        local[p] = t->micro_busy[p];
        local[M + p] = t->micro_degree[p];
        local[2 * M] += t->micro_busy[p];
    }
    weft_comm_allgather(world, local, all, stride, WEFT_COMM_F64);
    if (weft_comm_rank(world) == 0) {
        bool same = true;
        for (int r = 0; r < W; r++) {
            printf("busy: rank %d:", r);
            for (int p = 0; p < counts[r]; p++)
                printf(" %.4f(%d)", all[r * stride + p], (int)all[r * stride + M + p]);
            printf(" s (degree); total %.4f s\n", all[r * stride + 2 * M]);
            for (int p = 0; p < M; p++) same = same && all[r * stride + M + p] == all[M + p];
        }
        for (int p = 0; p < M && same; p++) {
            char what[64];
            snprintf(what, sizeof what, "micro-batch %d degree %d", p + 1, (int)all[M + p]);
            print_spread(what, all, W, stride, p);
        }
        print_spread("total per rank", all, W, stride, 2 * M);
    }
    weft_free(counts), weft_free(local), weft_free(all);
}

int weft_cmd_grad(int argc, char **argv, weft_comm *world) {
    grad_args a = parse_args(argc, argv);
    weft_job_config cfg = weft_job_config_default();
    cfg.train.steps = 0; // a gradient check runs no optimizer step unless asked
    cfg.train.max_tokens_per_microbatch = 0; // train.micro_batches cuts the batch
    weft_job_config_apply_overrides(&cfg, a.n_overrides, a.overrides);

    char path[4096];
    weft_model_config mc;
    snprintf(path, sizeof path, "%s/config.json", a.model_dir);
    weft_model_config_load(path, &mc);
    weft_backend *be = weft_train_backend(&cfg, world);
    weft_model *m = weft_trainer_build_model(be, world, &mc);
    snprintf(path, sizeof path, "%s/model.safetensors", a.model_dir);
    weft_model_load_safetensors(m, path);
    weft_document_set *docs = weft_read_token_jsonl(a.batch, mc.vocab_size);
    weft_trainer *t = weft_trainer_create(m, world, &cfg, cfg.train.steps > 0);
    bool writer = weft_comm_rank(world) == 0;

    long T = 0;
    for (int i = 0; i < docs->n; i++) T += docs->docs[i].len;
    weft_model_outputs out = {
        .logits = a.logits ? weft_alloc(sizeof(float) * T * mc.vocab_size) : NULL,
        .logprobs = a.logprobs ? weft_alloc(sizeof(float) * (T > 0 ? T : 1)) : NULL};
    weft_step_result r = weft_trainer_gradients(t, docs->docs, docs->n, &out);
    weft_trainer_gather_gradients(t);
    if (writer) printf("grad: %d documents, %ld tokens, %ld targets, loss %.6f, grad norm %.6f\n", docs->n,
           r.n_tokens, r.n_targets, r.loss, r.grad_norm);
    for (int k = 0; k < r.mtp_depth && writer; k++)
        printf("grad: MTP depth %d loss %.6f, accuracy %.4f\n", k + 1, r.mtp_loss[k],
               r.mtp_accuracy[k]);

    weft_safetensors_writer *w = weft_safetensors_writer_create();
    float loss = (float)r.loss;
    weft_safetensors_writer_add_f32(w, "loss", &loss, 0, NULL);
    if (r.mtp_depth > 0) {
        float mtp[WEFT_MAX_MTP];
        for (int k = 0; k < r.mtp_depth; k++) mtp[k] = (float)r.mtp_loss[k];
        int64_t shape[1] = {r.mtp_depth};
        weft_safetensors_writer_add_f32(w, "mtp_losses", mtp, 1, shape);
    }
    weft_model_add_tensors(m, w, "grad.", m->grad_buf, 0);
    if (out.logits) {
        int64_t shape[2] = {T, mc.vocab_size};
        weft_safetensors_writer_add_f32(w, "logits", out.logits, 2, shape);
    }
    if (out.logprobs) {
        int64_t shape[1] = {T};
        weft_safetensors_writer_add_f32(w, "logprobs", out.logprobs, 1, shape);
    }
    if (cfg.train.steps > 0) {
        float *losses = weft_alloc(sizeof(float) * cfg.train.steps);
        for (int s = 0; s < cfg.train.steps; s++) {
            weft_step_result sr = weft_trainer_step(t, docs->docs, docs->n);
            losses[s] = (float)sr.loss;
            if (writer)
                printf("step %d/%d: loss %.6f, grad norm %.6f, lr %.3e, %.4f s, %.0f tokens/s, "
                       "sync wait %.4f s, cp comm %.4f s\n",
                       s + 1, cfg.train.steps, sr.loss, sr.grad_norm, sr.lr, sr.seconds,
                       (double)sr.n_tokens / sr.seconds, sr.sync_wait_seconds, sr.cp_comm_seconds);
        }
        int64_t shape[1] = {cfg.train.steps};
        weft_safetensors_writer_add_f32(w, "step_losses", losses, 1, shape);
        weft_model_add_tensors(m, w, "param.", NULL, 0);
        weft_free(losses);
    }
    weft_memory_report mem = weft_trainer_memory(t);
    weft_comm_stats cs = weft_comm_get_stats(world); // the job's collectives, before the reports'
    if (a.busy) report_busy(t, world);
    // Every rank's peak, gathered (all ranks enter), so the largest is what gets reported.
    int W = weft_comm_size(world);
    double mine = (double)mem.peak_activations, *peaks = weft_alloc(sizeof(double) * W), most = 0;
    weft_comm_allgather(world, &mine, peaks, 1, WEFT_COMM_F64);
    for (int r = 0; r < W; r++) most = peaks[r] > most ? peaks[r] : most;
    weft_free(peaks);
    if (writer) {
        weft_print_memory_report(&mem);
        printf("memory: peak_activations_max_rank=%.0f", most);
        if (cfg.parallel.dynamic_context_parallel) {
            // A rank holds at most max_seqlen_per_rank rows of at most as many documents, and its
            // attention sees at most W times that many keys.
            int N = cfg.parallel.max_seqlen_per_rank;
            printf(" bound_for_max_seqlen_per_rank=%zu", weft_model_activation_bytes(m, N, W * N, N, W > 1));
        }
        printf("\n");
        printf("collectives: ranks=%d allreduce=%ld reduce_scatter=%ld allgather=%ld\n",
               weft_comm_size(world), cs.calls[WEFT_OP_ALLREDUCE], cs.calls[WEFT_OP_REDUCE_SCATTER],
               cs.calls[WEFT_OP_ALLGATHER]);
        WEFT_CHECK(weft_safetensors_writer_save(w, a.out), "%s: cannot write the output file", a.out);
    }

    weft_safetensors_writer_free(w);
    weft_free(out.logits);
    weft_free(out.logprobs);
    weft_trainer_free(t);
    weft_document_set_free(docs);
    weft_model_free(m);
    weft_backend_destroy(be);
    return 0;
}
