// `weft train [--config FILE.yaml] [key=value ...]`
#include <string.h>

#include "cli/cli.h"
#include "train/loop.h"

int weft_cmd_train(int argc, char **argv, weft_comm *world) {
    weft_job_config cfg = weft_job_config_default();
    int first_override = 0;
    if (argc >= 2 && !strcmp(argv[0], "--config")) {
        weft_job_config_load_yaml(&cfg, argv[1]);
        first_override = 2;
    }
    for (int i = first_override; i < argc; i++)
        WEFT_CHECK(argv[i][0] != '-', "train: unknown option \"%s\"; use --config FILE or key=value",
                   argv[i]);
    weft_job_config_apply_overrides(&cfg, argc - first_override, argv + first_override);
    return weft_train_run(&cfg, world);
}
