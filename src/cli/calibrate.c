// `weft calibrate [--config FILE.yaml] [--out FILE.yaml] [--repeats N] [--stats FILE.json]
// [key=value ...]`, under mpirun as training will run.
#include <stdlib.h>

#include "cli/cli.h"
#include "core/core.h"
#include "train/calibrate.h"

int weft_cmd_calibrate(int argc, char **argv, weft_session *session) {
    weft_calibrate_request r = {.repeats = 5};
    const char *repeats = NULL;
    const weft_cli_option opts[] = {{"--out", &r.out, NULL}, {"--repeats", &repeats, NULL},
                                    {NULL, NULL, NULL}};
    weft_cli_args a = weft_cli_parse("calibrate", argc, argv, opts, session);
    if (repeats) {
        char *end;
        long n = strtol(repeats, &end, 10);
        WEFT_CHECK(*end == '\0' && n >= 1 && n <= 1000,
                   "calibrate: --repeats %s is not a count from 1 to 1000", repeats);
        r.repeats = (int)n;
    }
    r.stats = a.stats;
    r.cfg = weft_job_config_default();
    weft_job_config_resolve(&r.cfg, a.config, a.n_settings, a.settings);
    r.cfg = weft_calibrate_settings(r.cfg);
    return weft_calibrate_run(&r, session);
}
