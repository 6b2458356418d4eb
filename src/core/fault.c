#include "core/fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

// Whether the environment variable <prefix><site> names this rank's event `index` ("RANK:INDEX",
// or "RANK:*" for every event of the site).
static bool asked(const char *prefix, const char *site, int rank, long index) {
    char name[96], star;
    snprintf(name, sizeof name, "%s%s", prefix, site);
    const char *v = getenv(name);
    int r;
    long at;
    if (v && sscanf(v, "%d:%c", &r, &star) == 2 && star == '*') return r == rank;
    return v && sscanf(v, "%d:%ld", &r, &at) == 2 && r == rank && at == index;
}

bool weft_fault_skip(const char *site, int rank, long index) {
    if (asked("WEFT_TEST_KILL_AT_", site, rank, index)) raise(SIGKILL);
    return asked("WEFT_TEST_SKIP_", site, rank, index);
}
