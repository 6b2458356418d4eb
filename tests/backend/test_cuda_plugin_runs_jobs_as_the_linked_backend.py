"""`weft` runs device=cuda jobs through its CUDA plugin exactly as a program with the backend
linked in does.

The CUDA backend and NCCL live in libweft_cuda.so, which weft opens on the first device=cuda
call (backend/cuda_plugin.c); the plugin calls back into weft's core. CI has no GPU, so this test
builds the same plugin around the CPU emulation of CUDA (libweft_cuda_emulated.so, beside weft)
and names it with WEFT_CUDA_PLUGIN: `weft grad` (one rank, and two ranks, whose gradient
all-reduce runs through the plugin's NCCL) and `weft generate` must write the same bytes as
weft_emulated, the program with the emulated backend linked in. Without the CUDA toolkit neither
exists and the test is skipped.
"""
import os
import subprocess
import sys

from reference import files, fixtures, qwen2, runner
from reference.generation import random_prompts, write_prompts
from reference.mpi import mpirun


def run(cmd, ranks, env):
    cmd = mpirun(ranks, *cmd) if ranks > 1 else cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1", **env))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")


def same_bytes(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def cases(weft, tmp):
    build = os.path.dirname(os.path.abspath(weft))
    emulated = os.path.join(build, "weft_emulated")
    plugin = os.path.join(build, "libweft_cuda_emulated.so")
    mdir = os.path.join(tmp, "model")
    cfg, _ = files.make_model(mdir, dict(qwen2.SMALL_CFG, num_nextn_predict_layers=1), 7, std=0.05)
    batch = os.path.join(tmp, "batch.jsonl")
    files.make_batch(batch, [13, 1, 9, 24, 5, 17], [4, 1, 3, 6, 5, 2], cfg["vocab_size"], 8)
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts([5, 17, 9], cfg["vocab_size"], 9))
    jobs = [("grad, 1 rank", 1, ["grad", "--model", mdir, "--batch", batch, "device=cuda"]),
            ("grad, 2 ranks", 2, ["grad", "--model", mdir, "--batch", batch, "device=cuda"]),
            ("generate", 1, ["generate", "--model", mdir, "--prompts", prompts, "device=cuda",
                             "sampling.max_tokens=6", "sampling.n=2",
                             "rollout.speculative_tokens=1"])]
    failures = []
    for label, ranks, args in jobs:
        outs = []
        for name, program, env in [("linked", emulated, {}),
                                   ("plugin", weft, {"WEFT_CUDA_PLUGIN": plugin})]:
            out = os.path.join(tmp, f"{label.replace(' ', '_').replace(',', '')}_{name}")
            if args[0] == "grad":
                out += ".safetensors"
            run([program, *args, "--out", out], ranks, env)
            outs.append(out)
        same = same_bytes(*outs)
        print(f"{label}: the plugin's output {'equals' if same else 'DIFFERS from'} the linked "
              f"backend's, byte for byte")
        if not same:
            failures.append(f"{label}: outputs differ")
    return failures


def main():
    weft = runner.weft_path()
    build = os.path.dirname(os.path.abspath(weft))
    if not os.path.exists(os.path.join(build, "libweft_cuda_emulated.so")):
        print("built without CUDA (no emulated plugin beside weft): skipped")
        return 77
    return fixtures.run_test(cases, "weft_test_cuda_plugin_", "checks failed")


if __name__ == "__main__":
    sys.exit(main())
