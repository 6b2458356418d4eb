"""On the CUDA backend a training step makes the host wait for the GPU a fixed number of times,
never once per micro-batch: per-head loss and accuracy sums and the gradient's squared norm stay
on the device and are read back once per step, together.

`weft grad ... train.steps=4 device=cuda` on 7 packed documents cut into 1 and into 4
micro-batches (MTP on, so every head's sums are kept), on the real GPU where one is listed, else
on weft_emulated: every optimizer step waits the same number of times for both cuts, at most
WAITS_PER_STEP (the statistics' steps[i].host_waits, counted by the backend: downloads,
synchronizations, frees). The first gradient pass may wait more: the activation arena grows to
the largest micro-batch it has seen. WEFT_CUDA_PROFILE=1 prints the same count at the end.
"""
import os
import subprocess
import sys

from reference import fixtures, qwen2

WAITS_PER_STEP = 1  # the step's sums and its share of the gradient norm, read back together
LENGTHS = [13, 1, 2, 9, 24, 5, 17]
PROMPTS = [4, 1, 1, 3, 6, 5, 2]


def cases(weft, tmp):
    failures = []
    program, emulated = fixtures.cuda_weft(weft, 1)
    if program is None:
        print("no GPU and no weft_emulated: skipped")
        sys.exit(77)
    mdir = os.path.join(tmp, "model")
    _, _, bpath, _ = fixtures.model_and_batch(
        mdir, dict(qwen2.SMALL_CFG, num_nextn_predict_layers=1), 61, LENGTHS, PROMPTS, 161)
    waits = {}
    for k in (1, 4):
        args = fixtures.grad_args(mdir, bpath, "device=cuda", "train.steps=4",
                                  f"train.micro_batches={k}")
        _, stats = fixtures.try_grad(program, args, f"micro_batches={k}", failures)
        if stats is None:
            continue
        waits[k] = [s["host_waits"] for s in stats["steps"]]
        print(f"micro_batches={k}{' (emulated)' if emulated else ''}: first pass "
              f"{stats['host_waits']} waits, steps {waits[k]}")
        if any(w > WAITS_PER_STEP for w in waits[k]):
            failures.append(f"micro_batches={k}: a step waited more than {WAITS_PER_STEP} times: "
                            f"{waits[k]}")
    if len(waits) == 2 and waits[1] != waits[4]:
        failures.append(f"host waits per step grow with micro-batches: {waits[1]} vs {waits[4]}")
    r = subprocess.run([program, *fixtures.grad_args(mdir, bpath, "device=cuda"), "--out",
                        os.path.join(tmp, "out.safetensors")], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, WEFT_CUDA_PROFILE="1"))
    print("\n".join(l for l in r.stderr.splitlines() if "host waited" in l))
    return failures


def main():
    return fixtures.run_test(cases, "weft_test_host_waits_")


if __name__ == "__main__":
    sys.exit(main())
