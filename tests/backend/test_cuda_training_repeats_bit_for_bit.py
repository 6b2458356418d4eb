"""device=cuda training gives the same bits on every run of the same job: the loss, every
gradient and the parameters after two AdamW steps (with gradient clipping, so the gradient
norm's reduction is in them too) are bit-for-bit equal between two runs.

A GPU runs a launch's blocks in no promised order, so a kernel whose result depends on that
order differs from run to run: fp32 atomics adding into one place did (the embedding, RMSNorm
weight and bias gradients, the gradient norm), and on an H100 the RL offload test's two runs of
one job wrote different step-3 checkpoints. Without a GPU this runs weft_emulated, whose
blocks run in an order drawn per launch from WEFT_EMULATED_BLOCK_SEED: the two runs get seeds
1 and 2, so an order-dependent kernel fails here as on a GPU.

The model has attention biases, an MTP module and a vocabulary of 97 over 330 tokens, so token
ids repeat within the batch and the embedding gradient adds several rows into one; a 270-token
document spans more than one of the embedding backward's 256-token tiles. At this size sums of a
few bf16 rows are exact in any order, so the embedding's order is checked on its own, with rows
of many magnitudes, by backend/test_cuda_kernels_match_reference (each reduction launched twice).
"""

import os
import sys

from reference import files, fixtures, qwen2, runner

STEPS = 2


def run_job(program, args, seed):
    os.environ["WEFT_EMULATED_BLOCK_SEED"] = str(seed)
    try:
        out, _ = runner.run_weft(program, args)
    finally:
        del os.environ["WEFT_EMULATED_BLOCK_SEED"]
    return out


def body(weft, program, emulated, tmp):
    failures = []
    cfg = dict(qwen2.SMALL_CFG, num_nextn_predict_layers=1)
    mdir = os.path.join(tmp, "model")
    cfg, _ = files.make_model(mdir, cfg, seed=5, std=0.05)
    batch = os.path.join(tmp, "batch.jsonl")
    files.make_batch(batch, [40, 270, 20], [5, 20, 0], cfg["vocab_size"], seed=6)
    args = fixtures.grad_args(mdir, batch, "device=cuda", f"train.steps={STEPS}",
                              "optim.lr=1e-2", "optim.min_lr=1e-2", "optim.clip_grad=0.5")
    runs = [run_job(program, args, seed) for seed in (1, 2)]
    names = sorted(runs[0])
    print(f"{len(names)} outputs after {STEPS} steps: loss {float(runs[0]['loss']):.6f}")
    differ = fixtures.outputs_identical(runs[0], runs[1], names)
    if sorted(runs[1]) != names:
        failures.append(f"the runs wrote different tensors: {names} and {sorted(runs[1])}")
    if differ:
        failures.append(f"{len(differ)} of {len(names)} outputs differ between two runs: "
                        + ", ".join(differ[:8]))
    else:
        print(f"all {len(names)} outputs equal in every bit")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_cuda_test(body, "weft_test_cuda_repeat_", "reproducibility checks "
                                                                    "failed"))
