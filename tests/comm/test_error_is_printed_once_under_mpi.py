"""Under mpirun an error every rank hits is printed once, and an error of one rank alone is still
printed (issue 23, item 6). weft_fatal ends the whole job (MPI_Abort) after its message, and a
rank other than 0 waits 3 seconds before printing, so rank 0's end of the job comes first when
rank 0 fails too. Before, every rank printed the same error (4 ranks: 4 lines).

Checked: a missing data.source on 2 and 4 ranks gives exactly one "weft: error:" line and a
non-zero exit; an RL reward command that fails only on rank 1 (it exits at once there) gives one
line naming the reward command, from rank 1, and a non-zero exit.
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

from reference.mpi import mpirun
from reference.rl_loop import (make_tiny_model, rl_args, write_prompts, write_reward_script)
from reference.runner import weft_path


def errors(cmd):
    env = dict(os.environ, OMP_WAIT_POLICY="passive", OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    lines = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("weft: error:")]
    return r.returncode, lines


def main():
    weft = weft_path()
    failures = []
    with tempfile.TemporaryDirectory(prefix="weft_test_error_once_") as tmp:
        missing = os.path.join(tmp, "missing.jsonl")
        for ranks in (2, 4):
            rc, lines = errors(mpirun(ranks, weft, "train", f"data.source={missing}",
                                      f"train.output_dir={tmp}/run{ranks}"))
            print(f"{ranks} ranks, missing data: exit {rc}, {len(lines)} error line(s)")
            if rc == 0 or len(lines) != 1 or missing not in lines[0]:
                failures.append(f"{ranks} ranks: exit {rc}, error lines {lines}")

        mdir = os.path.join(tmp, "model")
        make_tiny_model(mdir)
        prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"), [9, 14, 6, 11], seed=1)
        script = write_reward_script(tmp)
        command = (f'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exit 3; fi; '
                   f'exec {shlex.quote(sys.executable)} {shlex.quote(script)}')
        rc, lines = errors(mpirun(2, weft, *rl_args(mdir, prompts, os.path.join(tmp, "rl"),
                                                    "reward.type=command",
                                                    f"reward.command={command}")))
        print(f"2 ranks, reward command failing on rank 1: exit {rc}, {len(lines)} error line(s)")
        if rc == 0 or len(lines) != 1 or "reward.command" not in lines[0]:
            failures.append(f"reward command failing on rank 1: exit {rc}, error lines {lines}")
    for f in failures:
        print("FAIL:", f)
    print(json.dumps({"failures": len(failures)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
