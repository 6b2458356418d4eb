"""The forward-only (scoring) pass gives the training pass's log-probs bit for bit on the CPU.

`weft grad --score --logprobs --entropy` runs the model forward only, keeping no activation for a
backward; `weft grad --logprobs --entropy` runs the training pass (forward, fused cross-entropy,
backward). On 7 packed documents (masked prompts, a 1-token document, one with no targets), with
MTP off and on (depth 2) and recomputation on for the training pass: logprobs and entropy of the
two are identical in every bit, and the loss too. Both match the float64 PyTorch reference
(log p(token t | tokens before it) at every target, the entropy of the distribution predicting
it) to 1e-5 relative.
"""
import os
import sys

import numpy as np
import torch

from reference import fixtures, qwen2
from reference.compare import compare, identical

TOL = 1e-5
LENGTHS = [13, 1, 2, 9, 24, 5, 17]
PROMPTS = [4, 1, 1, 3, 6, 5, 2]


def reference_logprobs(params, cfg, docs):
    """log p and entropy at every target token (0 elsewhere), batch order, float64."""
    logits, _, _, _ = qwen2.forward(qwen2.to_torch(params), cfg, docs)
    lsm = torch.log_softmax(logits, dim=-1)
    entropy = -(lsm.exp() * lsm).sum(-1)
    lp, ent, row = [], [], 0
    for d in docs:
        L = len(d["input_ids"])
        for t in range(L):
            target = t > 0 and d["loss_mask"][t]
            lp.append(float(lsm[row + t - 1, d["input_ids"][t]]) if target else 0.0)
            ent.append(float(entropy[row + t - 1]) if target else 0.0)
        row += L
    return np.array(lp), np.array(ent)


def cases(weft, tmp):
    failures = []
    for mtp, label, cfg, params, bpath, docs in fixtures.model_variants(
            tmp, "mtp", "num_nextn_predict_layers", (0, 2), qwen2.SMALL_CFG,
            lambda mtp: (41 + mtp, 141 + mtp), LENGTHS, PROMPTS):
        mdir = os.path.dirname(bpath)
        want_lp, want_ent = reference_logprobs(params, cfg, docs)
        outs = {}
        for mode, extra in (("train", ["train.recompute=true"]), ("score", ["--score"])):
            args = fixtures.grad_args(mdir, bpath, "--logprobs", "--entropy", *extra)
            out, _ = fixtures.try_grad(weft, args, f"{label} {mode}", failures)
            if out is None:
                continue
            outs[mode] = out
            print(f"--- {label}, {mode} pass vs float64 reference")
            for name, want in (("logprobs", want_lp), ("entropy", want_ent)):
                if not compare(name, out.get(name), want, TOL):
                    failures.append(f"{label} {mode}: {name} vs reference")
        if len(outs) == 2:
            print(f"--- {label}, scoring pass vs training pass, bit for bit")
            for name in ("logprobs", "entropy", "loss"):
                if not identical(name, outs["score"].get(name), outs["train"].get(name)):
                    failures.append(f"{label}: {name} of the scoring pass differs from training's")
            if any(k.startswith("grad.") for k in outs["score"]):
                failures.append(f"{label}: the scoring pass wrote gradients")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_forward_only_"))
