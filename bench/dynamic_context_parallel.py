"""Dynamic context parallelism (heterogeneous and uniform modes) against static CP on this
machine, in one run, at the same global batch of a long-tail length mix on W = 4 ranks (1 thread
each):

  - `weft calibrate` on the same 4 ranks fits the planner's cost model first (its fit error is
    printed); both DCP modes plan with it;
  - heterogeneous DCP: every rank's measured busy time (wall time minus time inside CP
    collectives, `weft grad --busy`, the last step) against the planner's prediction for that
    rank (`weft plan`), as a ratio;
  - step time of heterogeneous DCP (max_seqlen_per_rank = 512) against uniform DCP, static
    cp = 4 (= W, budget 512 rows per rank) and static cp = 2 x dp = 2 (budget 1024 rows per rank,
    twice DCP's memory: at 512 the longest document would not fit), as ratios;
  - per rank, the busy total's max/mean imbalance, and the time inside CP collectives per step.

Usage: /usr/bin/python3 bench/dynamic_context_parallel.py [--weft build/weft] [--steps 4]
Timings are medians of steps 2..K. This machine has 2 cores, so 4 ranks share them; busy times
then include time a rank waited for a core, which calibration (run the same way) includes too.
"""
import argparse, os, re, statistics, sys, tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from reference import files  # noqa: E402
from reference.mpi import run_ranks  # noqa: E402

CFG = dict(vocab_size=2048, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
           tie_word_embeddings=True, attention_bias=True)
W = 4
STEP = re.compile(r"^step \d+/\d+: .*?, ([0-9.e+-]+) s, [0-9.e+-]+ tokens/s, sync wait "
                  r"[0-9.e+-]+ s, cp comm ([0-9.e+-]+) s", re.M)
BUSY = re.compile(r"^busy: rank (\d+):.* s \(degree\); total ([0-9.]+) s", re.M)
LIMIT = 512


def long_tail(n, seed):
    """Lognormal lengths (sigma 1.2, median 96), capped at 2048, plus one 2048-token document."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(96), 1.2, n - 1), 8, 2048).astype(int).tolist()
    return [2048] + lengths


def measure(weft, mdir, steps, *options):
    args = [weft, "grad", "--model", mdir, "--batch", os.path.join(mdir, "batch.jsonl"),
            "--out", os.path.join(mdir, "out.safetensors"), f"train.steps={steps}", "--busy",
            "parallel.use_distributed_optimizer=false", *options]
    r = run_ranks(W, args, timeout=1800)
    rows = [(float(s), float(c)) for s, c in STEP.findall(r.stdout)][1:]
    busy = [float(total) for _, total in sorted(BUSY.findall(r.stdout), key=lambda x: int(x[0]))]
    return statistics.median(x[0] for x in rows), statistics.median(x[1] for x in rows), busy


def calibrate(weft, mdir):
    """Fits the cost model on the W ranks; returns its settings as key=value arguments."""
    out = os.path.join(mdir, "cost.yaml")
    r = run_ranks(W, [weft, "calibrate", "--out", out, f"model.path={mdir}",
                      f"parallel.max_seqlen_per_rank={LIMIT}"], timeout=1800)
    print("\n".join(l for l in r.stdout.splitlines() if l.startswith("fit")))
    return [l.strip().replace(": ", "=") for l in open(out) if l.startswith("parallel.")]


def predicted_compute(weft, mdir, options):
    """The planner's compute seconds per rank for the batch (weft plan's estimate)."""
    r = run_ranks(1, [weft, "plan", "--ranks", str(W), "--batch", os.path.join(mdir, "batch.jsonl"),
                      *options])
    line = re.search(r"^estimate: compute per rank (.*)$", r.stdout, re.M).group(1)
    print(re.search(r"^estimate: critical path.*$", r.stdout, re.M).group(0))
    return [float(x) for x in line.split()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"))
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    weft = os.path.abspath(a.weft)
    mdir = tempfile.mkdtemp(prefix="weft_bench_dcp_")
    lengths = long_tail(48, 7)
    files.make_model(mdir, CFG, 0, std=0.02)
    files.make_batch(os.path.join(mdir, "batch.jsonl"), lengths, [8] * len(lengths),
                     CFG["vocab_size"], 1)
    print(f"model: {CFG['hidden_size']} hidden, {CFG['num_hidden_layers']} layers, vocab "
          f"{CFG['vocab_size']}; global batch {len(lengths)} documents, {sum(lengths)} tokens "
          f"(max {max(lengths)}, median {int(np.median(lengths))}); {W} ranks x 1 thread; "
          f"median of steps 2-{a.steps}\n")
    cost = calibrate(weft, mdir)
    dcp = ["parallel.dynamic_context_parallel=true", f"parallel.max_seqlen_per_rank={LIMIT}", *cost]
    layouts = [
        (f"DCP heterogeneous, max_seqlen_per_rank={LIMIT}", dcp + ["parallel.dcp_mode=heterogeneous"]),
        (f"DCP uniform, max_seqlen_per_rank={LIMIT}", dcp + ["parallel.dcp_mode=uniform"]),
        (f"static cp={W}, {LIMIT} rows/rank",
         [f"parallel.context_parallel_size={W}", f"train.max_tokens_per_microbatch={LIMIT}"]),
        (f"static cp=2 x dp=2, {2 * LIMIT} rows/rank",
         ["parallel.context_parallel_size=2", f"train.max_tokens_per_microbatch={2 * LIMIT}"]),
    ]
    predicted = predicted_compute(weft, mdir, layouts[0][1])
    results = []
    for name, options in layouts:
        sec, comm, busy = measure(weft, mdir, a.steps, *options)
        results.append((name, sec, comm, busy))
        print(f"{name}: step {sec:.3f} s, CP collectives {comm:.3f} s, busy per rank "
              f"{' '.join(f'{b:.3f}' for b in busy)} s")
        sys.stdout.flush()
    busy = results[0][3]
    ratios = [b / p for b, p in zip(busy, predicted)]
    print(f"\nheterogeneous DCP, busy per rank measured / predicted: "
          f"{' '.join(f'{x:.3f}' for x in ratios)} (worst deviation "
          f"{max(abs(x - 1) for x in ratios) * 100:.1f}%)")
    first = results[0][1]
    print(f"\n{'layout':42s} {'step s':>8s} {'vs heterogeneous':>17s} {'busy max/mean':>14s}")
    for name, sec, _, busy in results:
        print(f"{name:42s} {sec:8.3f} {sec / first:17.2f} {max(busy) / statistics.mean(busy):14.3f}")
    print("(vs heterogeneous: the layout's step time over heterogeneous DCP's; busy max/mean: the "
          "ranks' busy totals of the last step)")


if __name__ == "__main__":
    main()
