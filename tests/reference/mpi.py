"""Launching weft under mpirun for the multi-rank tests and benchmarks."""
import os
import subprocess


def mpirun(np_, *args, threads=1):
    """The command line that runs `args` on np_ ranks of this machine, `threads` OpenMP threads
    each."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(np_), "-x", f"OMP_NUM_THREADS={threads}"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + list(args)


def run_ranks(ranks, args, threads=1, timeout=300):
    """Runs the command `args` on `ranks` ranks (plainly when 1, else under mpirun) with `threads`
    OpenMP threads each, and returns its CompletedProcess (text stdout/stderr). A failure raises
    RuntimeError carrying the command and its output."""
    cmd = mpirun(ranks, *args, threads=threads) if ranks > 1 else list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    return r
