"""Running weft from the Python tests: where the binary is, `weft grad` with its output and its
statistics (the JSON of --stats) read back, the failure exception and its optimizer options."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from reference.files import read_safetensors

# The weft grad option that runs optimizer steps after the gradient (the interface says
# optim.steps=K).
STEPS_KEY = "train.steps"  # the one place the key is spelled


def optim_args(**opt):
    """key=value command-line options for weft's optimizer."""
    return [f"optim.{k}={v!r}" if isinstance(v, float) else f"optim.{k}={v}"
            for k, v in opt.items()]


class WeftError(RuntimeError):
    pass


def weft_path(argv=None):
    """The weft binary from --weft PATH (as ctest passes it), else $WEFT, else build/weft."""
    argv = sys.argv[1:] if argv is None else argv
    for i, a in enumerate(argv):
        if a == "--weft" and i + 1 < len(argv):
            return os.path.abspath(argv[i + 1])
        if a.startswith("--weft="):
            return os.path.abspath(a.split("=", 1)[1])
    if os.environ.get("WEFT"):
        return os.path.abspath(os.environ["WEFT"])
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(os.path.dirname(here)), "build", "weft")


def run_weft(weft, args, out=None, timeout=300):
    """Runs `weft grad ...`-style commands: `args` is the list after the binary, without --out and
    --stats, which are added here (files in a fresh temp dir unless `out` is given). Returns
    (tensors {name: numpy}, statistics {...}: the --stats JSON). Raises WeftError with the output
    when weft fails."""
    tmp = tempfile.mkdtemp(prefix="weft_out_")
    if out is None:
        out = os.path.join(tmp, "out.safetensors")
    stats = os.path.join(tmp, "stats.json")
    cmd = [weft] + list(args) + ["--out", out, "--stats", stats]
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise WeftError(f"{' '.join(cmd)}\nexit status {r.returncode}\nstdout:\n{r.stdout}"
                            f"\nstderr:\n{r.stderr}")
        if not os.path.exists(out) or not os.path.exists(stats):
            raise WeftError(f"{' '.join(cmd)}\nexit 0 but wrote no {out} or {stats}\nstdout:\n"
                            f"{r.stdout}\nstderr:\n{r.stderr}")
        with open(stats) as f:
            return read_safetensors(out), json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def stats_of(args, run):
    """Runs `run(args + ["--stats", path])`, a function that runs a weft command line, and
    returns (the parsed statistics, or {} when the run wrote none; what run returned)."""
    tmp = tempfile.mkdtemp(prefix="weft_stats_")
    path = os.path.join(tmp, "stats.json")
    try:
        result = run(list(args) + ["--stats", path])
        if not os.path.exists(path):
            return {}, result
        with open(path) as f:
            return json.load(f), result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
