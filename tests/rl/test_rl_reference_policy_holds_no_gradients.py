"""The frozen reference policy of the KL term (rl.kl_loss_coef > 0) is only scored, so it holds
its weights and no gradient buffer: a trainer's fp32 gradients would double its memory on the
CPU and triple it on a GPU (bf16 weights).

A tiny random model, one step of `weft rl` with and without the KL term: the bytes the job holds
before its first rollout (the backend's own count of live allocations, metrics.jsonl) grow by the
reference model's parameter bytes (its checkpoint elements in fp32) and at most 5% more (its RoPE
table and small per-trainer buffers), where a gradient buffer would add as much again.
"""
import os
import sys

from reference import files, fixtures
from reference.rl_loop import make_tiny_model, metrics, rl_args, run_rl, write_prompts


def held_before_rollout(weft, tmp, mdir, prompts, label, *extra):
    out = os.path.join(tmp, label)
    run_rl(weft, rl_args(mdir, prompts, out, "train.steps=1", *extra))
    return metrics(out)[1]["before_rollout_bytes"]


def cases(weft, tmp):
    mdir = os.path.join(tmp, "model")
    make_tiny_model(mdir)
    weights = 4 * sum(t.size for t in files.read_safetensors(
        os.path.join(mdir, "model.safetensors")).values())
    prompts = os.path.join(tmp, "prompts.jsonl")
    write_prompts(prompts, [5, 9, 7, 12], seed=3)
    without = held_before_rollout(weft, tmp, mdir, prompts, "no_kl", "rl.kl_loss_coef=0")
    with_kl = held_before_rollout(weft, tmp, mdir, prompts, "kl", "rl.kl_loss_coef=0.1")
    grown = with_kl - without
    print(f"held before the first rollout: {without:.0f} B without the KL term, {with_kl:.0f} B "
          f"with it: the reference policy adds {grown:.0f} B, {grown / weights:.3f} x its "
          f"{weights} bytes of weights")
    if not weights <= grown <= 1.05 * weights:
        return [f"the reference policy adds {grown:.0f} B, not its weights' {weights} B and "
                "at most 5% more"]
    return []


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_reference_memory_", "checks failed"))
