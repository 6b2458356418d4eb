"""KL to the reference in the reward (rl.use_kl_in_reward, verl's apply_kl_penalty): each sample's
reward less the coefficient times the sum over its response of kl(old log-prob, reference
log-prob), before the group advantages; the coefficient fixed, or adapted after every step from
the responses' mean per-token KL (rl.kl_ctrl=adaptive: coef x (1 + e N / rl.kl_horizon), e =
KL / rl.kl_target - 1 clipped to [-0.2, 0.2], N the step's samples).

A tiny random byte-level model, 4 prompts x 4 samples a step, a reward command whose rewards
vary within a group, a learning rate high enough that the policy leaves the reference at once.
From each step's saved rollouts (tokens, old and reference log-probs, rewards, advantages) this
test recomputes in float64, independently of weft's code:

- each response's KL sum (k3 with the adaptive controller, k1 with the fixed one) against the
  saved `kl_penalty`, and the step's mean per-token KL against metrics' `reward_kl_penalty`;
- the GRPO advantages of the shaped rewards against the saved ones (and they must differ from
  the unshaped rewards' somewhere from step 2 on, or the test could not tell shaping from none);
- the coefficient: step 1 is rl.kl_coef, each next one the controller's update of the last;
  step 1's KL is exactly 0 (the policy is the reference, scored by the same ops).

Resuming a 2-step run to step 3 gives step 3's metrics of the straight run (the adaptive
coefficient travels in the checkpoint); bad settings are one clear error before any work.
"""
import os
import subprocess
import sys

import numpy as np

from reference import fixtures
from reference.rl_loop import (command, environment, f32, learning_setup, metrics, rl_args,
                               rollouts, run_rl, without_timings)

P, N = 4, 4  # prompts per step, samples per prompt
COMMON = ["optim.lr=1e-2", "optim.min_lr=1e-2", "rl.use_kl_in_reward=true",
          "rl.save_rollouts=true"]
ADAPTIVE = dict(coef=0.5, target=0.01, horizon=8.0, penalty="k3")
FIXED = dict(coef=0.25, penalty="k1")


def kl(kind, old, ref):
    d = old - ref
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    return np.minimum(np.exp(-d) + d - 1.0, 10.0)


def grpo(rewards):
    """GRPO advantages per group of N: (r - mean) / (unbiased std + 1e-6)."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, N)
    mean, std = r.mean(axis=1, keepdims=True), r.std(axis=1, ddof=1, keepdims=True)
    return ((r - mean) / (std + 1e-6)).reshape(-1)


def close(a, b, rel=1e-7, abs_=1e-8):
    return abs(a - b) <= abs_ + rel * abs(b)


def check_step(label, out, step, m, setting, failures):
    """Step `step`'s saved samples against the shaping and advantages recomputed here; returns
    the step's mean per-token KL as recomputed."""
    rows = rollouts(out, step)
    sums, per_token = [], []
    for r in rows:
        if "ref_logprobs" not in r or "kl_penalty" not in r:
            failures.append(f"{label} step {step}: a saved sample lacks ref_logprobs/kl_penalty")
            return 0.0
        old = f32(r["old_logprobs"]).astype(np.float64)
        ref = f32(r["ref_logprobs"]).astype(np.float64)
        s = float(np.sum(kl(setting["penalty"], old, ref)))
        sums.append(s)
        per_token.append(s / len(old))
        if not close(r["kl_penalty"], s):
            failures.append(f"{label} step {step}: saved kl_penalty {r['kl_penalty']} against "
                            f"{s} recomputed")
    mean_kl = float(np.mean(per_token))
    coef = m["reward_kl_penalty_coeff"]
    if not close(m["reward_kl_penalty"], mean_kl, rel=1e-9, abs_=1e-12):
        failures.append(f"{label} step {step}: reward_kl_penalty {m['reward_kl_penalty']} against "
                        f"{mean_kl} recomputed")
    raw = [r["reward"] for r in rows]
    want = grpo([x - coef * s for x, s in zip(raw, sums)])
    unshaped = grpo(raw)
    got = np.array([r["advantage"] for r in rows])
    worst = float(np.max(np.abs(got - want)))
    moved = float(np.max(np.abs(unshaped - want)))
    print(f"  {label} step {step}: coef {coef:.6g}, mean per-token KL {mean_kl:.6g}, advantages "
          f"within {worst:.2e} of the recomputed ones (the unshaped ones differ by {moved:.3g})")
    if worst > 1e-7:  # saved with 9 significant digits
        failures.append(f"{label} step {step}: advantages differ from the shaped GRPO ones by "
                        f"{worst:.3g}")
    if step == 1 and m["reward_kl_penalty"] != 0.0:
        failures.append(f"{label} step 1: KL {m['reward_kl_penalty']} between the policy and "
                        "itself (the reference), not 0")
    if step > 1 and moved < 1e-3:
        failures.append(f"{label} step {step}: the KL penalty moved no advantage by 1e-3 "
                        f"({moved:.3g}): the test cannot tell shaping from none")
    return mean_kl


