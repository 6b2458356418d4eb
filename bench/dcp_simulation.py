"""The dynamic context-parallel planner at cluster scale, simulated by `weft plan --lengths`: two
seeded length traces (tests/reference/length_traces.py: lognormal capped at 32K, and a chat /
long-document mix capped at 64K), 4 global batches of 4096 documents each, on 64 and 256
simulated ranks (max_seqlen_per_rank 4096), heterogeneous DCP against its peers uniform DCP and
static CP (the least degree that fits the longest document), in the same run:

  - critical path / perfect-balance lower bound (of the 4 steps' sums, and the worst step);
  - worst per-rank busy imbalance (max/mean - 1);
  - key/value bytes exchanged, as a ratio to static CP's;
  - step time as a ratio to heterogeneous's (the peers' speed-down);
  - planning time of one 4096-document batch, worst step (ms, this machine's CPU).

Times are the planner's cost model (the default calibration, or --cost FILE.yaml as written by
`weft calibrate --out`), not measured steps. Writes a PNG (gnuplot) of step time / lower bound.

Usage: /usr/bin/python3 bench/dcp_simulation.py [--weft build/weft] [--cost FILE.yaml]
       [-o runs/dcp_simulation.png]
"""
import argparse, os, re, subprocess, sys, tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from reference import length_traces  # noqa: E402

STEPS, PER_STEP, RANKS = 4, 4096, (64, 256)
TRACES = (("lognormal", length_traces.lognormal, 11), ("long_tail", length_traces.long_tail, 12))
NUM = r"([0-9.e+-]+)"
SUMMARY = re.compile(rf"^  (static cp=\d+|heterogeneous|uniform) +{NUM}x \(worst {NUM}x\), "
                     rf"imbalance worst {NUM}, step time {NUM}x, CP exchange {NUM}x static, "
                     rf"planning worst {NUM} ms$", re.M)
COST = re.compile(r"cost \(([^)]*)\)/c \+ ([0-9.e+-]+), exchange ([0-9.e+-]+) per row")


def simulate(weft, trace, ranks, cost):
    args = [weft, "plan", "--lengths", trace, "--ranks", str(ranks),
            f"train.global_batch_size={PER_STEP}"] + (["--config", cost] if cost else [])
    r = subprocess.run(args, capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    rows = {}
    for m in SUMMARY.finditer(r.stdout):
        rows[m.group(1)] = dict(zip(("ratio", "worst", "imbalance", "step", "exchange", "ms"),
                                    map(float, m.groups()[1:])))
    head = r.stdout.splitlines()[0]
    if len(rows) != 3:
        sys.exit(f"{' '.join(args)}: expected 3 summary lines, got:\n{r.stdout}")
    return rows, head


def plot(results, path):
    """Clustered bars of step time / lower bound per trace x ranks, one bar per layout."""
    script = f"""set terminal pngcairo size 900,500 font ",11"
set output "{path}"
set title "weft plan: step time / perfect-balance lower bound ({STEPS} x {PER_STEP} documents)"
set ylabel "step time / lower bound"
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set bmargin 4
set xrange [-0.6:{len(results) - 0.4}]
set yrange [0.9:*]
set grid ytics
set key top left noenhanced
set xtics noenhanced
set arrow from graph 0, first 1.1 to graph 1, first 1.1 nohead dashtype 2
set label "1.10" at graph 1, first 1.1 offset -4, 0.6
$bars << EOD
"""
    for (name, ranks), rows in results:
        lay = {k.split(" ")[0]: v["ratio"] for k, v in rows.items()}
        script += (f"\"{name}\\n{ranks} ranks\" {lay['heterogeneous']} {lay['uniform']} "
                   f"{lay['static']}\n")
    script += ('EOD\nplot $bars using 2:xtic(1) title "heterogeneous", "" using 3 title "uniform", '
               '"" using 4 title "static CP"\n')
    r = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
    print(f"gnuplot failed: {r.stderr}" if r.returncode else f"\nplot: {path}")


def run_all(weft, cost, tmp):
    """Simulates every trace x rank count, printing a table for each; returns the summaries."""
    results = []
    for name, gen, seed in TRACES:
        lengths = gen(STEPS * PER_STEP, seed)
        trace = os.path.join(tmp, f"{name}.txt")
        length_traces.write(trace, lengths)
        for ranks in RANKS:
            rows, head = simulate(weft, trace, ranks, cost)
            results.append(((name, ranks), rows))
            if len(results) == 1 and (m := COST.search(head)):
                print(f"cost model: ({m.group(1)})/c + {m.group(2)} s per micro-batch, exchange "
                      f"{m.group(3)} s per row{' from ' + cost if cost else ' (default)'}")
            print(f"\n{name}, {ranks} ranks: {len(lengths)} documents, {sum(lengths)} tokens, "
                  f"longest {max(lengths)}, {STEPS} steps of {PER_STEP}")
            print(f"  {'layout':15s} {'path/LB':>8s} {'worst':>6s} {'imbalance':>9s} "
                  f"{'exch/static':>11s} {'step/het':>8s} {'plan ms':>8s}")
            for layout, v in rows.items():
                print(f"  {layout:15s} {v['ratio']:8.3f} {v['worst']:6.3f} {v['imbalance']:9.3f} "
                      f"{v['exchange']:11.3f} {v['step']:8.3f} {v['ms']:8.2f}")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"))
    ap.add_argument("--cost", help="YAML with parallel.cost_* (weft calibrate --out)")
    ap.add_argument("-o", "--plot", default=os.path.join(REPO, "runs", "dcp_simulation.png"))
    a = ap.parse_args()
    weft, cost = os.path.abspath(a.weft), a.cost and os.path.abspath(a.cost)
    with tempfile.TemporaryDirectory(prefix="weft_bench_dcpsim_") as tmp:
        results = run_all(weft, cost, tmp)
    print("\n(path/LB: critical path over the perfect-balance lower bound, of the step sums; "
          "worst: worst step; imbalance: worst step's max/mean busy - 1; exch/static: K/V bytes "
          "over static CP's; step/het: step time over heterogeneous's; plan ms: worst step's "
          f"planning time for {PER_STEP} documents)")
    os.makedirs(os.path.dirname(os.path.abspath(a.plot)), exist_ok=True)
    plot(results, os.path.abspath(a.plot))


if __name__ == "__main__":
    main()
