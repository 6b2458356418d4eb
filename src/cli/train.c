// `weft train [--config FILE.yaml] [--stats FILE.json] [key=value ...]`
#include "cli/cli.h"
#include "train/loop.h"

int weft_cmd_train(int argc, char **argv, weft_session *session) {
    weft_cli_args a = weft_cli_parse("train", argc, argv, NULL, session);
    weft_job_config cfg = weft_job_config_default();
    weft_job_config_resolve(&cfg, a.config, a.n_settings, a.settings);
    return weft_train_run(&cfg, session, a.stats);
}
