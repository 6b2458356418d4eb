"""weft rl's samples do not depend on the layout (DESIGN.md sections 11 and 12): with the same
seed, step 1's rollouts (every sample's tokens and rollout log-probs), rewards and advantages are
identical, in every bit, on 1 rank; 2 ranks (dp 2); 4 ranks (dp 4 with the distributed
optimizer); 2 ranks as cp 2; and 4 ranks with dynamic context parallelism (max_seqlen_per_rank
16, so the longer documents, prompt + response up to 48 tokens, are split over 2 to 4 ranks).
Sampling is a function of (seed, prompt, sample, position) alone and every rank generates with the
same weights, whichever rank a prompt is spread to.

Step 2 samples with the weights step 1's update made, which the layouts compute with different
summation orders (equal to float32 round-off): its tokens, rewards and advantages are still
identical and its log-probs agree to LOGPROB_TOL, which checks that every layout made the same
update. The old log-probs the trainer recomputes in each layout agree with the one-rank run's to
LOGPROB_TOL in both steps; each layout's rollout/trainer mismatch (0 where its scoring pass has
the rollout's reduction order) is printed.

The model is a random byte-level Qwen2 (vocab 257); 4 prompts of 3 to 40 bytes per step x 4
samples of up to 8 tokens, from a file of 8 prompts; the reward command's reward is a fixed
function of the response's bytes, so rewards and advantages vary within groups.
"""
import os
import sys

import numpy as np

from reference import fixtures
from reference.rl_loop import f32, learning_setup, metrics, rl_args, rollouts, run_rl

LENGTHS = [40, 3, 17, 25, 9, 33, 6, 38]
SETTINGS = ["train.steps=2", "train.global_batch_size=4", "sampling.n=4", "sampling.max_tokens=8",
            "rl.save_rollouts=true", "optim.lr=1e-3", "rl.ppo_mini_batch_size=2"]
LAYOUTS = [
    ("1 rank", 1, []),
    ("dp 2", 2, []),
    ("dp 4, distributed optimizer", 4, ["parallel.use_distributed_optimizer=true"]),
    ("cp 2", 2, ["parallel.context_parallel_size=2"]),
    ("dcp on 4 ranks", 4, ["parallel.dynamic_context_parallel=true",
                           "parallel.max_seqlen_per_rank=16"]),
]
LOGPROB_TOL = 1e-5
EXACT = ("prompt", "sample", "tokens", "reward", "advantage", "truncated")


def compare_step(label, step, ref, got, failures):
    """Samples of `got` against the one-rank run's `ref`: EXACT fields equal; logprobs in every
    bit at step 1, to LOGPROB_TOL after; old_logprobs to LOGPROB_TOL. Returns the largest log-prob
    and old log-prob differences."""
    if len(got) != len(ref):
        failures.append(f"{label} step {step}: {len(got)} samples, the one-rank run {len(ref)}")
        return None
    worst_lp = worst_old = 0.0
    for i, (a, b) in enumerate(zip(ref, got)):
        for key in EXACT:
            if a.get(key) != b.get(key):
                failures.append(f"{label} step {step} sample {i}: {key} {b.get(key)!r}, the "
                                f"one-rank run's {a.get(key)!r}")
                return None
        for key, strict in (("logprobs", step == 1), ("old_logprobs", False)):
            x, y = f32(a[key]), f32(b[key])
            if strict and not np.array_equal(x.view(np.uint32), y.view(np.uint32)):
                failures.append(f"{label} step {step} sample {i}: rollout log-probs differ from "
                                f"the one-rank run's (max {np.max(np.abs(x - y)):.3g})")
                return None
            d = float(np.max(np.abs(x.astype(np.float64) - y))) if len(x) else 0.0
            if key == "logprobs":
                worst_lp = max(worst_lp, d)
            else:
                worst_old = max(worst_old, d)
    for key, d in (("logprobs", worst_lp), ("old_logprobs", worst_old)):
        if d > LOGPROB_TOL:
            failures.append(f"{label} step {step}: {key} differ from the one-rank run's by "
                            f"{d:.3g} > {LOGPROB_TOL}")
    return worst_lp, worst_old


def cases(weft, tmp):
    failures = []
    mdir, prompts, reward = learning_setup(tmp, LENGTHS, seed=11)
    ref = None
    for label, ranks, extra in LAYOUTS:
        out = os.path.join(tmp, label.replace(" ", "_").replace(",", ""))
        try:
            run_rl(weft, rl_args(mdir, prompts, out, *SETTINGS, *reward, *extra), ranks=ranks)
        except RuntimeError as e:
            print(e)
            failures.append(f"{label}: weft rl failed")
            continue
        steps = {s: rollouts(out, s) for s in (1, 2)}
        m = metrics(out)
        mismatch = [m[s]["mismatch_max"] for s in (1, 2)]
        if ref is None:
            ref = steps
            rewards = {r["reward"] for r in steps[1]}
            advantages = {r["advantage"] for r in steps[1]}
            split = sum(len(r["tokens"]) + LENGTHS[int(r["prompt"].rsplit(":", 1)[1]) - 1] > 16
                        for r in steps[1])
            print(f"{label}: step 1 {len(steps[1])} samples, {len(rewards)} distinct rewards, "
                  f"{len(advantages)} distinct advantages, {split} documents over 16 tokens; "
                  f"rollout/trainer mismatch max {mismatch}")
            if len(rewards) < 2 or len(advantages) < 3:
                failures.append(f"{label}: rewards and advantages do not vary: {rewards}")
            if split == 0:
                failures.append("no document is long enough for DCP to split")
            continue
        diffs = [compare_step(label, s, ref[s], steps[s], failures) for s in (1, 2)]
        if all(diffs):
            print(f"{label}: step 1 identical; step 2 tokens, rewards and advantages identical, "
                  f"log-probs within {diffs[1][0]:.3g}; old log-probs within "
                  f"{max(d[1] for d in diffs):.3g}; rollout/trainer mismatch max {mismatch}")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_layouts_", "checks failed"))
