// core: fault injection for the tests that prove a failure ends a job cleanly (a dead or diverged
// rank, a kill in the middle of work). A test names the event to fail at in the environment:
//   WEFT_TEST_KILL_AT_<SITE>=RANK:INDEX   the process kills itself (SIGKILL) at that event;
//   WEFT_TEST_SKIP_<SITE>=RANK:INDEX      the caller skips that event;
// e.g. WEFT_TEST_KILL_AT_COLLECTIVE=1:11 kills rank 1 at its collective number 11 (0-based) on the
// world group; INDEX * names every event of the site. The code under test asks at each event of a site and knows nothing else of tests.
#pragma once
#include "core/core.h"

// Called at event `index` of `site` ("COLLECTIVE", ...) on `rank`: dies there if a test asked
// for a kill; returns true if a test asked for the event to be skipped.
bool weft_fault_skip(const char *site, int rank, long index);
