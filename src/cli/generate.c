// `weft generate --model DIR --prompts FILE.jsonl --out FILE.jsonl [--config FILE.yaml]
// [--stats FILE.json] [key=value ...]`
#include "cli/cli.h"
#include "core/core.h"
#include "rollout/generate.h"
#include "train/config.h"

int weft_cmd_generate(int argc, char **argv, weft_session *session) {
    weft_generate_request r = {0};
    const weft_cli_option opts[] = {{"--model", &r.model_dir, NULL},
                                    {"--prompts", &r.prompts, NULL},
                                    {"--out", &r.out, NULL},
                                    {NULL, NULL, NULL}};
    weft_cli_args a = weft_cli_parse("generate", argc, argv, opts, session);
    WEFT_CHECK(r.model_dir && r.prompts && r.out,
               "generate needs --model DIR --prompts FILE.jsonl --out FILE.jsonl");
    weft_job_config cfg = weft_job_config_default();
    weft_job_config_resolve(&cfg, a.config, a.n_settings, a.settings);
    r.stats = a.stats;
    r.drop_tensors = cfg.model.drop_tensors;
    r.device = cfg.device;
    r.device_timeout = cfg.device_timeout;
    r.collective_timeout = cfg.parallel.collective_timeout;
    r.debug_collectives = cfg.parallel.debug_collectives;
    r.sampling = cfg.sampling;
    r.rollout = cfg.rollout;
    return weft_generate_run(&r, weft_session_world(session));
}
