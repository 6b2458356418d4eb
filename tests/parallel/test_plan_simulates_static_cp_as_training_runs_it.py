"""`weft plan --lengths` simulates static context parallelism with the planner training runs.

A batch of 12 documents (one of 60 tokens, which needs 2 ranks at 32 rows per rank) is run by
`weft grad --busy` on 4 ranks with parallel.context_parallel_size=2 and
train.max_tokens_per_microbatch=32, and its lengths are simulated by `weft plan --lengths` on 4
ranks with parallel.max_seqlen_per_rank=32 (static CP then takes the least degree that fits the
longest document: 2). Every rank's micro-batches, their degree and their documents, in order, are
the same in both (the plan's statistics against the job's --busy statistics).
"""
import os
import subprocess
import sys

from reference.fixtures import model_and_batch, run_test
from reference.mpi import run_ranks
from reference.runner import stats_of

CFG = dict(vocab_size=53, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
           num_attention_heads=4, num_key_value_heads=2)
LENGTHS = [60, 5, 9, 1, 14, 3, 11, 7, 2, 16, 6, 30]
PROMPTS = [9, 1, 2, 1, 3, 1, 2, 2, 1, 4, 2, 5]
RANKS, LIMIT = 4, 32


def per_rank(micro_batches, ranks):
    """[(degree, [documents])] per rank, in the order the rank runs them."""
    out = [[] for _ in range(ranks)]
    for m in micro_batches:
        for r in range(m["first_rank"], m["first_rank"] + m["degree"]):
            out[r].append((m["degree"], sorted(m["documents"])))
    return out


def body(weft, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    _, _, bpath, _ = model_and_batch(mdir, CFG, 5, LENGTHS, PROMPTS, 6)
    job, _ = stats_of([weft, "grad", "--model", mdir, "--batch", bpath, "--busy", "--out",
                       os.path.join(tmp, "out.safetensors"), "parallel.context_parallel_size=2",
                       f"train.max_tokens_per_microbatch={LIMIT}"],
                      lambda args: run_ranks(RANKS, args))
    ran = [[(m["degree"], sorted(m["documents"])) for m in r["micro_batches"]]
           for r in sorted(job["busy"], key=lambda r: r["rank"])]
    trace = os.path.join(tmp, "lengths.txt")
    with open(trace, "w") as f:
        f.write("\n".join(map(str, LENGTHS)) + "\n")
    plan, r = stats_of([weft, "plan", "--lengths", trace, "--ranks", str(RANKS),
                        f"parallel.max_seqlen_per_rank={LIMIT}",
                        f"train.global_batch_size={len(LENGTHS)}"],
                       lambda args: subprocess.run(args, capture_output=True, text=True,
                                                   timeout=60))
    if r.returncode != 0:
        return [f"weft plan failed: {r.stderr}"]
    simulated = per_rank(plan["steps"][0]["static"]["micro_batches"], RANKS)
    print(f"static CP degree in the simulation: {plan['static_cp_size']}")
    for rank in range(RANKS):
        print(f"rank {rank}: training ran {ran[rank]}\n        plan simulated {simulated[rank]}")
    if plan["static_cp_size"] != 2:
        failures.append(f"the simulation chose static CP degree {plan['static_cp_size']}, not 2")
    if ran != simulated:
        failures.append("the plan's static-CP assignment differs from what training ran")
    if not any(len(r) > 1 for r in ran):
        failures.append("no rank ran more than one micro-batch: the limit packs nothing")
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_plan_static_"))
