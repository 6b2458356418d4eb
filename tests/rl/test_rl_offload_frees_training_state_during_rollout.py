"""rl.offload_training_state (verl's optimizer_offload, and more): while rollout runs, the
trainer's optimizer state (AdamW's m and v, and the fp32 master of bf16 parameters on a GPU) waits
in host memory, and its gradient buffers (the model's, and the distributed optimizer's
reduce-scatter slice) and the activation memory its training passes sized are freed (and the
reference policy's activations, with a KL term), so the KV pool can have that memory; before the
policy updates all of it comes back.

The same 3-step job (2 updates a step, held-out evaluation at the start and at step 2, a
checkpoint at step 3; the distributed optimizer) with the option off and on, on the CPU (1 rank
with a KL loss term, 2 ranks) and on device=cuda (the GPU, else weft_emulated), read from
metrics.jsonl (the backend's own count of live bytes: of the bytes asked for on device=cuda, of
malloc's usable sizes on the CPU, so there within 1 KiB):

- the run is unchanged: metrics equal in every field but timings and memory, and the step-3
  checkpoint (model and optimizer) byte for byte the same: the state's round trip is exact;
- each step gives back more than the optimizer state and gradients the model's size implies (the
  activations go too): per rank, with the model's N elements padded to 64 x ranks, 4 N of
  gradients, 4 N / ranks of reduce-scatter slice and 4 N / ranks each of m, v (and, for bf16
  parameters on device=cuda, the fp32 master); without the option nothing is given back; and the
  rollout phase's peak is lower than without the option while still holding the KV pool;
- the training phase's peak is no higher (it is lower where an earlier step's passes had sized the
  activation memory larger than this step's need: the option sizes it per step).
"""
import hashlib
import json
import math
import os
import struct
import sys

from reference import fixtures
from reference.rl_loop import learning_setup, metrics, rl_args, run_rl, without_timings

SETTINGS = ["train.steps=3", "train.global_batch_size=4", "rl.ppo_mini_batch_size=2",
            "sampling.n=4", "rl.eval_every=2", "rl.eval_prompts=2", "train.save_every=3",
            "optim.lr=1e-2", "optim.min_lr=1e-2", "parallel.use_distributed_optimizer=true"]
CPU_SLACK = 1024  # bytes: malloc_usable_size rounds each allocation


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def state_bytes(mdir, ranks, fp32_params):
    """The optimizer state and gradient bytes one rank holds (the distributed optimizer)."""
    with open(os.path.join(mdir, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    n = sum(math.prod(t["shape"]) for k, t in header.items()
            if k != "__metadata__")
    pad = 64 * ranks
    n = (n + pad - 1) // pad * pad
    return 4 * n + 4 * n // ranks + (2 if fp32_params else 3) * 4 * n // ranks


def compare(label, off, on, slack, state, failures):
    m_off, m_on = metrics(off), metrics(on)
    if sorted(m_off) != [1, 2, 3] or sorted(m_on) != [1, 2, 3]:
        failures.append(f"{label}: metrics of steps {sorted(m_off)} (off), {sorted(m_on)} (on)")
        return
    for s in (1, 2, 3):
        a, b = m_off[s], m_on[s]
        if without_timings(a) != without_timings(b):
            keys = sorted(k for k in without_timings(a) if a.get(k) != b.get(k))
            failures.append(f"{label} step {s}: metrics differ with the option on in {keys}")
        freed = b["offloaded_bytes"]
        print(f"  {label} step {s}: gave back {freed:.0f} B of {b['before_rollout_bytes']:.0f} "
              f"(optimizer state and gradients {state} B); "
              f"rollout peak {a['rollout_peak_bytes']:.0f} -> {b['rollout_peak_bytes']:.0f} B "
              f"(KV pool {b['kv_bytes_freed']:.0f}); training peak "
              f"{a['training_peak_bytes']:.0f} -> {b['training_peak_bytes']:.0f} B")
        checks = [
            (a["offloaded_bytes"] == 0, "without the option nothing is given back"),
            (freed > state, "the trainer gives back its optimizer state, gradients and "
                            "activations"),
            (b["rollout_peak_bytes"] < a["rollout_peak_bytes"],
             "the rollout peak is lower with the option"),
            (b["rollout_peak_bytes"] - (b["before_rollout_bytes"] - freed) >=
             b["kv_bytes_freed"] > 0,
             "the rollout phase holds the KV pool"),
            (b["training_peak_bytes"] <= a["training_peak_bytes"] + slack,
             "the training peak is no higher (activation memory is sized per step, not kept)"),
        ]
        for ok, what in checks:
            if not ok:
                failures.append(f"{label} step {s}: not so that {what} (off {a}, on {b})")
    for name in ("model.safetensors", "optimizer.safetensors"):
        paths = [os.path.join(d, "checkpoints", "step_00000003", name) for d in (off, on)]
        if not all(os.path.exists(p) for p in paths) or digest(paths[0]) != digest(paths[1]):
            failures.append(f"{label}: the step-3 {name} differs with the option on")


def cases(weft, tmp):
    failures = []
    mdir, prompts, reward = learning_setup(tmp)
    runs = [("cpu, 1 rank, KL loss", weft, 1, ["rl.kl_loss_coef=0.01"], CPU_SLACK),
            ("cpu, 2 ranks", weft, 2, [], CPU_SLACK)]
    program, emulated = fixtures.cuda_weft(weft, 1)
    if program:
        runs.append(("cuda (emulated)" if emulated else "cuda", program, 1, ["device=cuda"], 0))
    else:
        print("device=cuda: skipped (no GPU listed and no weft_emulated beside weft)")
    for k, (label, prog, ranks, extra, slack) in enumerate(runs):
        dirs = []
        for option in ("false", "true"):
            out = os.path.join(tmp, f"run{k}_{option}")
            run_rl(prog, rl_args(mdir, prompts, out, *reward, *SETTINGS, *extra,
                                 f"rl.offload_training_state={option}"), ranks=ranks, timeout=600)
            dirs.append(out)
        compare(label, *dirs, slack,
                state_bytes(mdir, ranks, fp32_params="device=cuda" not in extra), failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_offload_", "offload checks failed"))
