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

With --reward-ms MS the rewards come from a reward command that takes MS milliseconds per
response (a slow verifier: the default job's exact_match, then a sleep) on 1 or 8 threads that
score the requests as they arrive, or as 8 one-thread processes (reward.processes=8), and each
layout runs with reward.overlap on (each response sent as its sample finishes, while the others
generate) and off (all after the rollout). The
peer is 1 thread after the rollout: what every command got before requests were pipelined (one
answered at a time) and sent while generating. The table gives step seconds, the wait for
rewards after generation (reward_seconds) and the speed over the peer.

With --layouts the same 2 ranks run the disaggregated layout (rl.rollout_ranks=1: one rank
trains, one generates), synchronous and one step off policy (generation of the next step
overlapping the update), against the hybrid engine on both ranks as the peer. The table adds the
trainer's wait for samples (sample_wait_seconds) and the rollout's own seconds. With
--reward-ms too, that table replaces the reward table: every layout's rewards come from the
slow command, 2 one-worker processes in all (overlapped).
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

# The default job's reward (reward.pattern's group 1 equal to the answer), after `ms` ms, on
# `workers` threads that score requests as they arrive (read ahead), answering in request order.
SLOW_REWARD = r'''
import json, queue, re, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
ms, workers = float(sys.argv[1]), int(sys.argv[2])
def score(line):
    req = json.loads(line)
    time.sleep(ms / 1000)
    m = re.search(r"so (-?[0-9]+)\s*$", req["response"])
    return json.dumps({"reward": float(bool(m) and m.group(1) == req["answer"])})
answers = queue.Queue()
def write():
    for future in iter(answers.get, None):
        print(future.result(), flush=True)
writer = threading.Thread(target=write)
writer.start()
with ThreadPoolExecutor(workers) as pool:
    for line in sys.stdin:
        answers.put(pool.submit(score, line))
answers.put(None)
writer.join()
'''

# (label, the command's worker threads, reward.processes, reward.overlap): the first is the peer,
# what any command got before requests were pipelined and sent while generating (one request
# answered at a time, after the rollout).
REWARD_RUNS = [("1 worker, after rollout", 1, 1, "false"), ("1 worker, overlapped", 1, 1, "true"),
               ("8 workers, after rollout", 8, 1, "false"), ("8 workers, overlapped", 8, 1, "true"),
               ("8 processes of 1 worker, overlapped", 1, 8, "true")]


def run(weft, ranks, threads, steps, out, settings=()):
    args = [weft, "rl", f"train.steps={steps}", "rl.eval_every=0", f"train.output_dir={out}",
            *settings]
    cmd = mpirun(ranks, *args, threads=threads) if ranks > 1 else args
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="passive")
    subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f][1:]  # the first step warms up
    mean = lambda k: sum(r[k] for r in rows) / len(rows)
    res = {k: mean(k) for k in PHASES + ["step_seconds", "rollout_tokens", "reward_seconds",
                                         "sample_wait_seconds"]}
    res["rollout_tokens_per_s"] = res["rollout_tokens"] / res["rollout_seconds"]
    res["generation_share"] = res["rollout_seconds"] / res["step_seconds"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reward-ms", type=float, default=0,
                    help="a reward command taking this long per response: overlap on and off")
    ap.add_argument("--layouts", action="store_true",
                    help="also the disaggregated layout, synchronous and one step off policy")
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
    if a.reward_ms > 0 and not a.layouts:
        table["overlap"] = overlap_table(a)
    if a.layouts:
        table["layouts"] = layout_table(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=2)


def overlap_table(a):
    """The slow reward command at 1 and 8 workers, overlap on and off, on 1 and 2 ranks."""
    rows = {}
    with tempfile.TemporaryDirectory(prefix="weft_bench_rl_reward_") as tmp:
        for ranks, threads in [(1, 2), (2, 1)]:
            for label, workers, processes, overlap in REWARD_RUNS:
                out = os.path.join(tmp, f"r{ranks}_{workers}_{processes}_{overlap}")
                rows[f"{ranks} ranks, {label}"] = run(
                    a.weft, ranks, threads, a.steps, out,
                    slow_reward(tmp, a.reward_ms, workers, processes, overlap))
    print(f"\nreward command taking {a.reward_ms:g} ms a response; the peer: 1 worker after the "
          "rollout, the same ranks")
    print(f"{'run':>46} {'step s':>8} {'reward wait s':>13} {'vs peer':>8}")
    for name, r in rows.items():
        peer = rows[name.split(",")[0] + ", " + REWARD_RUNS[0][0]]
        print(f"{name:>46} {r['step_seconds']:8.3f} {r['reward_seconds']:13.3f} "
              f"{peer['step_seconds'] / r['step_seconds']:7.2f}x")
    return rows


# (label, settings, reward processes per generating rank) on 2 ranks of 1 thread; the first is
# the peer. A slow reward command gets as many processes in all in every layout: 1 on each of
# the hybrid engine's 2 ranks, 2 on the one rank that generates.
LAYOUTS = [("hybrid: both ranks train and generate", [], 1),
           ("1 trains, 1 generates", ["rl.rollout_ranks=1"], 2),
           ("1 trains, 1 generates, one step off policy",
            ["rl.rollout_ranks=1", "rl.one_step_off_policy=true"], 2)]


def slow_reward(tmp, ms, workers, processes, overlap="true"):
    """Settings for SLOW_REWARD (written into tmp): ms per response on `workers` threads."""
    script = os.path.join(tmp, "reward.py")
    with open(script, "w") as f:
        f.write(SLOW_REWARD)
    return ["reward.type=command", f"reward.command={sys.executable} {script} {ms:g} {workers}",
            f"reward.processes={processes}", f"reward.overlap={overlap}"]


def layout_table(a):
    """The default job on 2 ranks in the hybrid and the disaggregated layouts (with --reward-ms,
    its slow reward command, one worker a process, overlapped)."""
    rows = {}
    with tempfile.TemporaryDirectory(prefix="weft_bench_rl_layout_") as tmp:
        for i, (label, settings, processes) in enumerate(LAYOUTS):
            reward = slow_reward(tmp, a.reward_ms, 1, processes) if a.reward_ms > 0 else []
            rows[label] = run(a.weft, 2, 1, a.steps, os.path.join(tmp, f"layout{i}"),
                              [*settings, *reward])
    print("\nlayouts on 2 ranks of 1 thread" +
          (f", a reward command taking {a.reward_ms:g} ms a response (2 one-worker processes "
           "in all)" if a.reward_ms > 0 else "") + "; the peer: the hybrid engine")
    print(f"{'layout':>44} {'step s':>8} {'rollout s':>9} {'update s':>8} {'waited s':>8} "
          f"{'vs peer':>8}")
    peer = rows[LAYOUTS[0][0]]
    for name, r in rows.items():
        print(f"{name:>44} {r['step_seconds']:8.3f} {r['rollout_seconds']:9.3f} "
              f"{r['update_seconds']:8.3f} {r['sample_wait_seconds']:8.3f} "
              f"{peer['step_seconds'] / r['step_seconds']:7.2f}x")
    return rows


if __name__ == "__main__":
    main()
