"""`weft calibrate` on 2 ranks: times micro-batches of a small model at CP degrees 1 and 2, reports
every timing beside the fitted model's prediction and the fit error (its statistics), and writes
the five coefficients as YAML settings that `weft plan --config` then plans with. An --out that
cannot be written (under a file) fails before any timing, with one error naming it and nothing
written. (Timings themselves are
never checked against thresholds: only that the fit is complete, non-negative and used.)"""
import os, re, subprocess, sys

from reference.fixtures import run_test
from reference.mpi import mpirun, run_ranks
from reference.runner import stats_of

SMALL = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2",
         "model.num_heads=2", "model.num_kv_heads=1", "parallel.max_seqlen_per_rank=64"]
KEYS = ["alpha", "beta", "gamma", "delta", "epsilon"]


def body(weft, tmp):
    failures = []
    out = os.path.join(tmp, "cost.yaml")
    stats, r = stats_of([weft, "calibrate", "--out", out, "--repeats", "3", *SMALL],
                        lambda args: run_ranks(2, args, timeout=600))
    print(r.stdout)
    probes = [(p["n_docs"], p["len"], p["degree"]) for p in stats.get("probes", [])]
    if not any(c == 1 for _, _, c in probes) or not any(c == 2 for _, _, c in probes):
        failures.append(f"calibrate timed no degree-1 or no degree-2 micro-batch: {probes}")
    error = stats.get("error", {})
    if not all(k in error for k in ("compute_rms", "compute_max", "comm_rms")):
        failures.append("calibrate reported no fit error")
    fitted = {}
    if os.path.exists(out):
        for line in open(out):
            m = re.match(r"parallel\.cost_(\w+): (\S+)$", line.strip())
            if m:
                fitted[m.group(1)] = float(m.group(2))
    if sorted(fitted) != sorted(KEYS) or any(v < 0 for v in fitted.values()):
        failures.append(f"{out} does not hold five non-negative coefficients: {fitted}")
    elif fitted["alpha"] + fitted["beta"] <= 0 or fitted["delta"] <= 0:
        failures.append(f"the fit gives documents or the exchange no cost: {fitted}")
    else:
        trace = os.path.join(tmp, "lengths.txt")
        with open(trace, "w") as f:
            f.write("\n".join(str(n) for n in [120, 7, 33, 64, 5, 90, 17, 2]) + "\n")
        plan, p = stats_of([weft, "plan", "--config", out, "--lengths", trace, "--ranks", "2",
                            "train.global_batch_size=8", *SMALL],
                           lambda args: subprocess.run(args, capture_output=True, text=True,
                                                       timeout=60))
        print(p.stdout.splitlines()[0] if p.stdout else p.stderr)
        used = plan.get("cost", {})
        if p.returncode != 0 or any(used.get(k) != fitted[k] for k in KEYS):
            failures.append(f"weft plan did not plan with the fitted model {fitted}: {used}")

    bad = os.path.join(out, "cost.yaml")  # out is a file: no directory can be made there
    r = subprocess.run(mpirun(2, weft, "calibrate", "--out", bad, *SMALL), capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    errors = [l for l in r.stderr.splitlines() if "weft: error:" in l]
    print(f"--out under a file: exit {r.returncode}: {errors[:1]}")
    if (r.returncode == 0 or not errors or bad not in errors[0] or "calibrate: [" in r.stdout
            or not os.path.isfile(out)):
        failures.append(f"an unwritable --out did not fail before timing: exit {r.returncode}, "
                        f"{errors}, {r.stdout[:200]!r}")
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_calibrate_"))
