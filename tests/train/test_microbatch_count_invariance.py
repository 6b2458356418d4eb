"""The loss and gradient of one global batch do not depend on the micro-batch count (DESIGN 3).

weft grad with train.micro_batches = 1, 2, 4 on 7 packed documents (lengths 13, 1, 2, 9, 24, 5,
17; masked prompts, one document with no targets), tied and untied embeddings: loss and every
gradient of 2 and 4 equal those of 1 to max|diff|/max|ref| <= 1e-6 per tensor, and all match the
float64 reference to 1e-5. (float32 PyTorch accumulating the same split measures about 2e-7.)
"""

import os
import shutil
import sys
import tempfile

import numpy as np

from reference import qwen2

TOL_REF = 1e-5
TOL_SELF = 1e-6
LENGTHS = [13, 1, 2, 9, 24, 5, 17]
PROMPTS = [4, 1, 1, 3, 6, 5, 2]


def main():
    weft = qwen2.weft_path()
    if not os.access(weft, os.X_OK):
        print(f"weft binary not found at {weft}")
        return 1
    tmp = tempfile.mkdtemp(prefix="weft_test_microbatch_")
    failures = []
    try:
        for tied in (False, True):
            label = f"tied={tied}"
            mdir = os.path.join(tmp, f"tied{int(tied)}")
            cfg, params = qwen2.make_model(mdir, dict(qwen2.SMALL_CFG, tie_word_embeddings=tied),
                                           seed=21 + tied)
            bpath = os.path.join(mdir, "batch.jsonl")
            docs = qwen2.make_batch(bpath, LENGTHS, PROMPTS, cfg["vocab_size"], 121 + tied)
            loss, _, grads = qwen2.reference_grad(params, cfg, docs)
            print(f"[{label}] reference loss={loss:.10f} targets={qwen2.count_targets(docs)}")
            outs = {}
            for k in (1, 2, 4):
                tag = f"{label}, micro_batches={k}"
                print(f"--- {tag} vs float64 reference")
                try:
                    out, _ = qwen2.run_weft(weft, ["grad", "--model", mdir, "--batch", bpath,
                                                   f"train.micro_batches={k}"])
                except qwen2.WeftError as e:
                    print(f"  FAIL weft grad failed:\n{e}")
                    failures.append(f"{tag}: weft grad failed")
                    continue
                outs[k] = out
                bad = []
                if not qwen2.compare("loss", out.get("loss"), np.float64(loss), TOL_REF):
                    bad.append("loss")
                bad += qwen2.compare_all("grad.", out, grads, TOL_REF)
                failures += [f"{tag} vs reference: {b}" for b in bad]
            if 1 not in outs:
                continue
            base = outs[1]
            for k in (2, 4):
                if k not in outs:
                    continue
                tag = f"{label}, micro_batches={k} vs micro_batches=1"
                print(f"--- {tag}")
                bad = []
                if not qwen2.compare("loss", outs[k].get("loss"), base.get("loss"), TOL_SELF):
                    bad.append("loss")
                ref1 = {n[len("grad."):]: v for n, v in base.items() if n.startswith("grad.")}
                bad += qwen2.compare_all("grad.", outs[k], ref1, TOL_SELF)
                failures += [f"{tag}: {b}" for b in bad]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"\nFAIL: {len(failures)} comparisons over tolerance or failed:")
        for f in failures:
            print("  " + f)
        return 1
    print("\nPASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
