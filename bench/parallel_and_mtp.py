"""Data parallelism and multi-token prediction on this machine, in one run:

  - training tokens/s at dp=1 (one process, 2 threads) and dp=2 (two MPI ranks, 1 thread each),
    DDP and distributed optimizer, on the same global batch;
  - the share of gradient communication hidden behind backward, for DDP (bucket all-reduces) and
    the distributed optimizer (bucket reduce-scatters): the wait after backward with 1 MiB buckets
    reduced as backward finishes them, against the same buckets reduced only after backward
    (parallel.overlap_grad_reduce=false: nothing hidden), as 1 - overlapped / unoverlapped. That
    batch gives both ranks the same document lengths, so the wait is communication, not one rank
    waiting for the other's backward; runs alternate overlap on and off, three of each;
  - the step-time ratio of MTP D=1 to no MTP.

Usage: /usr/bin/python3 bench/parallel_and_mtp.py [--weft build/weft] [--steps 6]
Timings are medians of steps 2..K (read from weft grad's --stats); they mean little while other
work runs on the machine.
"""
import argparse, os, statistics, sys, tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from reference import files  # noqa: E402
from reference.mpi import run_ranks  # noqa: E402
from reference.runner import stats_of  # noqa: E402

CFG = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
           tie_word_embeddings=False, attention_bias=True)
LENGTHS = [1024, 768, 640, 512, 384, 256, 256, 128, 64, 64]
PAIRED = [1024, 1024, 640, 640, 384, 384, 256, 256, 64, 64]  # two ranks, the same lengths each


def step_rows(weft, mdir, batch, ranks, threads, steps, *options):
    """(seconds, tokens/s, sync wait) of steps 2..K of `weft grad ... train.steps=K`."""
    args = [weft, "grad", "--model", mdir, "--batch", os.path.join(mdir, batch), "--out",
            os.path.join(mdir, "out.safetensors"), f"train.steps={steps}", *options]
    stats, _ = stats_of(args, lambda a: run_ranks(ranks, a, threads=threads, timeout=900))
    return [(s["seconds"], s["tokens"] / s["seconds"], s["sync_wait_seconds"])
            for s in stats["steps"][1:]]


def measure(weft, mdir, ranks, threads, steps, *options):
    rows = step_rows(weft, mdir, "batch.jsonl", ranks, threads, steps, *options)
    return tuple(statistics.median(x[i] for x in rows) for i in range(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"))
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    weft = os.path.abspath(a.weft)
    tmp = tempfile.mkdtemp(prefix="weft_bench_dp_")
    dirs = {}
    for d in (0, 1):
        dirs[d] = os.path.join(tmp, f"mtp{d}")
        files.make_model(dirs[d], dict(CFG, num_nextn_predict_layers=d), 0, std=0.02)
        files.make_batch(os.path.join(dirs[d], "batch.jsonl"), LENGTHS, [16] * len(LENGTHS),
                         CFG["vocab_size"], 1)
    files.make_batch(os.path.join(dirs[0], "paired.jsonl"), PAIRED, [16] * len(PAIRED),
                     CFG["vocab_size"], 2)
    tokens = sum(LENGTHS)
    print(f"model: {CFG['hidden_size']} hidden, {CFG['num_hidden_layers']} layers, vocab "
          f"{CFG['vocab_size']}; global batch {len(LENGTHS)} documents, {tokens} tokens; "
          f"median of steps 2-{a.steps}\n")

    base = measure(weft, dirs[0], 1, 2, a.steps, "parallel.use_distributed_optimizer=false")
    rows = [("dp=1 (1 rank x 2 threads)", base)]
    for dist in ("false", "true"):
        name = "DDP" if dist == "false" else "distributed optimizer"
        rows.append((f"dp=2 (2 ranks x 1 thread), {name}",
                     measure(weft, dirs[0], 2, 1, a.steps, f"parallel.use_distributed_optimizer={dist}")))
    print(f"{'layout':48s} {'step s':>8s} {'tokens/s':>9s} {'ratio':>6s} {'sync wait s':>11s}")
    for name, (sec, tok, wait) in rows:
        print(f"{name:48s} {sec:8.3f} {tok:9.0f} {tok / base[1]:6.2f} {wait:11.4f}")

    # Hidden share: the same buckets reduced while backward runs, and only after it.
    print("\ngradient sync wait after backward, dp=2, 1 MiB buckets:")
    print(f"{'':22s} {'overlapped s':>12s} {'after backward s':>16s} {'hidden':>7s}")
    for dist in ("false", "true"):
        name = "DDP" if dist == "false" else "distributed optimizer"
        waits = {"true": [], "false": []}
        for _ in range(3):
            for overlap in ("true", "false"):
                waits[overlap] += [w for _, _, w in step_rows(
                    weft, dirs[0], "paired.jsonl", 2, 1, a.steps, "parallel.bucket_mb=1",
                    f"parallel.use_distributed_optimizer={dist}",
                    f"parallel.overlap_grad_reduce={overlap}")]
        wait = {k: statistics.median(v) for k, v in waits.items()}
        hidden = 1 - wait["true"] / wait["false"] if wait["false"] > 0 else float("nan")
        print(f"{name:22s} {wait['true']:12.4f} {wait['false']:16.4f} {100 * hidden:6.0f}%")

    mtp = measure(weft, dirs[1], 1, 2, a.steps, "parallel.use_distributed_optimizer=false")
    print(f"\nMTP: step {mtp[0]:.3f} s with D=1 against {base[0]:.3f} s without: ratio "
          f"{mtp[0] / base[0]:.2f}")


if __name__ == "__main__":
    main()
