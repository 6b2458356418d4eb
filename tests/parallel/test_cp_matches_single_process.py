"""Context parallelism: (dp, cp) in {(1,2), (1,4), (2,2), (4,1)}, MTP off and on, documents whose
lengths are not multiples of 2*cp and some shorter than 2*cp (one of a single token): loss, MTP
losses, every gradient, the gathered per-token log-probs and the parameters after 3 AdamW steps
equal the single-process run on the same global batch to 1e-5 relative.

The single-process log-probs are themselves checked against log_softmax of the single-process
logits, so the gathered ones are the log-probabilities of the right tokens in batch order. A
document of 131 tokens gives chunks longer than the CPU attention's 64-row tiles. The model is
the well-conditioned fixture of parallel/test_dp_matches_single_process.py (see there why
parameter comparisons after several steps need one)."""
import os, re, sys

import numpy as np

from reference import files
from reference.compare import rel_err
from reference.fixtures import model_variants, run_test
from reference.mpi import run_ranks
from reference.runner import stats_of

TOL = 1e-5
CFG = dict(vocab_size=53, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, rope_theta=100.0, rms_norm_eps=1e-6,
           tie_word_embeddings=False, attention_bias=True)
SEED = 21
# Lengths: none a multiple of 8, three shorter than 2*cp for cp=4 (1, 3, 6), one over 64 rows
# per chunk at cp=1 and several tiles at cp=2.
LENGTHS = [11, 1, 131, 3, 23, 6, 17]
PROMPTS = [3, 1, 40, 1, 4, 2, 5]
# (dp, cp, options): each layout with and without the distributed optimizer, and CP with
# recomputation (which re-gathers keys in backward) and 2 micro-batches per rank, once with every
# collective's sequence cross-checked across ranks (world and CP groups).
RUNS = [(dp, cp, (f"parallel.use_distributed_optimizer={dist}",))
        for dp, cp in [(1, 2), (1, 4), (2, 2), (4, 1)] for dist in ("false", "true")]
RUNS += [(1, 4, ("train.recompute=true", "train.micro_batches=2")),
         (2, 2, ("train.recompute=true", "train.micro_batches=2", "parallel.debug_collectives=true"))]
STEPS = ["train.steps=3", "optim.warmup_steps=1", "optim.min_lr=1e-4"]


def run(weft, mdir, bpath, out, dp, cp, *options):
    stats, _ = stats_of([weft, "grad", "--model", mdir, "--batch", bpath, "--out", out,
                         "--logprobs", *STEPS, f"parallel.context_parallel_size={cp}", *options],
                        lambda args: run_ranks(dp * cp, args))
    return files.read_safetensors(out), stats["collectives"]


def logprobs_from_logits(logits, docs):
    """log p(token t | before) at every target token t, 0 elsewhere, in batch order."""
    want, row = [], 0
    for d in docs:
        L = len(d["input_ids"])
        z = logits[row:row + L].astype(np.float64)
        lsm = z - z.max(1, keepdims=True)
        lsm -= np.log(np.exp(lsm).sum(1, keepdims=True))
        lp = np.zeros(L)
        for t in range(1, L):
            if d["loss_mask"][t]:
                lp[t] = lsm[t - 1, d["input_ids"][t]]
        want.append(lp)
        row += L
    return np.concatenate(want)


def body(weft, tmp):
    failures = []
    for mtp, _, _, _, bpath, docs in model_variants(tmp, "mtp", "num_nextn_predict_layers",
                                                    (0, 1), CFG, lambda _: (SEED, SEED + 1),
                                                    LENGTHS, PROMPTS):
        mdir = os.path.dirname(bpath)
        ref, _ = run(weft, mdir, bpath, os.path.join(tmp, "ref.safetensors"), 1, 1, "--logits")
        lp_err = rel_err(ref["logprobs"], logprobs_from_logits(ref["logits"], docs))[0]
        print(f"{'ok' if lp_err <= TOL else 'FAIL'} mtp={mtp} single-process logprobs vs "
              f"log_softmax(logits): {lp_err:.2e}")
        if lp_err > TOL:
            failures.append(f"mtp={mtp}: single-process logprobs differ from the logits' by {lp_err:.2e}")
        names = [k for k in ref if k != "logits"]
        for dp, cp, options in RUNS:
            tag = f"mtp={mtp} dp={dp} cp={cp} {' '.join(options)}"
            got, stats = run(weft, mdir, bpath, os.path.join(tmp, "got.safetensors"), dp, cp,
                             *options)
            missing = [k for k in names if k not in got]
            if missing:
                failures.append(f"{tag}: missing outputs {missing}")
                continue
            worst = max((rel_err(got[k], ref[k])[0], k) for k in names)
            status = "ok" if worst[0] <= TOL else "FAIL"
            print(f"{status} {tag}: worst {worst[1]} {worst[0]:.2e} (tol {TOL}); loss "
                  f"{float(got['loss']):.7f} vs {float(ref['loss']):.7f}; "
                  f"allgather={stats['allgather']} reduce_scatter={stats['reduce_scatter']}")
            if worst[0] > TOL:
                failures.append(f"{tag}: {worst[1]} differs by {worst[0]:.2e}")
            # The world's stats count only world collectives: CP's live on its own groups, so a
            # DDP run must show none of either kind there.
            if "parallel.use_distributed_optimizer=false" in options and (
                    stats["allgather"] or stats["reduce_scatter"]):
                failures.append(f"{tag}: K/V exchange collectives leaked onto the world group")
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_cp_"))
