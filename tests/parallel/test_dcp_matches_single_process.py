"""Dynamic context parallelism on W = 4 and 8 ranks with max_seqlen_per_rank = 16: a batch of one
61-token document (which needs c = 4) and ten of 1 to 16 tokens (c = 1).
Uniform mode (W = 4, 8): the plan (`weft plan`'s statistics, checked here) includes a micro-batch
with fewer documents than ranks, so its degree is raised. Heterogeneous mode (W = 8): the plan
runs groups of different sizes side by side. Either way every rank runs the plan's
micro-batches at the plan's degrees (the job's `--busy` report). With MTP off and on: loss, MTP losses, every gradient, the
gathered log-probs and the parameters after 3 AdamW steps equal the single-process run to 1e-5
relative. Every rank's peak activation bytes stay within what max_seqlen_per_rank implies (the
job reports both). A document longer than W x max_seqlen_per_rank fails before any compute with
one clear error, and no output is written."""
import os, subprocess, sys

from reference import files
from reference.compare import rel_err
from reference.fixtures import model_variants, run_test
from reference.mpi import mpirun, run_ranks
from reference.runner import stats_of

TOL = 1e-5
CFG = dict(vocab_size=53, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, rope_theta=100.0, rms_norm_eps=1e-6,
           tie_word_embeddings=False, attention_bias=True)
# Gradients match to about 6e-7 for any seed tried; parameters after AdamW steps amplify fp32
# round-off in near-zero gradient elements (see parallel/test_dp_matches_single_process.py), and
# DCP reorders documents, so the fixture is one of the seeds where no element sits at that edge.
SEED = 17
LENGTHS = [61, 5, 9, 1, 14, 3, 11, 7, 2, 16, 6]
PROMPTS = [9, 1, 2, 1, 3, 1, 2, 2, 1, 4, 2]
LIMIT = 16
STEPS = ["train.steps=3", "optim.warmup_steps=1", "optim.min_lr=1e-4"]
DCP = ["parallel.dynamic_context_parallel=true", f"parallel.max_seqlen_per_rank={LIMIT}"]


def run(weft, mdir, bpath, out, ranks, *options):
    stats, _ = stats_of([weft, "grad", "--model", mdir, "--batch", bpath, "--out", out,
                         "--logprobs", *STEPS, *options], lambda args: run_ranks(ranks, args))
    return files.read_safetensors(out), stats


def check_plan(weft, bpath, ranks, mode, failures):
    """Uniform: the plan has a step with fewer documents than ranks, whose degree was therefore
    raised. Heterogeneous: a step runs groups of different degrees side by side. Returns each
    rank's degrees, micro-batch by micro-batch, as the plan gives them."""
    def plan(args):
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
        print(r.stdout)
        if r.returncode != 0:
            failures.append(f"W={ranks} {mode}: weft plan failed: {r.stderr}")
        return r
    stats, r = stats_of([weft, "plan", "--ranks", str(ranks), "--batch", bpath, *DCP,
                         f"parallel.dcp_mode={mode}"], plan)
    micro = stats["micro_batches"]
    steps = sorted({m["step"] for m in micro})
    docs = [sum(len(m["documents"]) for m in micro if m["step"] == s) for s in steps]
    mixed = [s for s in steps if len({m["degree"] for m in micro if m["step"] == s}) > 1]
    if mode == "uniform" and not any(d < ranks for d in docs):
        failures.append(f"W={ranks}: the plan has no micro-batch with fewer documents than ranks "
                        f"(documents per step {docs})")
    elif mode == "heterogeneous" and not mixed:
        failures.append(f"W={ranks} {mode}: no step runs groups of different degrees")
    per_rank = [[] for _ in range(ranks)]
    for m in micro:
        for rank in range(m["first_rank"], m["first_rank"] + m["degree"]):
            per_rank[rank].append(m["degree"])
    return per_rank


