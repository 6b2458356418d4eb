#include <string.h>

#include "cli/cli.h"
#include "core/core.h"

static const weft_cli_option *find(const weft_cli_option *opts, const char *name) {
    for (int i = 0; opts && opts[i].name; i++)
        if (!strcmp(opts[i].name, name)) return &opts[i];
    return NULL;
}

weft_cli_args weft_cli_parse(const char *verb, int argc, char **argv, const weft_cli_option *opts,
                             const weft_session *session) {
    bool writer = !session || weft_session_writer(session);
    weft_cli_args a = {.settings = argv};
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        const weft_cli_option *o = find(opts, arg);
        const char **slot = !strcmp(arg, "--config") ? &a.config
                          : !strcmp(arg, "--stats")  ? &a.stats
                          : o && o->value            ? o->value
                                                     : NULL;
        if (slot) {
            WEFT_CHECK(i + 1 < argc, "%s: %s needs a value", verb, arg);
            *slot = argv[++i];
            if (writer && (!strcmp(arg, "--out") || !strcmp(arg, "--stats")))
                weft_prepare_output(*slot, !strcmp(arg, "--stats") ? "the statistics" : "the output");
        } else if (o) {
            *o->flag = true;
        } else if (arg[0] == '-') {
            weft_fatal("%s: unknown option \"%s\"; see weft --help", verb, arg);
        } else {
            a.settings[a.n_settings++] = argv[i];
        }
    }
    return a;
}
