"""Running weft from the Python tests: where the binary is, `weft grad` with its output read back,
the failure exception, the `memory:` line of its stdout and its optimizer options."""

import os
import re
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


MEMORY_RE = re.compile(r"^memory: parameters=(\d+) gradients=(\d+) optimizer_state=(\d+) "
                       r"peak_activations=(\d+)\s*$", re.M)


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
    """Runs `weft grad ...`-style commands: `args` is the list after the binary, without --out,
    which is added here (a file in a fresh temp dir unless `out` is given). Returns
    (tensors {name: numpy}, stdout). Raises WeftError with the output when weft fails."""
    tmp = None
    if out is None:
        tmp = tempfile.mkdtemp(prefix="weft_out_")
        out = os.path.join(tmp, "out.safetensors")
    cmd = [weft] + list(args) + ["--out", out]
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise WeftError(f"{' '.join(cmd)}\nexit status {r.returncode}\nstdout:\n{r.stdout}"
                            f"\nstderr:\n{r.stderr}")
        if not os.path.exists(out):
            raise WeftError(f"{' '.join(cmd)}\nexit 0 but wrote no {out}\nstdout:\n{r.stdout}"
                            f"\nstderr:\n{r.stderr}")
        return read_safetensors(out), r.stdout
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def parse_memory(stdout):
    """The `memory:` line of weft grad's stdout as a dict of ints, or None."""
    m = MEMORY_RE.search(stdout)
    if not m:
        return None
    return dict(zip(("parameters", "gradients", "optimizer_state", "peak_activations"),
                    (int(x) for x in m.groups())))
