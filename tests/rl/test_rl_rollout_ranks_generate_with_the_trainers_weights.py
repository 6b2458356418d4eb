"""weft rl's disaggregated layout (rl.rollout_ranks, DESIGN.md section 11): the last ranks only
generate and score, the others only train, samples go to the trainers and weights back.

  - Synchronous (rl.rollout_ranks=1 on 2 ranks, =2 on 3 ranks): every step's samples (tokens,
    rollout log-probs, the trainer's old log-probs, rewards, advantages, weight versions) and
    every metric but timings equal, in every bit, the hybrid engine's on 1 rank: the rollout
    ranks generate with exactly the weights the trainer made, step after step (held-out
    evaluation, on the trainers, included: 2 problems x 2 sampled responses). A 2-step run
    resumed to 3 steps gives the same step 3. 2 trainers (dp 2, the distributed optimizer) + 1
    generating equal the hybrid engine on 2 ranks in the same training layout. The same on device=cuda (2 GPUs or the emulator),
    where the weights go device to device through NCCL, for 2 steps; one step off policy there
    generates both steps with version 0, step 1 equal to the hybrid engine's.
  - One step off policy (rl.one_step_off_policy=true, 1 + 1 ranks): step k's samples carry weight
    version max(0, k - 2) (metrics' rollout_weight_version too), step 1's equal the hybrid
    engine's, and every sample's rollout log-probs equal, in every bit, `weft grad --logprobs`
    under the checkpoint of that version (model.path for version 0): the samples were generated
    with those weights and no others. From step 2 on the trainer's recomputed old log-probs
    (weights one version newer) differ from them, and metrics' mismatch_max says by how much.

The model is a random byte-level Qwen2 (vocab 257); 4 prompts of 3 to 40 bytes (of 6; 2 more
held out) per step x 4
samples of up to 8 tokens, 3 steps, a checkpoint each step; the reward command's reward is a
fixed function of the response's bytes, so advantages and updates are not 0.
"""
import json
import os
import sys

import numpy as np

from reference import fixtures, runner
from reference.rl_loop import (f32, learning_setup, metrics, rl_args, rollouts, run_rl,
                               without_timings)

LENGTHS = [40, 3, 17, 25, 9, 33, 6, 38]
STEPS = 3
SETTINGS = [f"train.steps={STEPS}", "train.global_batch_size=4", "sampling.n=4",
            "sampling.max_tokens=8", "rl.save_rollouts=true", "optim.lr=1e-3",
            "optim.min_lr=1e-3", "rl.ppo_mini_batch_size=2", "train.save_every=1",
            "rl.eval_every=2", "rl.eval_prompts=2", "rl.eval_n=2", "rl.eval_temperature=1"]
SYNCHRONOUS = [("1 training + 1 generating", 2, ["rl.rollout_ranks=1"]),
               ("1 training + 2 generating", 3, ["rl.rollout_ranks=2"])]
OFF_POLICY = ["rl.rollout_ranks=1", "rl.one_step_off_policy=true"]


def run(weft, label, ranks, mdir, prompts, reward, out, extra, failures):
    try:
        r = run_rl(weft, rl_args(mdir, prompts, out, *SETTINGS, *reward, *extra), ranks=ranks,
                   timeout=600)
    except RuntimeError as e:
        print(e)
        failures.append(f"{label}: weft rl failed")
        return None
    return r


def same_steps(label, ref, out, steps, failures):
    """Rollout rows and metrics (timings aside) of `steps` in `out` equal `ref`'s."""
    m_ref, m_got = metrics(ref), metrics(out)
    for s in steps:
        a, b = rollouts(ref, s), rollouts(out, s)
        if a != b:
            bad = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            keys = sorted(k for k in (a[bad] if bad < len(a) else {})
                          if bad >= len(b) or a[bad][k] != b[bad].get(k))
            failures.append(f"{label} step {s}: sample {bad} differs from the hybrid engine's "
                            f"in {keys} ({len(b)} samples, the hybrid engine {len(a)})")
        x, y = without_timings(m_ref.get(s, {})), without_timings(m_got.get(s, {}))
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            failures.append(f"{label} step {s}: metrics differ from the hybrid engine's in "
                            f"{keys}: {[(x.get(k), y.get(k)) for k in keys]}")


