"""weft rl sends each response to the reward command the moment its sample finishes, while the
other samples still generate (reward.overlap, on by default), and the run is the same as scoring
everything after the rollout.

A reward command that takes time per response (a sandbox running unit tests, a math verifier)
used to start only once the whole rollout had ended, so its time added to every step. Now the
engine hands over each finished sample (rollout/engine.h's sample_done hook) and the requests
are pipelined (rl/reward.c), answers read as they come.

Checked, on 2 steps of 4 prompts x 4 samples whose stop string ends them at different lengths:
- the requests reach the command in the order the samples finish (fewer tokens first; one step's
  finishers in prompt, then sample order), read from the command's log, where
  reward.overlap=false sends them in (prompt, sample) order after the rollout, and the two
  orders differ;
- every sample's reward, tokens and log-probs (rollouts/) and every metric but timings are the
  same with overlap on and off, and step 1's samples on 2 ranks (each scoring its own share) are
  1 rank's (rewards land on the right samples whatever order they are asked in);
- reward.processes=3 (requests sent at once, overlap off) spreads them over more than one process
  and changes no sample or reward;
- metrics.jsonl reports reward_seconds (the wait for rewards after generation) and
  rewards_while_generating (printed, not checked: it depends on how fast the command answers).
"""
import collections
import json
import os
import sys

from reference import fixtures
from reference import rl_loop as rl

SETTINGS = ["sampling.max_tokens=64", 'sampling.stop=["e"]', "rl.save_rollouts=true"]


def run(weft, tmp, mdir, prompts, script, overlap, ranks=1, processes=1, **opts):
    out = os.path.join(tmp, f"out_{overlap}_{ranks}_{processes}")
    log = os.path.join(tmp, f"requests_{overlap}_{ranks}_{processes}.jsonl")
    args = rl.rl_args(mdir, prompts, out, *rl.reward_command(script, log=log, **opts), *SETTINGS,
                      f"reward.overlap={str(overlap).lower()}", f"reward.processes={processes}")
    rl.run_rl(weft, args, ranks=ranks)
    with open(log) as f:
        requests = [json.loads(line) for line in f if line.strip()]
    return out, requests


def prompt_id(row):
    """The prompt file's row index of a rollouts/ row ("path:line")."""
    return int(row["prompt"].rsplit(":", 1)[1]) - 1


def finish_order(rows):
    """The prompt ids of one step's samples in the order they finish on one rank: fewer tokens
    first, a step's finishers in (prompt, sample) order, as rollouts/ lists them."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]["tokens"]), i))
    return [prompt_id(rows[i]) for i in order]


def body(weft, tmp):
    failures = []
    mdir, prompts, _ = rl.learning_setup(tmp)
    script = rl.write_reward_script(tmp)
    on, asked_on = run(weft, tmp, mdir, prompts, script, True)
    off, asked_off = run(weft, tmp, mdir, prompts, script, False)
    steps = sorted(rl.metrics(on))
    expected_on, expected_off = [], []
    for step in steps:
        rows = rl.rollouts(on, step)
        expected_on += finish_order(rows)
        expected_off += [prompt_id(r) for r in rows]
        lengths = sorted(len(r["tokens"]) for r in rows)
        print(f"step {step}: response lengths {lengths}")
    got_on, got_off = [r["id"] for r in asked_on], [r["id"] for r in asked_off]
    print(f"requests with overlap:    {got_on}\nrequests without overlap: {got_off}")
    if got_on != expected_on:
        failures.append(f"overlapped requests not in finishing order: {got_on}, expected "
                        f"{expected_on}")
    if got_off != expected_off:
        failures.append(f"requests after the rollout not in (prompt, sample) order: {got_off}")
    if expected_on == expected_off:
        failures.append("the samples finish in (prompt, sample) order: the setup tells nothing")
    for step in steps:
        if rl.rollouts(off, step) != rl.rollouts(on, step):
            failures.append(f"overlap off: step {step}'s samples or rewards differ")
    a, b = rl.metrics(on), rl.metrics(off)
    differ = sorted({k for s in steps for k in a[s]
                     if not rl.TIMING.search(k) and a[s][k] != b[s][k]})
    if differ:
        failures.append(f"overlap off: metrics differ in {differ}")
    print("overlap off: samples and metrics " + (f"differ in {differ}" if differ else "the same"))
    # Three processes of the command: each request to the one with the fewest unanswered.
    pids = os.path.join(tmp, "pids")
    three, _ = run(weft, tmp, mdir, prompts, script, False, processes=3, pids=pids)
    with open(pids) as f:
        served = sorted(collections.Counter(f.read().split()).values())
    same = all(rl.rollouts(three, step) == rl.rollouts(on, step) for step in steps)
    print(f"reward.processes=3: requests per process {served}; samples and rewards "
          f"{'the same' if same else 'differ'}")
    if not same:
        failures.append("reward.processes=3: the samples or rewards differ from one process's")
    if len(served) < 2:
        failures.append(f"reward.processes=3: one process got every request ({served})")
    # Two ranks sum gradients in another order, so only step 1's samples are the same bits.
    two, _ = run(weft, tmp, mdir, prompts, script, True, ranks=2)
    same = rl.rollouts(two, 1) == rl.rollouts(on, 1)
    if not same:
        failures.append("overlap on 2 ranks: step 1's samples or rewards differ from 1 rank's")
    print(f"overlap on 2 ranks: step 1's samples and rewards {'the same' if same else 'differ'}")
    for step, m in sorted(rl.metrics(on).items()):
        print(f"step {step} with overlap: rewards_while_generating {m['rewards_while_generating']}"
              f" of {len(rl.rollouts(on, step))}, reward_seconds {m['reward_seconds']}")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(body, "weft_test_rl_overlap_", "overlapped rewards failed"))
