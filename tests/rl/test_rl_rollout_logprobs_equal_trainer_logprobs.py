"""weft rl's rollout log-probs are the trainer's (DESIGN.md sections 11 and 12): the log-prob the
rollout records for each sampled token equals the old log-prob the trainer recomputes for it.

A random byte-level Qwen2 (head_dim 64, GQA, biases), 8 prompts of 1 to 40 bytes (across KV-cache
blocks of 16) x 4 samples of up to 12 tokens at temperature 1, 2 RL steps with
rl.save_rollouts=true and a reward command (so advantages are not all 0 and step 1's update
changes the weights step 2 samples with):

  - device=cpu: in both steps metrics.jsonl's mismatch_max, mismatch_mean and mismatch_k3 are
    exactly 0, and in rollouts/step_NNNNNN.jsonl every token's "logprobs" equals its
    "old_logprobs" in every bit (float32, as weft computed them); the same on a model with 2 MTP
    modules whose rollout drafts with them (rollout.speculative_tokens=2), where a token may be an
    accepted draft, one drawn after a rejection or a bonus token;
  - device=cuda (the GPU where nvidia-smi lists one, else weft_emulated: the CUDA kernels run on
    the CPU; skipped when neither exists): step 1's mismatch is reported in metrics.jsonl, agrees
    with the rollouts file (bf16 generation and scoring differ by round-off, and the job says by
    how much), and stays under MAX_DIFF (max) and MEAN_DIFF (mean), the bounds of
    rollout/test_generated_logprobs_equal_trainer_logprobs.py.

The last line before PASS/FAIL is a JSON summary with each device's mismatch figures.
"""
import json
import os
import sys

import numpy as np

from reference import fixtures
from reference.rl_loop import (f32, make_tiny_model, metrics, reward_command, rl_args, rollouts,
                               run_rl, write_prompts, write_reward_script)

LENGTHS = [1, 7, 16, 17, 33, 40, 5, 12]
MODEL = dict(hidden_size=128, intermediate_size=160, num_attention_heads=2, num_key_value_heads=1)
SETTINGS = ["train.global_batch_size=8", "sampling.n=4", "sampling.max_tokens=12",
            "sampling.temperature=1", "rl.save_rollouts=true", "optim.lr=1e-3"]
SPECULATIVE = 2  # MTP modules of the second model, and draft tokens per step with it
MAX_DIFF, MEAN_DIFF = 0.1, 0.02  # bf16 logits: 2^-9 relative on logits of a few units


def run(program, tmp, name, device, steps, failures, model="model", extra=()):
    out = os.path.join(tmp, name)
    try:
        run_rl(program, rl_args(os.path.join(tmp, model), os.path.join(tmp, "prompts.jsonl"),
                                out, *SETTINGS, f"train.steps={steps}", f"device={device}", *extra,
                                *reward_command(os.path.join(tmp, "reward.py"))), timeout=900)
    except RuntimeError as e:
        print(e)
        failures.append(f"{name}: weft rl failed")
        return None
    return out


def file_mismatch(rows):
    """From a rollouts file: tokens, tokens whose log-probs differ in any bit, max and mean
    |logprob - old_logprob|, and whether the rewards vary."""
    got = [f32(r["logprobs"]) for r in rows]
    old = [f32(r["old_logprobs"]) for r in rows]
    tokens = sum(len(g) for g in got)
    bits = sum(int(np.sum(g.view(np.uint32) != o.view(np.uint32))) for g, o in zip(got, old))
    diff = np.concatenate([np.abs(g.astype(np.float64) - o) for g, o in zip(got, old)])
    return tokens, bits, float(diff.max()), float(diff.mean())


