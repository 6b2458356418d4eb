"""rl.recompute_old_logprobs=false: the rollout's recorded log-probs serve as the old log-probs,
and the trainer's scoring pass over the samples is skipped (the rollout/trainer mismatch is then
not measured, so metrics.jsonl leaves its fields out and the step line prints "mismatch -").

- CPU, 3 steps of 2 updates each (the second update's ratio reads the old log-probs), evaluation
  and a checkpoint at step 3: on the CPU the rollout's log-probs are the trainer's bit for bit, so
  the run is the default run: metrics equal in every field but timings and the mismatch fields
  (absent), the step-3 model and optimizer byte for byte the same;
- device=cuda (the GPU, else weft_emulated), 2 steps with saved rollouts: every saved
  old_logprobs equals the recorded logprobs exactly, where the default run's differ (its
  recomputed ones are the trainer's, within bf16 round-off of the rollout's);
- with rl.tis_imp_ratio_cap, which compares the two, it is one clear error before any work.
"""
import hashlib
import os
import subprocess
import sys

from reference import fixtures
from reference.rl_loop import (command, environment, metrics, on_cpu_and_cuda, rl_args,
                               rollouts, run_rl, without_timings)

MISMATCH = ("mismatch_max", "mismatch_mean", "mismatch_k3")
CPU = ["train.steps=3", "rl.ppo_mini_batch_size=2", "rl.eval_every=3", "rl.eval_prompts=2",
       "train.save_every=3"]
CUDA = ["train.steps=2", "rl.save_rollouts=true", "device=cuda"]


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def cpu_case(weft, mdir, prompts, reward, tmp, failures):
    runs = {}
    for flag in ("true", "false"):
        out = os.path.join(tmp, f"cpu_{flag}")
        r = run_rl(weft, rl_args(mdir, prompts, out, *reward, *CPU,
                                 f"rl.recompute_old_logprobs={flag}"))
        runs[flag] = (out, metrics(out), r.stdout)
    (a_out, a, _), (b_out, b, b_stdout) = runs["true"], runs["false"]
    for s in sorted(a):
        kept = {k: v for k, v in without_timings(a[s]).items() if k not in MISMATCH}
        if kept != without_timings(b.get(s, {})):
            keys = sorted(k for k in kept if kept[k] != b.get(s, {}).get(k))
            failures.append(f"cpu step {s}: metrics differ without the recomputation in {keys}")
        if any(k in b.get(s, {}) for k in MISMATCH):
            failures.append(f"cpu step {s}: mismatch fields reported though none was measured")
    print(f"  cpu: {len(a)} steps, metrics equal but for timings and the mismatch fields "
          f"(default run: mismatch_max {[a[s]['mismatch_max'] for s in sorted(a)]})")
    if "mismatch -" not in b_stdout:
        failures.append("cpu: the step line does not say the mismatch was not measured")
    for name in ("model.safetensors", "optimizer.safetensors"):
        paths = [os.path.join(d, "checkpoints", "step_00000003", name) for d in (a_out, b_out)]
        if not all(os.path.exists(p) for p in paths) or digest(paths[0]) != digest(paths[1]):
            failures.append(f"cpu: the step-3 {name} differs without the recomputation")


def cuda_case(program, emulated, mdir, prompts, reward, tmp, failures):
    where = "emulated cuda" if emulated else "cuda"
    differ = {}
    for flag in ("true", "false"):
        out = os.path.join(tmp, f"cuda_{flag}")
        run_rl(program, rl_args(mdir, prompts, out, *reward, *CUDA,
                                f"rl.recompute_old_logprobs={flag}"), timeout=600)
        rows = [r for s in (1, 2) for r in rollouts(out, s)]
        differ[flag] = sum(o != p for r in rows for o, p in zip(r["old_logprobs"], r["logprobs"]))
        total = sum(len(r["logprobs"]) for r in rows)
        print(f"  {where}, recompute {flag}: {differ[flag]} of {total} old log-probs differ from "
              "the rollout's")
    if differ["false"] != 0:
        failures.append(f"{where}: {differ['false']} old log-probs are not the rollout's")
    if differ["true"] == 0:
        failures.append(f"{where}: the recomputed old log-probs equal the rollout's everywhere: "
                        "the case cannot tell the two apart")


def bad_combination(weft, mdir, prompts, reward, tmp, failures):
    out = os.path.join(tmp, "bad")
    args = rl_args(mdir, prompts, out, *reward, "rl.recompute_old_logprobs=false",
                   "rl.tis_imp_ratio_cap=2")
    r = subprocess.run(command(weft, args), capture_output=True, text=True, env=environment(1),
                       timeout=120)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    print(f"  with rl.tis_imp_ratio_cap: exit {r.returncode}: {lines[-1] if lines else ''}")
    if r.returncode == 0 or len(lines) != 1 or "rl.recompute_old_logprobs" not in lines[0] or \
            os.path.exists(out):
        failures.append(f"with rl.tis_imp_ratio_cap: exit {r.returncode}, stderr {r.stderr!r}, "
                        f"{out} {'exists' if os.path.exists(out) else 'absent'}")


def cases(weft, tmp):
    failures = []
    setup = on_cpu_and_cuda(weft, tmp, cpu_case, cuda_case, failures)
    bad_combination(weft, *setup, tmp, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_no_recompute_",
                               "rollout-as-old log-prob checks failed"))
