"""The loss and gradient of one global batch do not depend on the micro-batch count (DESIGN 3).

weft grad with train.micro_batches = 1, 2, 4 on 7 packed documents (lengths 13, 1, 2, 9, 24, 5,
17; masked prompts, one document with no targets), tied and untied embeddings: loss and every
gradient of 2 and 4 equal those of 1 to max|diff|/max|ref| <= 1e-6 per tensor, and all match the
float64 reference to 1e-5. (float32 PyTorch accumulating the same split measures about 2e-7.)
"""

import os
import sys

import numpy as np

from reference import fixtures, qwen2

TOL_REF = 1e-5
TOL_SELF = 1e-6
LENGTHS = [13, 1, 2, 9, 24, 5, 17]
PROMPTS = [4, 1, 1, 3, 6, 5, 2]


def cases(weft, tmp):
    failures = []
    for tied, label, cfg, params, bpath, docs in fixtures.model_variants(
            tmp, "tied", "tie_word_embeddings", (False, True), qwen2.SMALL_CFG,
            lambda tied: (21 + tied, 121 + tied), LENGTHS, PROMPTS):
        mdir = os.path.dirname(bpath)
        loss, _, grads = qwen2.reference_grad(params, cfg, docs)
        print(f"[{label}] reference loss={loss:.10f} targets={qwen2.count_targets(docs)}")
        outs = {}
        for k in (1, 2, 4):
            tag = f"{label}, micro_batches={k}"
            print(f"--- {tag} vs float64 reference")
            out, _ = fixtures.try_grad(
                weft, fixtures.grad_args(mdir, bpath, f"train.micro_batches={k}"), tag, failures)
            if out is None:
                continue
            outs[k] = out
            bad = fixtures.compare_loss_and_grads(out, np.float64(loss), grads, TOL_REF)
            failures += [f"{tag} vs reference: {b}" for b in bad]
        if 1 not in outs:
            continue
        base = outs[1]
        ref1 = {n[len("grad."):]: v for n, v in base.items() if n.startswith("grad.")}
        for k in (2, 4):
            if k not in outs:
                continue
            tag = f"{label}, micro_batches={k} vs micro_batches=1"
            print(f"--- {tag}")
            bad = fixtures.compare_loss_and_grads(outs[k], base.get("loss"), ref1, TOL_SELF)
            failures += [f"{tag}: {b}" for b in bad]
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_microbatch_"))
