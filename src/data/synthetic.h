// The built-in synthetic task: multi-term addition with worked steps. Lengths follow a long tail
// (most problems have 2-4 terms, a few dozens), so packing and variable-length attention get real
// work, and the prompt is masked from the loss as in supervised fine-tuning.
#pragma once
#include "core/core.h"

// Writes one problem: prompt "17+305+9=" and response "17+305=322 322+9=331 so 331\n".
void weft_synthetic_addition(weft_rng *rng, char *prompt, size_t prompt_cap, char *response,
                             size_t response_cap);
// The same with n terms (clamped to [2, 48]), each below `below` (0: as above); returns the sum
// (the answer).
long weft_synthetic_addition_of(weft_rng *rng, int n, long below, char *prompt, size_t prompt_cap,
                                char *response, size_t response_cap);
