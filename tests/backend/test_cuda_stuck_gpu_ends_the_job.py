"""A GPU whose work never finishes ends the job with one clear error within device_timeout,
instead of hanging it for good (DESIGN.md section 4: every blocking wait has a timeout).

cudaStreamSynchronize and cudaEventSynchronize wait without a limit, so a kernel that never ends
(an mbarrier waited on forever, say) would have hung weft on every rank of the job. The CUDA
backend's waits now poll with the job's device_timeout (src/backend/cuda/watch.h). Here a test
fault (WEFT_TEST_SKIP_GPU_WORK_DONE=RANK:INDEX, core/fault.h) makes one wait never see its work
done, so the same code path runs on the emulation in CI and on a real GPU:

- `weft grad` stuck at every wait, and at a wait in the middle of the job (half the host waits
  of the same job run plainly), `weft generate` in the middle of generating, each with
  device_timeout=1: exit 1, one "weft: error:" line naming device_timeout and the op queued
  last, no output file;
- two ranks under mpirun (the emulation's NCCL), rank 1 stuck: the whole job ends (rank 0 sat
  in a collective), the error names device_timeout;
- device_timeout=-1: one clear error before any work.
Without the deadline each stuck case runs until this test's 120-second timeout and fails.
"""
import json
import os
import subprocess
import sys
import time

from reference import files, fixtures, generation, qwen2
from reference.mpi import mpirun

TIMEOUT = 120  # a run still going after this hung


def stuck_env(at):
    return dict(os.environ, WEFT_TEST_SKIP_GPU_WORK_DONE=at, OMP_NUM_THREADS="1")


def run_stuck(name, cmd, at, outputs, must=("device_timeout = 1 s", "queued"),
              one_line=True):
    """Runs cmd with wait `at` stuck; returns a failure string or None."""
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT,
                           env=stuck_env(at))
    except subprocess.TimeoutExpired:
        return f"{name}: still running after {TIMEOUT} s: the stuck wait hung the job"
    seconds = time.monotonic() - t0
    errors = [l for l in r.stderr.splitlines() if l.startswith("weft: error:")]
    problems = []
    if r.returncode == 0:
        problems.append("exit status 0")
    if not errors or (one_line and len([l for l in r.stderr.splitlines() if l.strip()]) != 1):
        problems.append(f"not one error line: {r.stderr[-2000:]!r}")
    problems += [f"the error lacks {m!r}" for m in must if not any(m in e for e in errors)]
    problems += [f"{p} was written" for p in outputs if os.path.exists(p)]
    print(f"{name} (wait {at} stuck): exit {r.returncode} after {seconds:.1f} s: "
          f"{errors[0] if errors else r.stderr[-300:]}")
    return f"{name}: " + "; ".join(problems) if problems else None


def plain_host_waits(cmd, stats):
    """The host waits of cmd run without a fault (its --stats)."""
    subprocess.run(cmd + ["--stats", stats], check=True, capture_output=True, timeout=TIMEOUT,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    with open(stats) as f:
        return int(json.load(f)["host_waits"])


def body(weft, program, emulated, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    cfg, _ = files.make_model(mdir, dict(qwen2.SMALL_CFG), seed=3, std=0.05)
    batch = os.path.join(tmp, "batch.jsonl")
    files.make_batch(batch, [30, 50, 20], [5, 10, 0], cfg["vocab_size"], seed=4)
    out = os.path.join(tmp, "out.safetensors")
    grad = [program, "grad", "--model", mdir, "--batch", batch, "device=cuda", "train.steps=2"]
    waits = plain_host_waits(grad + ["--out", os.path.join(tmp, "plain.safetensors")],
                             os.path.join(tmp, "grad_stats.json"))
    print(f"weft grad run plainly: {waits} host waits")
    stuck_grad = grad + ["--out", out, "device_timeout=1"]
    failures.append(run_stuck("grad, every wait", stuck_grad, "0:*", [out]))
    failures.append(run_stuck("grad, mid-job", stuck_grad, f"0:{waits // 2}", [out]))

    prompts = generation.write_prompts(os.path.join(tmp, "prompts.jsonl"),
                                       generation.random_prompts([7, 12, 3, 9], cfg["vocab_size"],
                                                                 5))
    gen = [program, "generate", "--model", mdir, "--prompts", prompts, "device=cuda",
           "sampling.max_tokens=12", "sampling.n=2", "sampling.stop_token_ids=[]"]
    gen_out = os.path.join(tmp, "gen.jsonl")
    waits = plain_host_waits(gen + ["--out", os.path.join(tmp, "plain.jsonl")],
                             os.path.join(tmp, "gen_stats.json"))
    print(f"weft generate run plainly: {waits} host waits")
    failures.append(run_stuck("generate, mid-generation", gen + ["--out", gen_out,
                                                                 "device_timeout=1"],
                              f"0:{waits // 2}", [gen_out]))

    if emulated:  # two ranks on one real GPU would be refused by NCCL
        failures.append(run_stuck("2 ranks, rank 1 stuck", mpirun(2, *stuck_grad), "1:*", [out],
                                  must=("device_timeout = 1 s",), one_line=False))
    failures.append(fixtures.one_clear_error(
        "device_timeout=-1", grad + ["--out", out, "device_timeout=-1"], ["device_timeout"],
        wrote=lambda: os.path.exists(out)))
    return [f for f in failures if f]


if __name__ == "__main__":
    sys.exit(fixtures.run_cuda_test(body, "weft_test_cuda_stuck_", "stuck GPUs not ended"))
