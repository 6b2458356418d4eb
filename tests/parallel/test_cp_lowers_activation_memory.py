"""Context parallelism splits activation memory: one 4096-token document under cp=4 needs at most
0.3x the peak activation bytes per rank that cp=1 needs, as the job itself reports them
(the statistics' memory.peak_activations: every activation byte lives in the arena that figure
measures). Only the whole-document keys and values of one layer at a time are not split, and
with grouped-query heads they are small. The loss must not change."""
import os, sys

from reference import files
from reference.fixtures import model_and_batch, run_test
from reference.mpi import run_ranks
from reference.runner import stats_of

LIMIT = 0.3
CFG = dict(vocab_size=256, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


def run(weft, mdir, bpath, out, cp):
    stats, _ = stats_of([weft, "grad", "--model", mdir, "--batch", bpath, "--out", out,
                         f"parallel.context_parallel_size={cp}"],
                        lambda args: run_ranks(cp, args, timeout=600))
    peak = stats["memory"]["peak_activations"]
    return peak, float(files.read_safetensors(out)["loss"])


def body(weft, tmp):
    _, _, bpath, _ = model_and_batch(tmp, CFG, 3, [4096], [100], 4)
    out = os.path.join(tmp, "out.safetensors")
    peak1, loss1 = run(weft, tmp, bpath, out, 1)
    peak4, loss4 = run(weft, tmp, bpath, out, 4)
    ratio = peak4 / peak1
    print(f"peak activations per rank: cp=1 {peak1} bytes, cp=4 {peak4} bytes, ratio {ratio:.3f} "
          f"(limit {LIMIT}); loss {loss1:.7f} vs {loss4:.7f}")
    failures = []
    if ratio > LIMIT:
        failures.append(f"cp=4 peak activations are {ratio:.3f}x cp=1's, over {LIMIT}")
    if abs(loss4 - loss1) > 1e-5 * abs(loss1):
        failures.append(f"cp=4 loss {loss4} differs from cp=1 loss {loss1}")
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_cp_memory_"))
