"""WEFT_CUDA_PROFILE=<file>.json splits the GPU's time into ops: each op's own time (its start
mark to its end mark) and the idle time before it add up, over every op, to the whole span the
profile covered, with nothing counted twice or lost; every op is counted once per call; and a
value that is neither 1 nor a .json name is refused, writing nothing.

CI has no GPU: the jobs run on weft_emulated (the CUDA backend on the CPU emulation, whose events
read the host clock when recorded), `weft grad` on a 2-layer Qwen2 with one MTP module, one
micro-batch. Skipped when built without the CUDA toolkit.
"""
import json
import os
import subprocess
import sys

from reference import files, fixtures, qwen2

LAYERS = qwen2.SMALL_CFG["num_hidden_layers"]
MTP = 1
SPAN_RTOL = 1e-4  # float sums of float32 event intervals


def run(cmd, env):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **env))


def op_calls(doc, prefix):
    """Calls of the op(s) whose name starts with prefix (attention names its kernel family)."""
    return sum(o["calls"] for o in doc["ops"] if o["op"].startswith(prefix))


def cases(emulated, tmp):
    mdir = os.path.join(tmp, "model")
    cfg, _ = files.make_model(mdir, dict(qwen2.SMALL_CFG, num_nextn_predict_layers=MTP), 7,
                              std=0.05)
    batch = os.path.join(tmp, "batch.jsonl")
    files.make_batch(batch, [13, 1, 9, 24, 5, 17], [4, 1, 3, 6, 5, 2], cfg["vocab_size"], 8)
    grad = [emulated, "grad", "--model", mdir, "--batch", batch, "device=cuda"]
    failures = []

    prof = os.path.join(tmp, "profile.json")
    r = run(grad + ["--out", os.path.join(tmp, "g.safetensors")], {"WEFT_CUDA_PROFILE": prof})
    if r.returncode != 0:
        return [f"weft grad with the profile on failed:\n{r.stderr[-2000:]}"]
    with open(prof) as f:
        doc = json.load(f)
    own = sum(o["own_ms"] for o in doc["ops"])
    idle = sum(o["idle_ms"] for o in doc["ops"])
    print(f"span {doc['span_ms']:.3f} ms = own {own:.3f} + idle {idle:.3f} "
          f"(ops {len(doc['ops'])})")
    if doc["span_ms"] <= 0 or abs(own + idle - doc["span_ms"]) > SPAN_RTOL * doc["span_ms"]:
        failures.append(f"own + idle {own + idle:.6f} ms is not the span {doc['span_ms']:.6f}")
    if any(o["own_ms"] < 0 or o["idle_ms"] < 0 for o in doc["ops"]):
        failures.append("a negative time")

    # One micro-batch: every decoder layer (the MTP module's too) attends once each way, and
    # splits its fused q|k|v rows once and joins their gradients once, q and k turning on the way
    # (blocks.c): no RoPE launch of its own.
    want = {"attention_forward": LAYERS + MTP, "attention_backward": LAYERS + MTP,
            "split_columns": LAYERS + MTP, "join_columns": LAYERS + MTP,
            "rope_forward": 0, "rope_backward": 0,
            "swiglu_forward": LAYERS + MTP, "swiglu_backward": LAYERS + MTP}
    for op, n in want.items():
        got = op_calls(doc, op)
        print(f"  {op}: {got} calls (expected {n})")
        if got != n:
            failures.append(f"{op}: {got} calls, expected {n}")

    bad = os.path.join(tmp, "profile.txt")
    r = run(grad + ["--out", os.path.join(tmp, "g2.safetensors")], {"WEFT_CUDA_PROFILE": bad})
    print(f"WEFT_CUDA_PROFILE={os.path.basename(bad)}: exit {r.returncode}: "
          f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else '(no message)'}")
    if r.returncode == 0 or "WEFT_CUDA_PROFILE" not in r.stderr:
        failures.append("a profile file not ending in .json was not refused by name")
    if os.path.exists(bad) or os.path.exists(os.path.join(tmp, "g2.safetensors")):
        failures.append("the refused job wrote a file")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_emulated_cuda_test(cases, "weft_test_cuda_profile_"))
