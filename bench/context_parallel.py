"""Context parallelism on this machine, in one run, at a fixed global batch with long documents:

  - step time at cp = 1 (one process, 2 threads), 2 (two MPI ranks, 1 thread each) and 4 (four
    ranks, 1 thread each, so two per core), as a ratio to cp=1, and dp=2 beside them as the peer
    that splits the batch by documents instead;
  - the share of the step spent in CP communication (the per-layer K/V all-gathers and dK/dV
    reduce-scatters, timed around the collectives on rank 0, waiting included);
  - peak activation bytes per rank, as the job reports them.

Usage: /usr/bin/python3 bench/context_parallel.py [--weft build/weft] [--steps 5]
Timings are medians of steps 2..K; they mean little while other work runs on the machine. On 2
cores, cp=2 cannot be faster than cp=1 with 2 threads: what CP buys here is memory, and what it
costs is the communication share printed.
"""
import argparse, os, re, statistics, sys, tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from reference import files  # noqa: E402
from reference.mpi import run_ranks  # noqa: E402

CFG = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
           tie_word_embeddings=False, attention_bias=True)
LENGTHS = [4096, 2048, 1024, 512, 256, 128]
STEP = re.compile(r"^step \d+/\d+: .*?, ([0-9.e+-]+) s, [0-9.e+-]+ tokens/s, sync wait "
                  r"[0-9.e+-]+ s, cp comm ([0-9.e+-]+) s", re.M)


def measure(weft, mdir, ranks, threads, steps, *options):
    args = [weft, "grad", "--model", mdir, "--batch", os.path.join(mdir, "batch.jsonl"),
            "--out", os.path.join(mdir, "out.safetensors"), f"train.steps={steps}",
            "parallel.use_distributed_optimizer=false", *options]
    r = run_ranks(ranks, args, threads=threads, timeout=1800)
    rows = [(float(s), float(c)) for s, c in STEP.findall(r.stdout)][1:]
    peak = int(re.search(r"peak_activations=(\d+)", r.stdout).group(1))
    return statistics.median(x[0] for x in rows), statistics.median(x[1] for x in rows), peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"))
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    weft = os.path.abspath(a.weft)
    mdir = tempfile.mkdtemp(prefix="weft_bench_cp_")
    files.make_model(mdir, CFG, 0, std=0.02)
    files.make_batch(os.path.join(mdir, "batch.jsonl"), LENGTHS, [16] * len(LENGTHS),
                     CFG["vocab_size"], 1)
    print(f"model: {CFG['hidden_size']} hidden, {CFG['num_hidden_layers']} layers, "
          f"{CFG['num_attention_heads']} heads / {CFG['num_key_value_heads']} kv heads, vocab "
          f"{CFG['vocab_size']}; global batch {len(LENGTHS)} documents of {LENGTHS} tokens; "
          f"median of steps 2-{a.steps}\n")
    runs = [("cp=1 (1 rank x 2 threads)", 1, 2, 1), ("cp=2 (2 ranks x 1 thread)", 2, 1, 2),
            ("cp=4 (4 ranks x 1 thread)", 4, 1, 4), ("dp=2 (2 ranks x 1 thread), peer", 2, 1, 1)]
    print(f"{'layout':34s} {'step s':>8s} {'vs cp=1':>8s} {'cp comm s':>10s} {'comm share':>10s} "
          f"{'peak act/rank':>14s} {'vs cp=1':>8s}")
    base = None
    for name, ranks, threads, cp in runs:
        sec, comm, peak = measure(weft, mdir, ranks, threads, a.steps,
                                  f"parallel.context_parallel_size={cp}")
        base = base or (sec, peak)
        print(f"{name:34s} {sec:8.3f} {sec / base[0]:8.2f} {comm:10.4f} {100 * comm / sec:9.1f}% "
              f"{peak:14d} {peak / base[1]:8.3f}", flush=True)


if __name__ == "__main__":
    main()
