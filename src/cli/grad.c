// `weft grad`: the loss and full gradients of one global batch, written as safetensors. The tool
// users run to check a model or a data pipeline against another implementation, and our tests run
// against the PyTorch reference.
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "data/jsonl.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "train/step.h"

typedef struct grad_args {
    const char *model_dir, *batch, *out;
    bool logits;
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

static void add_params(weft_safetensors_writer *w, const weft_model *m, const char *prefix,
                       bool grads) {
    size_t max = 0;
    for (int i = 0; i < m->n_params; i++) max = m->params[i].numel > max ? m->params[i].numel : max;
    float *host = weft_alloc(max * sizeof(float));
    char name[160];
    for (int i = 0; i < m->n_params; i++) {
        const weft_param_info *p = &m->params[i];
        if (grads) m->be->to_host(m->be, host, weft_model_grad(m, i), p->numel * sizeof(float));
        else m->be->to_f32(m->be, host, weft_model_param(m, i), m->be->param_dtype, p->numel);
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        weft_safetensors_writer_add_f32(w, name, host, p->ndim, p->shape);
    }
    weft_free(host);
}

int weft_cmd_grad(int argc, char **argv) {
    grad_args a = parse_args(argc, argv);
    weft_job_config cfg = weft_job_config_default();
    weft_job_config_apply_overrides(&cfg, a.n_overrides, a.overrides);

    char path[4096];
    weft_model_config mc;
    snprintf(path, sizeof path, "%s/config.json", a.model_dir);
    weft_model_config_load(path, &mc);
    weft_backend *be = weft_backend_cpu_create();
    weft_model *m = weft_model_create(be, &mc);
    snprintf(path, sizeof path, "%s/model.safetensors", a.model_dir);
    weft_model_load_safetensors(m, path);
    weft_document_set *docs = weft_read_token_jsonl(a.batch, mc.vocab_size);
    weft_trainer *t = weft_trainer_create(m, &cfg, cfg.steps > 0);

    long T = 0;
    for (int i = 0; i < docs->n; i++) T += docs->docs[i].len;
    float *logits = a.logits ? weft_alloc(sizeof(float) * T * mc.vocab_size) : NULL;
    weft_step_result r = weft_trainer_gradients(t, docs->docs, docs->n, logits);
    printf("grad: %d documents, %ld tokens, %ld targets, loss %.6f, grad norm %.6f\n", docs->n,
           r.n_tokens, r.n_targets, r.loss, r.grad_norm);

    weft_safetensors_writer *w = weft_safetensors_writer_create();
    float loss = (float)r.loss;
    weft_safetensors_writer_add_f32(w, "loss", &loss, 0, NULL);
    add_params(w, m, "grad.", true);
    if (logits) {
        int64_t shape[2] = {T, mc.vocab_size};
        weft_safetensors_writer_add_f32(w, "logits", logits, 2, shape);
    }
    if (cfg.steps > 0) {
        float *losses = weft_alloc(sizeof(float) * cfg.steps);
        for (int s = 0; s < cfg.steps; s++) {
            weft_step_result sr = weft_trainer_step(t, docs->docs, docs->n);
            losses[s] = (float)sr.loss;
            printf("step %d/%d: loss %.6f, grad norm %.6f, lr %.3e\n", s + 1, cfg.steps, sr.loss,
                   sr.grad_norm, sr.lr);
        }
        int64_t shape[1] = {cfg.steps};
        weft_safetensors_writer_add_f32(w, "step_losses", losses, 1, shape);
        add_params(w, m, "param.", false);
        weft_free(losses);
    }
    weft_memory_report mem = weft_trainer_memory(t);
    weft_print_memory_report(&mem);
    WEFT_CHECK(weft_safetensors_writer_save(w, a.out), "%s: cannot write the output file", a.out);

    weft_safetensors_writer_free(w);
    weft_free(logits);
    weft_trainer_free(t);
    weft_document_set_free(docs);
    weft_model_free(m);
    weft_backend_destroy(be);
    return 0;
}
