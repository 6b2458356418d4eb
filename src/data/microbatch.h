// Micro-batch planning.
#pragma once
#include "core/core.h"

// Cuts documents 0..n-1, in order, into `parts` non-empty contiguous runs of about equal token
// counts; starts (parts + 1) receives the run boundaries. parts > n is a fatal error.
void weft_split_contiguous(const int *lengths, int n, int parts, int *starts);