def check_run(label, out, steps, setting, adaptive, failures):
    ms = metrics(out)
    if sorted(ms) != list(range(1, steps + 1)):
        failures.append(f"{label}: metrics of steps {sorted(ms)}")
        return
    want_coef = setting["coef"]
    for step in range(1, steps + 1):
        m = ms[step]
        if "reward_kl_penalty_coeff" not in m:
            failures.append(f"{label} step {step}: no reward_kl_penalty_coeff in metrics.jsonl")
            return
        if not close(m["reward_kl_penalty_coeff"], want_coef, rel=1e-12, abs_=0.0):
            failures.append(f"{label} step {step}: coefficient {m['reward_kl_penalty_coeff']!r}, "
                            f"the controller gives {want_coef!r}")
        mean_kl = check_step(label, out, step, m, setting, failures)
        if adaptive:
            e = min(max(mean_kl / setting["target"] - 1.0, -0.2), 0.2)
            want_coef *= 1.0 + e * (P * N) / setting["horizon"]


def bad_settings(weft, mdir, prompts, tmp, reward, failures):
    cases = [(["rl.kl_ctrl=adaptive", "rl.kl_target=0"], "rl.kl_target"),
             (["rl.kl_ctrl=adaptive", "rl.kl_horizon=3"], "rl.kl_horizon"),
             (["rl.kl_coef=-1"], "rl.kl_coef")]
    for k, (extra, name) in enumerate(cases):
        out = os.path.join(tmp, f"bad{k}")
        args = rl_args(mdir, prompts, out, *reward, *COMMON, *extra)
        r = subprocess.run(command(weft, args), capture_output=True, text=True,
                           env=environment(1), timeout=120)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        ok = r.returncode != 0 and len(lines) == 1 and name in lines[0] and not os.path.exists(out)
        print(f"  {' '.join(extra)}: exit {r.returncode}: {lines[-1] if lines else '(nothing)'}")
        if not ok:
            failures.append(f"{' '.join(extra)}: want one error naming {name}, a non-zero exit "
                            f"and no {out}; got exit {r.returncode}, stderr {r.stderr!r}")


def cases(weft, tmp):
    failures = []
    mdir, prompts, reward = learning_setup(tmp)
    a = ADAPTIVE
    adaptive = [*reward, *COMMON, f"train.global_batch_size={P}", f"sampling.n={N}",
                "rl.kl_ctrl=adaptive", f"rl.kl_coef={a['coef']}", f"rl.kl_target={a['target']}",
                f"rl.kl_horizon={a['horizon']}", f"rl.kl_penalty={a['penalty']}",
                "train.save_every=2"]
    straight, split = os.path.join(tmp, "straight"), os.path.join(tmp, "split")
    run_rl(weft, rl_args(mdir, prompts, straight, *adaptive, "train.steps=3"))
    check_run("adaptive k3", straight, 3, a, True, failures)

    run_rl(weft, rl_args(mdir, prompts, split, *adaptive, "train.steps=2"))
    run_rl(weft, rl_args(mdir, prompts, split, *adaptive, "train.steps=3", f"resume={split}"))
    want, got = without_timings(metrics(straight)[3]), without_timings(metrics(split).get(3, {}))
    print(f"  resumed at step 2: step 3's coefficient {got.get('reward_kl_penalty_coeff')!r}, "
          f"the straight run's {want.get('reward_kl_penalty_coeff')!r}")
    if want != got:
        keys = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        failures.append(f"resumed at step 2: step 3's metrics differ from the straight run's in "
                        f"{keys}")

    f = FIXED
    fixed = os.path.join(tmp, "fixed")
    run_rl(weft, rl_args(mdir, prompts, fixed, *reward, *COMMON, f"train.global_batch_size={P}",
                         f"sampling.n={N}", f"rl.kl_coef={f['coef']}",
                         f"rl.kl_penalty={f['penalty']}", "train.steps=2"))
    check_run("fixed k1", fixed, 2, f, False, failures)

    bad_settings(weft, mdir, prompts, tmp, reward, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_kl_in_reward_", "KL-in-reward checks failed"))
