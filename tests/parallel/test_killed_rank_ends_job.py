"""A rank killed mid-step: the data-parallel job exits non-zero within 60 s with a message naming
the lost rank, and its last checkpoint still loads (training resumes from it to the end)."""
import os, re, subprocess, sys, time

from reference.fixtures import run_test
from reference.mpi import mpirun
from reference.runner import stats_of

TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "train.global_batch_size=8",
        "data.synthetic_documents=64", "train.steps=8", "train.save_every=2",
        "parallel.collective_timeout=20"]


def body(weft, tmp):
    failures = []
    run = os.path.join(tmp, "run")
    # With the distributed optimizer a step issues 4 collectives (count, reduce-scatter, metrics,
    # parameter all-gather) and a checkpoint 2 (the moments); call #11 is step 3's reduce-scatter,
    # after the step-2 checkpoint.
    env = dict(os.environ, WEFT_TEST_KILL_AT_COLLECTIVE="1:11")
    start = time.time()
    r = subprocess.run(mpirun(2, weft, "train", *TINY, f"train.output_dir={run}"),
                       capture_output=True, text=True, timeout=120, env=env)
    took = time.time() - start
    out = r.stdout + r.stderr
    print(f"killed run: exit {r.returncode} after {took:.1f} s")
    print("\n".join(l for l in out.splitlines() if re.search(r"rank|signal|error", l))[:1500])
    if r.returncode == 0 or took > 60:
        failures.append(f"killed run: exit {r.returncode} after {took:.1f} s")
    if not re.search(r"rank 1\b.*(exited on signal 9|Killed|died)", out):
        failures.append("no message names rank 1 as the lost rank")
    ckpts = sorted(os.listdir(os.path.join(run, "checkpoints")))
    print("checkpoints:", ckpts)
    if "step_00000002" not in ckpts or any(c > "step_00000002" for c in ckpts if not c.endswith(".tmp")):
        failures.append(f"unexpected checkpoints after the kill: {ckpts}")

    stats, r = stats_of(mpirun(2, weft, "train", *TINY, f"train.output_dir={run}", f"resume={run}"),
                        lambda args: subprocess.run(args, capture_output=True, text=True,
                                                    timeout=300))
    print(r.stdout[-600:])
    steps = [stats.get(k) for k in ("resumed_from_step", "first_step", "last_step")]
    if r.returncode != 0 or steps != [2, 3, 8]:
        failures.append(f"resume from the last checkpoint failed ({steps}): {r.stderr[-500:]}")
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_killed_rank_"))
