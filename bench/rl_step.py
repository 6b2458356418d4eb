#!/usr/bin/env python3
"""Seconds per `weft rl` step and where they go, on the CPU, at 1 and 2 ranks.

The default RL job (GRPO, 16 prompts x 8 samples per step, from the default SFT job's final
checkpoint, which `weft rl` trains first when it is missing) runs STEPS steps with the held-out
evaluation off, once on 1 rank with 2 OpenMP threads and once on 2 ranks with 1 thread each (the
same cores). Read from metrics.jsonl, averaged over the steps after the first: a step's seconds
and its phases (rollout: generation and rewards; old log-probs: the trainer's recomputation;
updates: the policy's optimizer steps), the rollout's tokens/s and the share of the step spent
generating, the number to shrink. The peer is the 1-rank run: the 2-rank line prints its speed
ratio to it. Writes the table as JSON with --json.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from reference.mpi import mpirun  # noqa: E402

PHASES = ["rollout_seconds", "old_logprob_seconds", "update_seconds"]


def run(weft, ranks, threads, steps, out):
    args = [weft, "rl", f"train.steps={steps}", "rl.eval_every=0", f"train.output_dir={out}"]
    cmd = mpirun(ranks, *args, threads=threads) if ranks > 1 else args
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="passive")
    subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f][1:]  # the first step warms up
    mean = lambda k: sum(r[k] for r in rows) / len(rows)
    res = {k: mean(k) for k in PHASES + ["step_seconds", "rollout_tokens"]}
    res["rollout_tokens_per_s"] = res["rollout_tokens"] / res["rollout_seconds"]
    res["generation_share"] = res["rollout_seconds"] / res["step_seconds"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json")
    a = ap.parse_args()
    table = {}
    with tempfile.TemporaryDirectory(prefix="weft_bench_rl_") as tmp:
        for ranks, threads in [(1, 2), (2, 1)]:
            table[ranks] = run(a.weft, ranks, threads, a.steps, os.path.join(tmp, f"r{ranks}"))
    print(f"weft rl, default job, {a.steps - 1} steps averaged (CPU, 2 cores)")
    print(f"{'ranks':>5} {'step s':>8} {'rollout':>8} {'old logp':>8} {'updates':>8} "
          f"{'gen tok/s':>9} {'gen share':>9} {'vs 1 rank':>9}")
    for ranks, r in table.items():
        ratio = table[1]["step_seconds"] / r["step_seconds"]
        print(f"{ranks:>5} {r['step_seconds']:8.3f} {r['rollout_seconds']:8.3f} "
              f"{r['old_logprob_seconds']:8.3f} {r['update_seconds']:8.3f} "
              f"{r['rollout_tokens_per_s']:9.0f} {r['generation_share']:9.1%} {ratio:8.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=2)


if __name__ == "__main__":
    main()
