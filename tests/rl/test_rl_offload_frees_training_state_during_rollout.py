"""rl.offload_optimizer (verl's optimizer_offload): while rollout runs, the trainer's optimizer
state (AdamW's m and v, and the fp32 master of bf16 parameters on a GPU) waits in host memory and
its gradient buffers (the model's, and the distributed optimizer's reduce-scatter slice) are
freed, so the KV pool can have that memory; before the policy updates all of it comes back.

The same 3-step job (2 updates a step, held-out evaluation at the start and at step 2, a
checkpoint at step 3) with the option off and on, on the CPU (1 and 2 ranks, the distributed
optimizer) and on device=cuda (the GPU, else weft_emulated):

- the run is unchanged: metrics.jsonl equal in every field but timings and memory, and the
  step-3 checkpoint (model and optimizer) byte for byte the same: the state's round trip is exact;
- every step reports the bytes given back (`offloaded_bytes`, > 0, the same each step), and the
  rollout phase's measured peak (the backend's own count of live bytes) is lower by exactly those
  bytes on device=cuda, where the count is of the bytes asked for; on the CPU it counts malloc's
  usable sizes, so there within 1 KiB;
- the training phase's peak is the same: the state is all back before the updates.
"""
import hashlib
import os
import sys

from reference import fixtures
from reference.rl_loop import learning_setup, metrics, rl_args, run_rl, without_timings

SETTINGS = ["train.steps=3", "train.global_batch_size=4", "rl.ppo_mini_batch_size=2",
            "sampling.n=4", "rl.eval_every=2", "rl.eval_prompts=2", "train.save_every=3",
            "optim.lr=1e-2", "optim.min_lr=1e-2"]
CPU_SLACK = 1024  # bytes: malloc_usable_size rounds each allocation


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def compare(label, off, on, slack, failures):
    m_off, m_on = metrics(off), metrics(on)
    if sorted(m_off) != [1, 2, 3] or sorted(m_on) != [1, 2, 3]:
        failures.append(f"{label}: metrics of steps {sorted(m_off)} (off), {sorted(m_on)} (on)")
        return
    given = {m_on[s]["offloaded_bytes"] for s in m_on}
    for s in (1, 2, 3):
        a, b = m_off[s], m_on[s]
        if without_timings(a) != without_timings(b):
            keys = sorted(k for k in without_timings(a) if a.get(k) != b.get(k))
            failures.append(f"{label} step {s}: metrics differ with the option on in {keys}")
        freed = b["offloaded_bytes"]
        lower = a["rollout_peak_bytes"] - b["rollout_peak_bytes"]
        print(f"  {label} step {s}: gave back {freed:.0f} B; rollout peak {a['rollout_peak_bytes']:.0f}"
              f" -> {b['rollout_peak_bytes']:.0f} B (lower by {lower:.0f}); training peak "
              f"{a['training_peak_bytes']:.0f} -> {b['training_peak_bytes']:.0f} B")
        if a["offloaded_bytes"] != 0 or freed <= 0 or len(given) != 1:
            failures.append(f"{label} step {s}: offloaded_bytes {a['offloaded_bytes']} (off), "
                            f"{freed} (on; every step's: {sorted(given)})")
        if abs(lower - freed) > slack:
            failures.append(f"{label} step {s}: the rollout peak is lower by {lower:.0f} B, not "
                            f"by the {freed:.0f} B given back (slack {slack})")
        if abs(a["training_peak_bytes"] - b["training_peak_bytes"]) > slack:
            failures.append(f"{label} step {s}: training peak {b['training_peak_bytes']:.0f} B with "
                            f"the option, {a['training_peak_bytes']:.0f} B without")
    for name in ("model.safetensors", "optimizer.safetensors"):
        paths = [os.path.join(d, "checkpoints", "step_00000003", name) for d in (off, on)]
        if not all(os.path.exists(p) for p in paths) or digest(paths[0]) != digest(paths[1]):
            failures.append(f"{label}: the step-3 {name} differs with the option on")


def cases(weft, tmp):
    failures = []
    mdir, prompts, reward = learning_setup(tmp)
    runs = [("cpu, 1 rank", weft, 1, [], CPU_SLACK),
            ("cpu, 2 ranks", weft, 2, ["parallel.use_distributed_optimizer=true"], CPU_SLACK)]
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
                                 f"rl.offload_optimizer={option}"), ranks=ranks, timeout=600)
            dirs.append(out)
        compare(label, *dirs, slack, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_offload_", "offload checks failed"))
