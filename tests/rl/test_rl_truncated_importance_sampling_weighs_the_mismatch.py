"""Truncated importance sampling in weft rl (rl.tis_imp_ratio_cap = C, verl's
tis_imp_ratio_cap): each token's policy-gradient term is weighted by min(exp(old - rollout), C),
old the trainer's log-prob of the sampled token and rollout the one the rollout engine recorded.
The objective itself is checked against the PyTorch reference in test_rl_loss_matches_pytorch;
this test checks that the loop feeds it the rollout's log-probs:

- on the CPU the rollout's log-probs are the trainer's bit for bit, so every weight is exactly 1:
  2 steps with C = 2 give metrics (tis_weight 1, tis_capped 0) and a final checkpoint identical
  to the run without it;
- on device=cuda (the GPU, else weft_emulated) they differ within bf16 round-off: with C = 1.01,
  each step's tis_weight and tis_capped equal the token means recomputed here from the saved
  rollouts (`logprobs` as recorded, `old_logprobs` as the trainer scored them), some tokens
  capped and some not, and the run differs from the one without.
"""
import hashlib
import os
import sys

import numpy as np

from reference import fixtures
from reference.rl_loop import (f32, metrics, on_cpu_and_cuda, rl_args, rollouts, run_rl,
                               without_timings)

SETTINGS = ["train.steps=2", "train.save_every=2", "rl.save_rollouts=true"]


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def final_model(out):
    return os.path.join(out, "checkpoints", "step_00000002", "model.safetensors")


def cpu_case(weft, mdir, prompts, reward, tmp, failures):
    outs = []
    for extra in ([], ["rl.tis_imp_ratio_cap=2"]):
        out = os.path.join(tmp, f"cpu{len(extra)}")
        run_rl(weft, rl_args(mdir, prompts, out, *reward, *SETTINGS, *extra))
        outs.append(out)
    plain, tis = (metrics(o) for o in outs)
    for s in (1, 2):
        w, capped = tis[s].get("tis_weight"), tis[s].get("tis_capped")
        print(f"  cpu step {s}: tis_weight {w!r}, tis_capped {capped!r}")
        if w != 1.0 or capped != 0.0:
            failures.append(f"cpu step {s}: tis_weight {w!r}, tis_capped {capped!r}; the "
                            "rollout's log-probs are the trainer's, so every weight is 1")
        if without_timings(plain[s]) != without_timings(tis[s]):
            failures.append(f"cpu step {s}: metrics differ with rl.tis_imp_ratio_cap=2")
    if digest(final_model(outs[0])) != digest(final_model(outs[1])):
        failures.append("cpu: the final model differs with rl.tis_imp_ratio_cap=2")


def cuda_case(program, emulated, mdir, prompts, reward, tmp, failures):
    cap = 1.01
    outs = []
    for extra in ([], [f"rl.tis_imp_ratio_cap={cap}"]):
        out = os.path.join(tmp, f"cuda{len(extra)}")
        run_rl(program, rl_args(mdir, prompts, out, *reward, *SETTINGS, "device=cuda", *extra),
               timeout=600)
        outs.append(out)
    m = metrics(outs[1])
    where = "emulated cuda" if emulated else "cuda"
    for s in (1, 2):
        weights = []
        for r in rollouts(outs[1], s):
            old, roll = f32(r["old_logprobs"]), f32(r["logprobs"])
            weights.append(np.exp(old.astype(np.float64) - roll.astype(np.float64)))
        w = np.concatenate(weights)
        want_w, want_c = float(np.mean(np.minimum(w, cap))), float(np.mean(w >= cap))
        got_w, got_c = m[s].get("tis_weight"), m[s].get("tis_capped")
        print(f"  {where} step {s}: |old - rollout| max {np.max(np.abs(np.log(w))):.3g}; "
              f"tis_weight {got_w!r} (recomputed {want_w:.9g}), tis_capped {got_c!r} "
              f"(recomputed {want_c:.6g})")
        if got_w is None or abs(got_w - want_w) > 1e-8 or got_c is None or \
                abs(got_c - want_c) > 1e-6:
            failures.append(f"{where} step {s}: tis_weight {got_w!r} / tis_capped {got_c!r}, "
                            f"recomputed {want_w!r} / {want_c!r}")
        if not 0 < want_c < 1:
            failures.append(f"{where} step {s}: a fraction {want_c} of the weights capped at "
                            f"{cap}: the case does not tell capped from uncapped")
    if digest(final_model(outs[0])) == digest(final_model(outs[1])):
        failures.append(f"{where}: the final model is the same with the weights as without")


def cases(weft, tmp):
    failures = []
    on_cpu_and_cuda(weft, tmp, cpu_case, cuda_case, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_tis_", "truncated importance sampling checks "
                               "failed"))