def prompt_bytes(prompts):
    """{"FILE:LINE": the prompt's byte-level token ids}."""
    with open(prompts) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {f"{prompts}:{i + 1}": list(r["prompt"].encode()) for i, r in enumerate(rows)}


def scored_logprobs(weft, model, rows, ids, tmp, name):
    """weft grad --logprobs under `model` of each row's prompt + tokens: the tokens' log-probs."""
    batch = os.path.join(tmp, f"batch_{name}.jsonl")
    with open(batch, "w") as f:
        for r in rows:
            p = ids[r["prompt"]]
            f.write(json.dumps({"input_ids": p + r["tokens"],
                                "loss_mask": [0] * len(p) + [1] * len(r["tokens"])}) + "\n")
    out, _ = runner.run_weft(weft, fixtures.grad_args(model, batch, "--logprobs",
                                                      "data.tokenizer=bytes"))
    lp, at, got = out["logprobs"], 0, []
    for r in rows:
        p, n = len(ids[r["prompt"]]), len(r["tokens"])
        got.append(np.asarray(lp[at + p:at + p + n], dtype=np.float32))
        at += p + n
    return got


def off_policy_case(weft, mdir, prompts, reward, ref, tmp, failures):
    out = os.path.join(tmp, "off_policy")
    if not run(weft, "one step off policy", 2, mdir, prompts, reward, out, OFF_POLICY, failures):
        return
    m, ids = metrics(out), prompt_bytes(prompts)
    for s in range(1, STEPS + 1):
        want = max(0, s - 2)
        rows = rollouts(out, s)
        versions = {r["weight_version"] for r in rows} | {m[s]["rollout_weight_version"]}
        if versions != {want}:
            failures.append(f"off policy step {s}: weight versions {versions}, not {want}")
            continue
        model = mdir if want == 0 else os.path.join(out, "checkpoints", f"step_{want:08d}")
        scored = scored_logprobs(weft, model, rows, ids, tmp, f"step{s}")
        tokens = sum(len(r["tokens"]) for r in rows)
        bits = sum(int(np.sum(f32(r["logprobs"]).view(np.uint32) != g.view(np.uint32)))
                   for r, g in zip(rows, scored))
        old = max(float(np.max(np.abs(f32(r["old_logprobs"]).astype(np.float64)
                                      - f32(r["logprobs"])))) for r in rows if r["tokens"])
        print(f"off policy step {s}: {len(rows)} samples of weights v{want}; {bits} of {tokens} "
              f"rollout log-probs differ from weft grad's under v{want}; the trainer's old "
              f"log-probs (v{s - 1}) differ by up to {old:.3g} (mismatch_max "
              f"{m[s]['mismatch_max']:.3g}); trainers waited {m[s]['sample_wait_seconds']:.2f} s")
        if bits:
            failures.append(f"off policy step {s}: {bits} of {tokens} log-probs are not those "
                            f"of weights v{want}")
        if s >= 2 and not (old > 0 and m[s]["mismatch_max"] > 0):
            failures.append(f"off policy step {s}: the trainer's old log-probs (v{s - 1}) equal "
                            f"the rollout's (v{want}): the samples were not off policy")
    same_steps("off policy", ref, out, [1], failures)


