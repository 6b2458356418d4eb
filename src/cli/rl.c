// `weft rl [--config FILE.yaml] [--stats FILE.json] [key=value ...]`
#include "cli/cli.h"
#include "rl/loop.h"

int weft_cmd_rl(int argc, char **argv, weft_session *session) {
    weft_cli_args a = weft_cli_parse("rl", argc, argv, NULL, session);
    weft_job_config cfg = weft_rl_defaults();
    weft_job_config_resolve(&cfg, a.config, a.n_settings, a.settings);
    return weft_rl_run(&cfg, session, a.stats);
}
