"""weft grad with multi-token prediction matches a float64 PyTorch Qwen2 + MTP (DESIGN 8).

The model of test_model_matches_pytorch (vocab 97, hidden 64, 4 heads, 2 kv heads, intermediate
160, 2 layers, attention bias) with num_nextn_predict_layers D = 1 and 2, tied and untied
embeddings, mtp_loss_scale absent (default 0.1) and 0.3. The packed batch has 8 documents of
lengths 13, 1, 2, 9, 3, 24, 5, 17 with masked prompts (the length-5 one is all prompt; the
length-3 one has loss_mask[0] = 1 in the file, which must be ignored): documents of 1, 2 and 3
tokens have no depth-2 target (the length-1 and -2 ones none at depth 1 either), and a depth-k
target is dropped where its token is prompt. One more case: a batch of documents of at most 3
tokens with D = 2, so that depth 2 has no target in the whole batch (N_2 = 0): its mtp_losses
entry is 0 and the gradient of the last MTP module is exactly zero (no path reaches it). There
every depth-1 target sits at position 0, whose attention sees one key, so the first module's
q_proj and k_proj gradients vanish by cancellation (softmax over one key) rather than by having
no path: those are held to round-off, 1e-5 of the module's largest gradient, not to exact zero.

Checked per case, each to max|diff|/max|ref| <= 1e-5: loss (the main loss L), mtp_losses (shape
(D,): L_1..L_D), the main logits (--logits), and every grad.<name>, gradients of
L_total = L + (lambda/D) * sum_k L_k, MTP modules included. float32 PyTorch on these fixtures
measures at most about 3e-6 against float64 (gradients; 1e-6 for losses and logits).
"""

import os
import sys

import numpy as np

from reference import fixtures, qwen2

TOL = 1e-5
LENGTHS = [13, 1, 2, 9, 3, 24, 5, 17]
PROMPTS = [4, 1, 1, 3, 1, 6, 5, 2]
SEEDS = {(1, False): 41, (1, True): 55, (2, False): 51, (2, True): 58}
SHORT_LENGTHS = [3, 1, 2, 3, 2]  # with D = 2: no depth-2 target anywhere
SHORT_PROMPTS = [1, 1, 1, 2, 1]


def cancellation_scales(grads, counts):
    """{name: scale} for MTP gradients that are all zero in the reference although a target lies
    downstream of their module (module K feeds depths K+1..D; counts[j] = N_{j+1}): they are zero
    by cancellation, so weft's round-off there is measured against the module's largest gradient.
    A module with no target downstream is absent: its gradients must be exactly zero."""
    scales = {}
    for name, g in grads.items():
        if np.any(g) or not name.startswith("model.mtp_layers."):
            continue
        K = int(name.split(".")[2])
        if not any(counts[K:]):
            continue
        prefix = f"model.mtp_layers.{K}."
        scales[name] = max(float(np.abs(v).max()) for n, v in grads.items() if n.startswith(prefix))
    return scales


def check_case(weft, tmp, label, cfg_over, seed, lengths, prompts, batch_kw=None):
    mdir = os.path.join(tmp, label.replace(" ", "_").replace(",", ""))
    cfg, params, bpath, docs = fixtures.model_and_batch(mdir, cfg_over, seed, lengths, prompts,
                                                        seed + 100, **(batch_kw or {}))
    D = qwen2.mtp_depth(cfg)
    loss, logits, grads, mtp = qwen2.reference_grad(params, cfg, docs, with_mtp=True)
    counts = qwen2.mtp_target_counts(docs, D)
    n_mtp = sum(1 for n in params if n.startswith("model.mtp_layers."))
    print(f"[{label}] T={sum(lengths)} D={D} lambda={qwen2.mtp_scale(cfg)} "
          f"targets={qwen2.count_targets(docs)} depth targets={counts} "
          f"MTP parameter tensors={n_mtp} "
          f"reference loss={loss:.10f} mtp_losses={' '.join(f'{x:.10f}' for x in mtp)}")
    zero = [n for n, g in grads.items() if not np.any(g)]
    scales = cancellation_scales(grads, counts)
    if zero:
        print(f"  all-zero reference gradients: {len(zero) - len(scales)} must be exactly zero, "
              f"{len(scales)} zero by cancellation ({', '.join(sorted(scales))})")
    failures = []
    out, _ = fixtures.try_grad(weft, fixtures.grad_args(mdir, bpath, "--logits"), label, failures)
    if out is None:
        return failures
    got = out.get("mtp_losses")
    if got is not None and got.dtype != np.float32:
        print(f"  FAIL mtp_losses: dtype {got.dtype}, expected float32")
        failures.append(f"{label}: mtp_losses dtype {got.dtype}")
    bad = fixtures.compare_loss_and_grads(out, np.float64(loss), grads, TOL, logits=logits,
                                          mtp_losses=mtp, grad_scales=scales)
    return failures + [f"{label}: {b}" for b in bad]


def cases(weft, tmp):
    failures = []
    # Seeds picked so that float32 PyTorch stays within about 3e-6 of float64 on every tensor.
    for (D, tied), seed in SEEDS.items():
        over = dict(qwen2.SMALL_CFG, tie_word_embeddings=tied, num_nextn_predict_layers=D)
        if tied:
            over["mtp_loss_scale"] = 0.3
        failures += check_case(weft, tmp, f"D={D} tied={tied}", over, seed, LENGTHS, PROMPTS,
                               dict(mask0_one=(4,)))
    failures += check_case(weft, tmp, "D=2 no depth-2 targets",
                           dict(qwen2.SMALL_CFG, tie_word_embeddings=False,
                                num_nextn_predict_layers=2), 49, SHORT_LENGTHS, SHORT_PROMPTS)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_mtp_", f"comparisons over tolerance {TOL:g} or failed"))
