// rl: advantages of a step's samples, per group of the n samples of one prompt (DESIGN.md
// section 12): GRPO (reward minus the group mean, optionally over the group's std: Dr. GRPO
// leaves it out) and RLOO (reward minus the mean of the other samples).
#pragma once
#include "rl/config.h"

// rewards and advantages (n_groups * n), group g's samples at g * n ... g * n + n - 1.
void weft_advantages(const weft_rl_config *cfg, const double *rewards, int n_groups, int n,
                     double *advantages);
