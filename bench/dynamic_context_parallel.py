"""Dynamic context parallelism (uniform mode) against static CP on this machine, in one run, at
the same global batch of a long-tail length mix on W = 4 ranks (1 thread each):

  - step time of DCP (max_seqlen_per_rank = 512) against static cp = 4 (= W, budget 512 rows per
    rank) and static cp = 2 x dp = 2 (budget 1024 rows per rank, twice DCP's memory: at 512 the
    longest document would not fit), as ratios;
  - per micro-batch, every rank's busy time (wall time minus time inside CP collectives) and its
    max/mean imbalance, from `weft grad --busy`;
  - the time inside CP collectives per step.

Usage: /usr/bin/python3 bench/dynamic_context_parallel.py [--weft build/weft] [--steps 4]
Timings are medians of steps 2..K. This machine has 2 cores, so 4 ranks share them; busy times
then include time a rank waited for a core, which is spread evenly enough to compare layouts.
"""
import argparse, os, re, statistics, sys, tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from reference import qwen2  # noqa: E402
from reference.mpi import run_ranks  # noqa: E402

CFG = dict(vocab_size=2048, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
           tie_word_embeddings=True, attention_bias=True)
W = 4
STEP = re.compile(r"^step \d+/\d+: .*?, ([0-9.e+-]+) s, [0-9.e+-]+ tokens/s, sync wait "
                  r"[0-9.e+-]+ s, cp comm ([0-9.e+-]+) s", re.M)
BUSY = re.compile(r"^busy: micro-batch (\d+) degree (\d+): .*; max ([0-9.]+) mean ([0-9.]+) "
                  r"imbalance ([0-9.]+)", re.M)


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
    busy = [(int(p), int(c), float(mx), float(mean), float(imb))
            for p, c, mx, mean, imb in BUSY.findall(r.stdout)]
    return statistics.median(x[0] for x in rows), statistics.median(x[1] for x in rows), busy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"))
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    weft = os.path.abspath(a.weft)
    mdir = tempfile.mkdtemp(prefix="weft_bench_dcp_")
    lengths = long_tail(48, 7)
    qwen2.make_model(mdir, CFG, 0, std=0.02)
    qwen2.make_batch(os.path.join(mdir, "batch.jsonl"), lengths, [8] * len(lengths),
                     CFG["vocab_size"], 1)
    print(f"model: {CFG['hidden_size']} hidden, {CFG['num_hidden_layers']} layers, vocab "
          f"{CFG['vocab_size']}; global batch {len(lengths)} documents, {sum(lengths)} tokens "
          f"(max {max(lengths)}, median {int(np.median(lengths))}); {W} ranks x 1 thread; "
          f"median of steps 2-{a.steps}\n")
    layouts = [
        ("DCP uniform, max_seqlen_per_rank=512",
         ["parallel.dynamic_context_parallel=true", "parallel.max_seqlen_per_rank=512"]),
        (f"static cp={W}, 512 rows/rank",
         [f"parallel.context_parallel_size={W}", "train.max_tokens_per_microbatch=512"]),
        ("static cp=2 x dp=2, 1024 rows/rank",
         ["parallel.context_parallel_size=2", "train.max_tokens_per_microbatch=1024"]),
    ]
    results = []
    for name, options in layouts:
        sec, comm, busy = measure(weft, mdir, a.steps, *options)
        results.append((name, sec, comm, busy))
        print(f"{name}: step {sec:.3f} s, CP collectives {comm:.3f} s")
        for p, c, mx, mean, imb in busy:
            print(f"  micro-batch {p:2d} degree {c}: busy max {mx:.4f} s mean {mean:.4f} s, "
                  f"imbalance {imb:.3f}")
        sys.stdout.flush()
    dcp = results[0][1]
    print(f"\n{'layout':40s} {'step s':>8s} {'DCP speed-up':>13s} {'mean imbalance':>15s}")
    for name, sec, _, busy in results:
        weights = [mean for _, _, _, mean, _ in busy]
        imb = sum(i * w for (_, _, _, _, i), w in zip(busy, weights)) / max(sum(weights), 1e-12)
        print(f"{name:40s} {sec:8.3f} {sec / dcp:13.2f} {imb:15.3f}")
    print("(DCP speed-up: the layout's step time over DCP's; mean imbalance: max/mean busy time "
          "per micro-batch, weighted by its mean)")


if __name__ == "__main__":
    main()
