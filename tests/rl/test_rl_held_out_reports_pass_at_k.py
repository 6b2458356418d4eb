"""weft rl's held-out evaluation with several responses a problem (rl.eval_n, rl.eval_temperature):
the metrics are those of the responses the reward command scored.

A tiny byte-level Qwen2, 8 prompt rows of which the last 4 are held out (rl.eval_prompts=4); one
RL step with held-out evaluation at the start and after the step, rl.eval_n=4 responses a problem
at rl.eval_temperature=1. The reward command logs every request (the row with its "id", and the
response) and rewards 1 when the response's bytes sum to a multiple of 3 (else 0), so that a
problem's 4 responses are often neither all rewarded nor none. From the log the test takes each
evaluation's 16 requests (the start's are the first 16; the step's 16 training requests follow,
then the second evaluation's) and recomputes, per problem, the rewarded count c of 4:

  - eval_accuracy (mean@4: rewarded responses / 16), in --stats (start) and metrics.jsonl (after
    step 1), equal to 1e-8 (the 9 digits they are printed with);
  - eval_pass_at_1, _2 and _4: Chen et al. (2021)'s 1 - C(4 - c, k) / C(4, k) averaged over the
    problems, equal to 1e-8 (in --stats as eval_pass_at_k_start too);
  - the responses are sampled, not greedy: some problem has two different responses;
  - the rows alternate "data_source" math / code: after step 1, eval_accuracy/<source> and
    eval_pass_at_K/<source> equal the same recomputed over each source's 2 problems;

and rl.eval_n=4 at rl.eval_temperature=0 is one clear error (4 greedy responses are one).
"""
import json
import os
import subprocess
import sys
from math import comb

from reference import fixtures
from reference.rl_loop import environment, learning_setup, metrics, rl_args, run_rl

N, HELD_OUT = 4, 4
SOURCES = ["math", "code"]  # the rows' data_source, alternating
SETTINGS = ["train.steps=1", f"train.global_batch_size={HELD_OUT}", "sampling.n=4",
            "rl.eval_every=1", f"rl.eval_prompts={HELD_OUT}", f"rl.eval_n={N}",
            "rl.eval_temperature=1"]
TOL = 1e-8  # metrics.jsonl and --stats print 9 significant digits


# The reward command: logs each request to argv[1], rewards reward_of(response).
REWARD = r'''
import json, sys
def reward_of(response):
    return float(sum(response.encode("utf-8")) % 3 == 0)
with open(sys.argv[1], "a") as log:
    for line in sys.stdin:
        log.write(line)
        log.flush()
        print(json.dumps({"reward": reward_of(json.loads(line)["response"])}), flush=True)
'''


def reward_of(response):
    """REWARD's."""
    return float(sum(response.encode("utf-8")) % 3 == 0)


def expected(requests, problems=HELD_OUT):
    """mean@N and {k: pass@k} of one evaluation's requests (of `problems` problems)."""
    correct = {}
    for r in requests:
        correct.setdefault(r["id"], []).append(reward_of(r["response"]) > 0)
    counts = [sum(v) for v in correct.values()]
    if sorted(len(v) for v in correct.values()) != [N] * problems:
        return None
    ks = [1, 2, N]
    return (sum(counts) / (problems * N),
            {k: sum(1 - comb(N - c, k) / comb(N, k) for c in counts) / problems for k in ks})


def check(label, got_accuracy, got_pass, requests, failures, problems=HELD_OUT):
    want = expected(requests, problems)
    if want is None:
        failures.append(f"{label}: the log does not hold {N} responses of each held-out problem")
        return
    accuracy, pass_at = want
    distinct = max(len({r["response"] for r in requests if r["id"] == i})
                   for i in {r["id"] for r in requests})
    print(f"{label}: mean@{N} {got_accuracy} (from the log {accuracy}); pass@k "
          f"{got_pass} (from the log {pass_at}); up to {distinct} different responses a problem")
    if abs(got_accuracy - accuracy) > TOL:
        failures.append(f"{label}: eval_accuracy {got_accuracy}, the log's {accuracy}")
    for k, v in pass_at.items():
        if got_pass.get(k) is None or abs(got_pass[k] - v) > TOL:
            failures.append(f"{label}: pass@{k} {got_pass.get(k)}, the log's {v}")
    if distinct < 2:
        failures.append(f"{label}: every problem's {N} responses are the same: not sampled")


def cases(weft, tmp):
    failures = []
    mdir, prompts, _ = learning_setup(tmp, [5, 12, 3, 20, 8, 15, 9, 11], seed=31)
    with open(prompts) as f:
        rows = [json.loads(line) for line in f]
    with open(prompts, "w") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps(dict(row, data_source=SOURCES[i % len(SOURCES)])) + "\n")
    log, out = os.path.join(tmp, "requests.jsonl"), os.path.join(tmp, "run")
    script = os.path.join(tmp, "reward.py")
    with open(script, "w") as f:
        f.write(REWARD)
    reward = ["reward.type=command", f"reward.command={sys.executable} {script} {log}"]
    stats = os.path.join(tmp, "stats.json")
    try:
        run_rl(weft, rl_args(mdir, prompts, out, *SETTINGS, "--stats", stats,
                             *reward))
    except RuntimeError as e:
        print(e)
        return ["weft rl failed"]
    with open(log) as f:
        requests = [json.loads(line) for line in f if line.strip()]
    if len(requests) != 3 * HELD_OUT * N:
        return [f"{len(requests)} reward requests, not {3 * HELD_OUT * N}"]
    with open(stats) as f:
        s = json.load(f)
    start = s.get("eval_pass_at_k_start", {})
    check("at the start", s["eval_accuracy_start"], {int(k): v for k, v in start.items()},
          requests[:HELD_OUT * N], failures)
    m = metrics(out)[1]
    check("after step 1", m["eval_accuracy"],
          {k: m.get(f"eval_pass_at_{k}") for k in (1, 2, N)}, requests[2 * HELD_OUT * N:],
          failures)
    for source in SOURCES:
        if f"eval_accuracy/{source}" not in m:
            failures.append(f"metrics.jsonl has no eval_accuracy/{source}")
            continue
        check(f"after step 1, data_source {source}", m[f"eval_accuracy/{source}"],
              {k: m.get(f"eval_pass_at_{k}/{source}") for k in (1, 2, N)},
              [r for r in requests[2 * HELD_OUT * N:] if r["data_source"] == source], failures,
              problems=HELD_OUT // len(SOURCES))

    r = subprocess.run([weft, *rl_args(mdir, prompts, os.path.join(tmp, "never"), *SETTINGS,
                                       "rl.eval_temperature=0")],
                       capture_output=True, text=True, timeout=120, env=environment(1))
    print(f"rl.eval_n={N} greedy: exit {r.returncode}: {r.stderr.strip()}")
    if r.returncode == 0 or r.stderr.count("weft: error:") != 1 or "rl.eval_n" not in r.stderr:
        failures.append("rl.eval_n=4 at temperature 0 is not one clear error")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_pass_at_k_", "checks failed"))