def cases(weft, tmp):
    failures = []
    mdir, prompts, reward = learning_setup(tmp, LENGTHS, seed=11)
    ref = os.path.join(tmp, "hybrid")
    if not run(weft, "hybrid engine", 1, mdir, prompts, reward, ref, [], failures):
        return failures
    rewards = {r["reward"] for r in rollouts(ref, 1)}
    print(f"hybrid engine, 1 rank: {STEPS} steps, step 1 {len(rollouts(ref, 1))} samples, "
          f"{len(rewards)} distinct rewards")
    for label, ranks, extra in SYNCHRONOUS:
        out = os.path.join(tmp, f"sync{ranks}")
        r = run(weft, label, ranks, mdir, prompts, reward, out, extra, failures)
        if r:
            before = len(failures)
            same_steps(label, ref, out, range(1, STEPS + 1), failures)
            print(f"{label}: steps 1-{STEPS} "
                  f"{'equal the hybrid engine' if len(failures) == before else 'differ'}")
    dp2 = ["parallel.use_distributed_optimizer=true"]
    ref2, out = os.path.join(tmp, "hybrid_dp2"), os.path.join(tmp, "dp2_plus_1")
    if run(weft, "hybrid engine, dp 2", 2, mdir, prompts, reward, ref2, dp2, failures) and \
            run(weft, "2 training + 1 generating", 3, mdir, prompts, reward, out,
                [*dp2, "rl.rollout_ranks=1"], failures):
        before = len(failures)
        same_steps("2 training (dp 2) + 1 generating", ref2, out, range(1, STEPS + 1), failures)
        print(f"2 training (dp 2, distributed optimizer) + 1 generating: steps 1-{STEPS} "
              f"{'equal the hybrid engine on 2 ranks' if len(failures) == before else 'differ'}")
    out = os.path.join(tmp, "resumed")
    first = run(weft, "2 steps", 2, mdir, prompts, reward, out,
                ["rl.rollout_ranks=1", "train.steps=2"], failures)
    if first and run(weft, "resumed to 3", 2, mdir, prompts, reward, out,
                     ["rl.rollout_ranks=1", f"resume={out}"], failures):
        same_steps("2 steps, resumed to 3", ref, out, range(1, STEPS + 1), failures)
    off_policy_case(weft, mdir, prompts, reward, ref, tmp, failures)
    cuda_case(weft, mdir, prompts, reward, tmp, failures)
    return failures


def cuda_case(weft, mdir, prompts, reward, tmp, failures):
    """device=cuda (2 GPUs, else weft_emulated: NCCL's calls made of MPI ones): the weights go
    device to device over NCCL, and 1 + 1 ranks equal the hybrid engine on 1 for 2 steps."""
    program, emulated = fixtures.cuda_weft(weft, 2)
    if not program:
        print("device=cuda: skipped (fewer than 2 GPUs listed and no weft_emulated beside weft)")
        return
    cuda = ["device=cuda", "train.steps=2", "train.save_every=0"]
    ref, out = os.path.join(tmp, "cuda_hybrid"), os.path.join(tmp, "cuda_split")
    if run(program, "cuda hybrid engine", 1, mdir, prompts, reward, ref, cuda, failures) and \
            run(program, "cuda 1 + 1", 2, mdir, prompts, reward, out,
                [*cuda, "rl.rollout_ranks=1"], failures):
        before = len(failures)
        same_steps("device=cuda, 1 training + 1 generating", ref, out, [1, 2], failures)
        print(f"device=cuda{' (emulated)' if emulated else ''}, 1 training + 1 generating: "
              f"steps 1-2 {'equal the hybrid engine' if len(failures) == before else 'differ'}")
    off = os.path.join(tmp, "cuda_off_policy")
    if run(program, "cuda 1 + 1 off policy", 2, mdir, prompts, reward, off,
           [*cuda, *OFF_POLICY], failures):
        m = metrics(off)
        versions = [m[s]["rollout_weight_version"] for s in (1, 2)]
        print(f"device=cuda, one step off policy: weight versions {versions}, step 2's "
              f"mismatch_max {m[2]['mismatch_max']:.3g} (step 1's {m[1]['mismatch_max']:.3g})")
        if versions != [0, 0]:
            failures.append(f"device=cuda off policy: weight versions {versions}, not [0, 0]")
        same_steps("device=cuda, one step off policy", ref, off, [1], failures)


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_rollout_ranks_", "checks failed"))