def ran_degrees(stats, ranks):
    """Each rank's degrees, micro-batch by micro-batch, from the job's --busy report."""
    per_rank = [[] for _ in range(ranks)]
    for r in stats["busy"]:
        per_rank[r["rank"]] = [m["degree"] for m in r["micro_batches"]]
    return per_rank


def check_memory(stats, tag, failures):
    memory = stats.get("memory", {})
    if "bound_for_max_seqlen_per_rank" not in memory:
        failures.append(f"{tag}: the job did not report peak activations and their bound")
        return
    peak, bound = memory["peak_activations_max_rank"], memory["bound_for_max_seqlen_per_rank"]
    print(f"  {tag}: largest per-rank peak activations {peak} bytes, bound {bound}")
    if peak > bound:
        failures.append(f"{tag}: a rank's peak activations {peak} exceed the bound {bound}")


def check_too_long(weft, mdir, tmp, ranks, failures):
    """A document that does not fit W x max_seqlen_per_rank: one clear error, before compute."""
    bpath = os.path.join(tmp, "long.jsonl")
    files.make_batch(bpath, [5, ranks * LIMIT + 1, 3], [1, 1, 1], CFG["vocab_size"], 3)
    out = os.path.join(tmp, "never.safetensors")
    cmd = mpirun(ranks, weft, "grad", "--model", mdir, "--batch", bpath, "--out", out, *DCP)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    # Every rank finds the same document and says so (their lines may interleave).
    errors = [l for l in r.stderr.splitlines() if "weft: error:" in l]
    print(f"  W={ranks} too long: exit {r.returncode}: {errors[:1]}")
    want = [f"document 2 has {ranks * LIMIT + 1} tokens", f"max_seqlen_per_rank = {LIMIT}"]
    if (r.returncode == 0 or not errors or not all(w in e for e in errors for w in want)
            or "grad:" in r.stdout or os.path.exists(out)):
        failures.append(f"W={ranks}: an over-long document did not fail cleanly before compute: "
                        f"exit {r.returncode}, errors {errors}, stdout {r.stdout[:200]!r}")


def body(weft, tmp):
    failures = []
    for mtp, _, _, _, bpath, _ in model_variants(tmp, "mtp", "num_nextn_predict_layers", (0, 1),
                                                 CFG, lambda _: (SEED, SEED + 1), LENGTHS,
                                                 PROMPTS):
        mdir = os.path.dirname(bpath)
        ref, _ = run(weft, mdir, bpath, os.path.join(tmp, "ref.safetensors"), 1)
        for ranks, mode in ((4, "uniform"), (8, "uniform"), (8, "heterogeneous")):
            planned = check_plan(weft, bpath, ranks, mode, failures)
            if mtp == 0 and mode == "uniform":
                check_too_long(weft, mdir, tmp, ranks, failures)
            tag = f"mtp={mtp} W={ranks} {mode}"
            got, stats = run(weft, mdir, bpath, os.path.join(tmp, "got.safetensors"), ranks,
                             "--busy", *DCP, f"parallel.dcp_mode={mode}")
            # The job ran the plan: every rank the same degrees, micro-batch by micro-batch.
            ran = ran_degrees(stats, ranks)
            if ran != planned or not any(4 in r for r in ran):
                failures.append(f"{tag}: the job ran degrees {ran}, the plan says {planned}")
            worst = max((rel_err(got[k], ref[k])[0], k) for k in ref)
            status = "ok" if worst[0] <= TOL else "FAIL"
            print(f"{status} {tag}: worst {worst[1]} {worst[0]:.2e} (tol {TOL}); loss "
                  f"{float(got['loss']):.7f} vs {float(ref['loss']):.7f}")
            if worst[0] > TOL:
                failures.append(f"{tag}: {worst[1]} differs by {worst[0]:.2e}")
            check_memory(stats, tag, failures)
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_dcp_"))
