// data: document length traces, one length per line (blank lines and # comments allowed), for
// simulating the planner on a dataset's shape without its tokens.
#pragma once
#include "core/core.h"

// The lengths of the trace at path (weft_alloc'd, *n of them); a line that is not a positive
// integer, or a trace with none, ends in weft_fatal naming the file and line.
int *weft_read_length_trace(const char *path, int *n);
