"""The backward driven by per-row log-prob weights is the gradient it says it is.

A batch whose documents carry "logprob_weights" makes `weft grad` run the forward that keeps its
activations, then the backward with dL/dlogp[t] = w_t at every target token t (the MTP heads keep
their cross-entropy weights -lambda/(D N_k)), instead of the fused cross-entropy. On 7 packed
documents with masked prompts, MTP off and on (depth 2):
  - weights -1/N at the N targets reproduce the fused cross-entropy's gradients bit for bit on the
    CPU, and within bf16 round-off (max|diff|/max|ref| <= 1e-2 per tensor) on the CUDA backend
    (weft_emulated without a GPU);
  - random weights (normal, at targets) give the float64 PyTorch reference's gradient of
    sum_t w_t log p(token t | tokens before it) (+ (lambda/D) sum_k L_k with MTP) to 1e-5
    relative per tensor.
"""
import json
import os
import sys

import numpy as np
import torch

from reference import fixtures, qwen2
from reference.compare import compare_all, identical, rel_err

TOL = 1e-5
TOL_BF16 = 1e-2
LENGTHS = [13, 1, 2, 9, 24, 5, 17]
PROMPTS = [4, 1, 1, 3, 6, 5, 2]


def with_weights(bpath, docs, weights, out_path):
    """The batch file again, each line with its documents' per-token weights (0 off targets)."""
    with open(bpath) as f, open(out_path, "w") as g:
        for line, d, w in zip(f, docs, weights):
            row = json.loads(line)
            row["logprob_weights"] = [float(x) if d["loss_mask"][t] else 0.0
                                      for t, x in enumerate(w)]
            g.write(json.dumps(row) + "\n")
    return out_path


def reference_grads(params, cfg, docs, weights):
    """Gradients of sum_t w_t logp_t (+ the MTP losses' term), float64."""
    P = {k: torch.tensor(np.asarray(v), dtype=torch.float64, requires_grad=True)
         for k, v in params.items()}
    logits, _, _, mtp = qwen2.forward(P, cfg, docs)
    lsm = torch.log_softmax(logits, dim=-1)
    objective, row = torch.zeros((), dtype=torch.float64), 0
    for d, w in zip(docs, weights):
        for t in range(1, len(d["input_ids"])):
            if d["loss_mask"][t]:
                objective = objective + float(w[t]) * lsm[row + t - 1, d["input_ids"][t]]
        row += len(d["input_ids"])
    if mtp:
        objective = objective + (qwen2.mtp_scale(cfg) / len(mtp)) * sum(mtp)
    objective.backward()
    return {k: v.grad.detach().numpy() for k, v in P.items()}


def cross_entropy_weights(docs):
    """-1/N at every target, N rounded to float32 as weft's 1/N scale is."""
    n = qwen2.count_targets(docs)
    w = -float(np.float32(1.0 / n))
    return [[w] * len(d["input_ids"]) for d in docs]


def check_bits(weft, program, emulated, mdir, bpath, wpath, label, failures):
    """Weighted with -1/N against the fused cross-entropy: bit for bit on the CPU, within bf16
    round-off on the CUDA backend."""
    device = ["device=cuda"] if program != weft else []
    tag = f"{label}{' device=cuda' + (' (emulated)' if emulated else '') if device else ''}"
    fused, _ = fixtures.try_grad(program, fixtures.grad_args(mdir, bpath, *device),
                                 f"{tag} fused", failures)
    weighted, _ = fixtures.try_grad(program, fixtures.grad_args(mdir, wpath, *device),
                                    f"{tag} weighted", failures)
    if fused is None or weighted is None:
        return
    grads = [k for k in fused if k.startswith("grad.")]
    if not device:
        bad = [k for k in grads if not identical(k, weighted.get(k), fused[k])]
        print(f"--- {tag}: weights -1/N vs fused cross-entropy: {len(grads) - len(bad)} of "
              f"{len(grads)} gradients identical in every bit")
    else:
        errs = {k: rel_err(weighted[k], fused[k])[0] for k in grads if k in weighted}
        worst = max(errs.items(), key=lambda e: e[1])
        print(f"--- {tag}: weights -1/N vs fused cross-entropy: worst {worst[0]} "
              f"max|diff|/max|ref| = {worst[1]:.2e} (tol {TOL_BF16})")
        bad = [k for k in grads if errs.get(k, float("inf")) > TOL_BF16]
    failures += [f"{tag}: {k} of the weighted backward differs from the fused one" for k in bad]


def cases(weft, tmp):
    failures = []
    cuda, emulated = fixtures.cuda_weft(weft, 1)
    for mtp, label, cfg, params, bpath, docs in fixtures.model_variants(
            tmp, "mtp", "num_nextn_predict_layers", (0, 2), qwen2.SMALL_CFG,
            lambda mtp: (51 + mtp, 151 + mtp), LENGTHS, PROMPTS):
        mdir = os.path.dirname(bpath)
        ce = with_weights(bpath, docs, cross_entropy_weights(docs), os.path.join(mdir, "ce.jsonl"))
        check_bits(weft, weft, False, mdir, bpath, ce, label, failures)
        if cuda:
            check_bits(weft, cuda, emulated, mdir, bpath, ce, label, failures)

        rng = np.random.default_rng(7 + mtp)
        weights = [rng.normal(size=len(d["input_ids"])).astype(np.float32) for d in docs]
        wpath = with_weights(bpath, docs, weights, os.path.join(mdir, "random.jsonl"))
        want = reference_grads(params, cfg, docs, weights)
        out, _ = fixtures.try_grad(weft, fixtures.grad_args(mdir, wpath), f"{label} random",
                                   failures)
        if out is None:
            continue
        print(f"--- {label}: random weights vs float64 PyTorch")
        failures += [f"{label} random weights: {b}" for b in compare_all("grad.", out, want, TOL)]
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_weighted_backward_"))
