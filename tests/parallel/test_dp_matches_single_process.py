"""Data parallelism: dp in {1, 2, 4}, distributed optimizer on and off, 1 to 3 micro-batches per
rank, uneven document counts and lengths per rank, MTP off and on: gradients equal the
single-process run on the same global batch to 1e-5 relative, and so do parameters after 5 AdamW
steps. The distributed optimizer holds 1/dp of DDP's optimizer state and issues reduce-scatter
and all-gather instead of bucket all-reduces.
The model is the well-conditioned fixture of train/test_adamw_steps_match_pytorch.py: AdamW turns
fp32 round-off in near-zero gradient elements into parameter changes of order lr, so comparing
parameters after several steps at 1e-5 needs a model where no element sits at that edge."""
import os, sys

from reference import files
from reference.compare import rel_err
from reference.fixtures import model_variants, run_test
from reference.mpi import run_ranks
from reference.runner import stats_of

TOL = 1e-5
CFG = dict(vocab_size=53, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, rope_theta=100.0, rms_norm_eps=1e-6,
           tie_word_embeddings=False, attention_bias=True)
SEED = 15
# 7 documents: 4 ranks get different counts and lengths, a 1-token document among them.
LENGTHS = [11, 1, 2, 7, 16, 5, 9]
PROMPTS = [3, 1, 1, 2, 4, 5, 2]
STEPS = ["train.steps=5", "optim.warmup_steps=2", "optim.min_lr=1e-4"]


def run(weft, mdir, bpath, out, np_, *options):
    stats, _ = stats_of([weft, "grad", "--model", mdir, "--batch", bpath, "--out", out, *STEPS,
                         *options], lambda args: run_ranks(np_, args))
    return files.read_safetensors(out), {**stats["memory"], **stats["collectives"]}


def body(weft, tmp):
    failures = []
    for mtp, _, _, _, bpath, _ in model_variants(tmp, "mtp", "num_nextn_predict_layers", (0, 1),
                                                 CFG, lambda _: (SEED, SEED + 1), LENGTHS,
                                                 PROMPTS):
        mdir = os.path.dirname(bpath)
        ref, ref_stats = run(weft, mdir, bpath, os.path.join(tmp, "ref.safetensors"), 1,
                             "parallel.use_distributed_optimizer=false")
        for np_ in (1, 2, 4):
            ddp_state = None
            for dist in (False, True):
                for mb in (1, 2, 3):
                    tag = f"mtp={mtp} dp={np_} distributed_optimizer={dist} micro_batches={mb}"
                    got, stats = run(weft, mdir, bpath, os.path.join(tmp, "got.safetensors"), np_,
                                     f"parallel.use_distributed_optimizer={str(dist).lower()}",
                                     f"train.micro_batches={mb}")
                    worst = max((rel_err(got[k], ref[k])[0], k) for k in ref)
                    status = "ok" if worst[0] <= TOL else "FAIL"
                    print(f"{status} {tag}: worst {worst[1]} {worst[0]:.2e} (tol {TOL}); "
                          f"optimizer_state={stats['optimizer_state']} "
                          f"allreduce={stats['allreduce']} reduce_scatter={stats['reduce_scatter']} "
                          f"allgather={stats['allgather']}")
                    if worst[0] > TOL:
                        failures.append(f"{tag}: {worst[1]} differs by {worst[0]:.2e}")
                    if not dist:
                        ddp_state = stats["optimizer_state"]
                        if stats["reduce_scatter"] or stats["allgather"]:
                            failures.append(f"{tag}: DDP issued reduce-scatter/all-gather")
                    else:
                        # one reduce-scatter per gradient computation (the first + 5 steps), an
                        # all-gather of parameters per step plus one of the output gradients
                        if np_ > 1 and (stats["reduce_scatter"] != 6 or stats["allgather"] != 6):
                            failures.append(f"{tag}: expected 6 reduce-scatters and 6 all-gathers, "
                                            f"got {stats['reduce_scatter']} and {stats['allgather']}")
                        if stats["optimizer_state"] * np_ != ddp_state:
                            failures.append(f"{tag}: optimizer state {stats['optimizer_state']} is "
                                            f"not 1/{np_} of DDP's {ddp_state}")
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_dp_"))
