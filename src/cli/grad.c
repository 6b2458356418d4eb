// `weft grad --model DIR --batch FILE.jsonl --out FILE.safetensors [--logits] [--logprobs]
// [--entropy] [--score] [--busy] [--config FILE.yaml] [--stats FILE.json] [key=value ...]`
#include "cli/cli.h"
#include "core/core.h"
#include "rl/objective.h"
#include "train/grad.h"

static json_t *rl_report(const weft_token_objective *objective) {
    weft_rl_metrics m = weft_rl_objective_metrics(objective->ctx);
    return weft_rl_metrics_json(&m);
}

int weft_cmd_grad(int argc, char **argv, weft_session *session) {
    weft_grad_request r = {0};
    const weft_cli_option opts[] = {
        {"--model", &r.model_dir, NULL}, {"--batch", &r.batch, NULL}, {"--out", &r.out, NULL},
        {"--logits", NULL, &r.logits},   {"--logprobs", NULL, &r.logprobs},
        {"--entropy", NULL, &r.entropy}, {"--score", NULL, &r.score},
        {"--busy", NULL, &r.busy},       {NULL, NULL, NULL}};
    weft_cli_args a = weft_cli_parse("grad", argc, argv, opts, session);
    WEFT_CHECK(r.model_dir && r.out, "grad needs --model DIR and --out FILE.safetensors (and "
               "--batch FILE.jsonl, or data.source's first global batch is used)");
    r.stats = a.stats;
    r.cfg = weft_grad_defaults();
    weft_job_config_resolve(&r.cfg, a.config, a.n_settings, a.settings);
    weft_rl_objective *rl = weft_rl_objective_create(&r.cfg.rl, r.cfg.sampling.max_tokens,
                                                     r.batch ? r.batch : r.cfg.data.source);
    r.rl_objective = weft_rl_objective_hooks(rl);
    r.rl_report = rl_report;
    int status = weft_grad_run(&r, session);
    weft_rl_objective_free(rl);
    return status;
}