def check_cpu(label, out, failures, summary):
    m = metrics(out)
    if sorted(m) != [1, 2]:
        failures.append(f"{label}: metrics.jsonl has steps {sorted(m)}, not [1, 2]")
        return
    summary[label] = {}
    for step in (1, 2):
        rows = rollouts(out, step)
        tokens, bits, most, mean = file_mismatch(rows)
        rewards = {r["reward"] for r in rows}
        figures = {k: m[step][k] for k in ("mismatch_max", "mismatch_mean", "mismatch_k3")}
        summary[label][f"step{step}"] = dict(figures, tokens=tokens, differing_bits=bits)
        print(f"{label} step {step}: {len(rows)} samples, {tokens} tokens, log-probs differing from "
              f"the trainer's in any bit: {bits}; metrics {figures}; rewards seen {sorted(rewards)}")
        if len(rows) != 32 or any(len(r["tokens"]) != len(r["logprobs"]) or
                                  len(r["tokens"]) != len(r["old_logprobs"]) for r in rows):
            failures.append(f"{label} step {step}: the rollouts file does not hold 32 samples with "
                            "one logprob and one old_logprob per token")
        if bits:
            failures.append(f"{label} step {step}: {bits} of {tokens} rollout log-probs differ from "
                            f"the trainer's (max |diff| {most:.3g})")
        if any(v != 0.0 for v in figures.values()):
            failures.append(f"{label} step {step}: mismatch metrics are not exactly 0: {figures}")
        if len(rewards) < 2:
            failures.append(f"{label} step {step}: the rewards do not vary ({rewards}), so the "
                            "update does not move the weights")
    if m[1]["grad_norm"] <= 0:
        failures.append(f"{label}: step 1's grad_norm is {m[1]['grad_norm']}: no update was made")


def check_cuda(out, emulated, failures, summary):
    m = metrics(out)
    if 1 not in m:
        failures.append("cuda: no step 1 in metrics.jsonl")
        return
    figures = {k: m[1][k] for k in ("mismatch_max", "mismatch_mean", "mismatch_k3")}
    tokens, bits, most, mean = file_mismatch(rollouts(out, 1))
    label = "cuda_emulated" if emulated else "cuda"
    summary[label] = dict(figures, tokens=tokens, differing_bits=bits)
    print(f"{label} step 1: {tokens} tokens, {bits} log-probs differ from the trainer's; "
          f"metrics {figures}; from the rollouts file max {most:.3g} mean {mean:.3g}")
    if not (figures["mismatch_max"] <= MAX_DIFF and figures["mismatch_mean"] <= MEAN_DIFF):
        failures.append(f"{label}: mismatch max {figures['mismatch_max']:.3g} (bound {MAX_DIFF}) "
                        f"mean {figures['mismatch_mean']:.3g} (bound {MEAN_DIFF})")
    # The metric is the file's numbers, summarized (float32 values, float64 sums).
    if abs(most - figures["mismatch_max"]) > 1e-6 or abs(mean - figures["mismatch_mean"]) > 1e-6:
        failures.append(f"{label}: metrics.jsonl's mismatch ({figures}) is not the rollouts "
                        f"file's (max {most:.9g}, mean {mean:.9g})")
    if figures["mismatch_k3"] < 0 or figures["mismatch_k3"] > figures["mismatch_max"] ** 2:
        failures.append(f"{label}: mismatch_k3 {figures['mismatch_k3']:.3g} outside "
                        f"[0, mismatch_max^2]")


def cases(weft, tmp):
    failures, summary = [], {}
    make_tiny_model(os.path.join(tmp, "model"), seed=3, std=0.1, **MODEL)
    make_tiny_model(os.path.join(tmp, "mtp_model"), seed=4, std=0.1,
                    num_nextn_predict_layers=SPECULATIVE, **MODEL)
    write_prompts(os.path.join(tmp, "prompts.jsonl"), LENGTHS, seed=5)
    write_reward_script(tmp)
    out = run(weft, tmp, "cpu", "cpu", 2, failures)
    if out:
        check_cpu("cpu", out, failures, summary)
    out = run(weft, tmp, "cpu_speculative", "cpu", 2, failures, model="mtp_model",
              extra=[f"rollout.speculative_tokens={SPECULATIVE}"])
    if out:
        check_cpu("cpu_speculative", out, failures, summary)
    program, emulated = fixtures.cuda_weft(weft, 1)
    if program is None:
        print("device=cuda: skipped (no GPU listed and no weft_emulated beside weft)")
        summary["cuda"] = "skipped"
    else:
        print(f"device=cuda on {'weft_emulated' if emulated else 'the GPU'}")
        out = run(program, tmp, "cuda", "cuda", 1, failures)
        if out:
            check_cuda(out, emulated, failures, summary)
    print(json.dumps(summary))
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_logprobs_", "checks failed"))
