// train: `weft calibrate`, fitting the planner's cost model to this machine's timings of the
// job's model on the job's ranks.
#pragma once
#include "train/config.h"
#include "train/session.h"

typedef struct weft_calibrate_request {
    const char *out;   // YAML of the five parallel.cost_* settings (NULL: none)
    const char *stats; // JSON of the timings and the fit (NULL: none)
    int repeats;       // timings per probe; the median counts
    weft_job_config cfg;
} weft_calibrate_request;

// The job's settings as calibration runs them: groups of every power-of-two degree.
weft_job_config weft_calibrate_settings(weft_job_config cfg);
int weft_calibrate_run(const weft_calibrate_request *r, weft_session *session);
