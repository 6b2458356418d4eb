"""Launching weft under mpirun for the multi-rank tests."""
import os


def mpirun(np_, *args):
    """The command line that runs `args` on np_ ranks of this machine, one OpenMP thread each."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(np_), "-x", "OMP_NUM_THREADS=1"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + list(args)
