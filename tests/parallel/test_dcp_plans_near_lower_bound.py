"""Heterogeneous dynamic context parallelism plans each global batch within 1.10x of the
perfect-balance lower bound. On two seeded length traces (lognormal with a 32K cap, and a
chat / long-document mix with a 64K cap; tests/reference/length_traces.py), 4 steps of 4096
documents each, `weft plan --lengths` on 64 and 256 simulated ranks must report (its statistics)
every step for all three layouts (static CP, heterogeneous, uniform), every heterogeneous step must have
critical path / lower bound <= 1.10, and in the summary heterogeneous's step time must be no
worse than uniform's or static's. Planning times are printed, not checked. A trace with a
non-integer line must be rejected with a non-zero exit and `FILE:LINE:` on stderr."""
import os, subprocess, sys

from reference import length_traces
from reference.fixtures import run_test
from reference.runner import stats_of

LIMIT = 1.10
STEPS, PER_STEP = 4, 4096
RANKS = (64, 256)
TRACES = (("lognormal", length_traces.lognormal, 11), ("long_tail", length_traces.long_tail, 12))


def parse(stats):
    """From `weft plan --lengths`'s statistics: {step: {layout: [(ratio, imbalance)]}},
    {step: (documents, tokens)}, {layout: summary}."""
    steps, headers = {}, {}
    for s, st in enumerate(stats["steps"], 1):
        headers[s] = (st["documents"], st["tokens"])
        steps[s] = {name: [(st[name]["critical_path"] / st[name]["lower_bound"],
                            st[name]["max_busy"] / st[name]["mean_busy"] - 1)]
                    for name in ("static", "heterogeneous", "uniform") if name in st}
    summary = {name: dict(ratio=v["ratio"], worst=v["ratio_worst"],
                          imbalance=v["imbalance_worst"], step_time=v["step_time"],
                          exchange=v["exchange"], plan_ms=v["plan_ms_worst"])
               for name, v in stats["summary"].items()}
    return steps, headers, summary


def check(tag, lengths, stats, failures):
    steps, headers, summary = parse(stats)
    for s in range(1, STEPS + 1):
        chunk = lengths[(s - 1) * PER_STEP:s * PER_STEP]
        if headers.get(s) != (len(chunk), sum(chunk)):
            failures.append(f"{tag}: step {s} header {headers.get(s)}, expected "
                            f"({len(chunk)}, {sum(chunk)})")
        for name in ("static", "heterogeneous", "uniform"):
            got = steps.get(s, {}).get(name, [])
            if len(got) != 1:
                failures.append(f"{tag}: step {s} has {len(got)} {name} lines, expected 1")
        for ratio, _ in steps.get(s, {}).get("heterogeneous", []):
            if ratio > LIMIT:
                failures.append(f"{tag}: step {s} heterogeneous critical path is {ratio:.3f}x "
                                f"the lower bound, over {LIMIT}")
    if len(steps) != STEPS:
        failures.append(f"{tag}: {len(steps)} steps printed, expected {STEPS}")
    if sorted(summary) != ["heterogeneous", "static", "uniform"]:
        failures.append(f"{tag}: summary lines for {sorted(summary)}, expected all three layouts")
        return None
    het = summary["heterogeneous"]["step_time"]
    for name in ("uniform", "static"):
        if summary[name]["step_time"] < het:
            failures.append(f"{tag}: {name} step time {summary[name]['step_time']:.3f}x is "
                            f"better than heterogeneous's {het:.3f}x")
    worst = max((r for st in steps.values() for r, _ in st.get("heterogeneous", [])), default=0)
    return worst, summary


def bad_input(weft, tmp, failures):
    path = os.path.join(tmp, "bad.txt")
    with open(path, "w") as f:
        f.write("100\n200\n12x\n300\n")
    r = subprocess.run([weft, "plan", "--lengths", path, "--ranks", "4"], capture_output=True,
                       text=True, timeout=60)
    ok = r.returncode != 0 and f'{path}:3: "12x"' in r.stderr
    print(f"\nnon-integer line 3: exit {r.returncode}, stderr: {r.stderr.strip()!r}")
    if not ok:
        failures.append(f"bad trace: exit {r.returncode}, stderr {r.stderr.strip()!r}; expected "
                        f"non-zero exit and \"{path}:3: \"12x\"\"")


def body(weft, tmp):
    failures, rows = [], []
    for name, gen, seed in TRACES:
        lengths = gen(STEPS * PER_STEP, seed)
        path = os.path.join(tmp, f"{name}.txt")
        length_traces.write(path, lengths)
        for ranks in RANKS:
            tag = f"{name} on {ranks} ranks"
            stats, r = stats_of([weft, "plan", "--lengths", path, "--ranks", str(ranks),
                                 f"train.global_batch_size={PER_STEP}"],
                                lambda args: subprocess.run(args, capture_output=True, text=True,
                                                            timeout=600))
            if r.returncode != 0:
                print(f"FAIL {tag}: weft plan exited {r.returncode}:\n{r.stdout}{r.stderr}")
                failures.append(f"{tag}: weft plan exited {r.returncode}")
                continue
            got = check(tag, lengths, stats, failures)
            if got:
                rows.append((name, ranks, *got))
    print(f"critical path / lower bound (limit {LIMIT:.2f} on every heterogeneous step); step time "
          f"against heterogeneous; planning worst ms per {PER_STEP} documents")
    print(f"{'trace':10s} {'ranks':>5s} {'het worst':>9s} {'het':>6s} {'uniform':>7s} "
          f"{'static':>6s} {'uni time':>8s} {'st time':>7s} {'het ms':>7s} {'uni ms':>7s} "
          f"{'st ms':>6s}")
    for name, ranks, worst, s in rows:
        h, u, st = s["heterogeneous"], s["uniform"], s["static"]
        print(f"{name:10s} {ranks:5d} {worst:9.3f} {h['ratio']:6.3f} {u['ratio']:7.3f} "
              f"{st['ratio']:6.3f} {u['step_time']:8.3f} {st['step_time']:7.3f} "
              f"{h['plan_ms']:7.2f} {u['plan_ms']:7.2f} {st['plan_ms']:6.2f}")
    bad_input(weft, tmp, failures)
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_dcp_plans_", "checks failed"))
