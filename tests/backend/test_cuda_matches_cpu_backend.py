"""weft grad on device=cuda (bf16 weights and activations, fp32 gradients) matches device=cpu
(fp32) on the same weights and packed batch: loss and MTP losses within 1e-2 relative, and every
gradient tensor with cosine similarity at least 0.999 to the CPU one.

Cases: the small reference model (head_dim 16, attention bias, untied head, one MTP module) with
and without recomputation; a wider model with head_dim 64 and documents longer than the
attention kernels' 32-key tiles; head_dim 128 with one kv head for two query heads.

Needs a GPU: exits 77 (ctest reports it skipped) when nvidia-smi lists none. Where a GPU is
listed but weft was built without CUDA, the test fails.
"""

import os
import shutil
import subprocess
import sys

import numpy as np

from reference import fixtures, qwen2

LOSS_RTOL = 1e-2
MIN_COSINE = 0.999

CASES = [
    # label, config overrides, weight std, document lengths, prompt lengths, extra settings
    ("small D16 MTP", dict(qwen2.SMALL_CFG, num_nextn_predict_layers=1), 0.2,
     [13, 1, 2, 9, 24, 5, 17], [4, 1, 1, 3, 6, 5, 2], ["train.recompute=false"]),
    ("small D16 MTP recompute", dict(qwen2.SMALL_CFG, num_nextn_predict_layers=1), 0.2,
     [13, 1, 2, 9, 24, 5, 17], [4, 1, 1, 3, 6, 5, 2], ["train.recompute=true"]),
    ("wide D64", dict(vocab_size=2048, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=True, attention_bias=False), 0.05,
     [300, 77, 512, 5, 130], [10, 3, 20, 1, 0], []),
    ("D128 GQA 2:1", dict(vocab_size=512, hidden_size=256, intermediate_size=384,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          tie_word_embeddings=False, attention_bias=True), 0.05,
     [600, 200], [50, 0], []),
]


def gpu_listed():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    r = subprocess.run([smi, "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return r.returncode == 0 and "GPU" in r.stdout


def cosine(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


def compare(label, cpu, gpu):
    failures = []
    rel = abs(float(gpu["loss"]) - float(cpu["loss"])) / abs(float(cpu["loss"]))
    print(f"[{label}] loss cpu {float(cpu['loss']):.6f} cuda {float(gpu['loss']):.6f} "
          f"rel {rel:.2e}")
    if not rel <= LOSS_RTOL:
        failures.append(f"{label}: loss rel diff {rel:.2e} > {LOSS_RTOL}")
    if "mtp_losses" in cpu:
        mrel = np.abs(gpu["mtp_losses"] - cpu["mtp_losses"]) / np.abs(cpu["mtp_losses"])
        print(f"[{label}] MTP losses rel {np.max(mrel):.2e}")
        if not np.max(mrel) <= LOSS_RTOL:
            failures.append(f"{label}: MTP loss rel diff {np.max(mrel):.2e} > {LOSS_RTOL}")
    worst = (2.0, "")
    for name in sorted(k for k in cpu if k.startswith("grad.")):
        c = cosine(cpu[name], gpu[name])
        worst = min(worst, (c, name))
        if not c >= MIN_COSINE:
            failures.append(f"{label}: {name} cosine {c:.5f} < {MIN_COSINE}")
    print(f"[{label}] worst gradient cosine {worst[0]:.6f} ({worst[1]})")
    return failures


def cases(weft, tmp):
    failures = []
    for i, (label, cfg, std, lengths, prompts, extra) in enumerate(CASES):
        mdir = os.path.join(tmp, f"case{i}")
        cfg, _ = qwen2.make_model(mdir, cfg, seed=40 + i, std=std)
        bpath = os.path.join(mdir, "batch.jsonl")
        qwen2.make_batch(bpath, lengths, prompts, cfg["vocab_size"], seed=140 + i)
        outs = {}
        for device in ("cpu", "cuda"):
            args = fixtures.grad_args(mdir, bpath, f"device={device}", *extra)
            outs[device], _ = fixtures.try_grad(weft, args, f"{label} device={device}", failures)
        if outs["cpu"] is not None and outs["cuda"] is not None:
            failures += compare(label, outs["cpu"], outs["cuda"])
    return failures


def main():
    if not gpu_listed():
        print("no GPU listed by nvidia-smi: skipped")
        return 77
    return fixtures.run_test(cases, "weft_test_cuda_",
                             f"comparisons outside loss rtol {LOSS_RTOL:g} / cosine "
                             f"{MIN_COSINE} or failed")


if __name__ == "__main__":
    sys.exit(main())
