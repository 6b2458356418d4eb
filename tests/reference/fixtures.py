"""The frame shared by the tests that run `weft grad` on a random Qwen2 and compare its output.

qwen2.py is the reference model itself (configuration, forward, gradients, AdamW), files.py writes
its model and batch files, runner.py runs weft and compare.py compares tensors; this module is the
harness around them that every such test otherwise wrote out again: finding weft, a temp dir
removed afterwards, the PASS / FAIL summary and exit status, a model with its batch file,
the `weft grad` command line, turning a failed weft run into one failure line, and the common
loss / logits / gradient comparison. What a test checks and its tolerances stay in the test.
"""

import os
import shutil
import subprocess
import tempfile

import numpy as np

from reference import files, runner
from reference.compare import compare, compare_all, identical


def run_test(body, tmp_prefix, summary="comparisons over tolerance or failed"):
    """Runs body(weft, tmp) with the weft binary (runner.weft_path) and a fresh temp dir, which is
    removed afterwards whatever happens. body returns its list of failure lines; when it is not
    empty they are printed as "FAIL: <n> <summary>:" and the result is 1, else "PASS" and 0. The
    result is the process exit status (ctest reads it), so use as sys.exit(run_test(...))."""
    weft = runner.weft_path()
    if not os.access(weft, os.X_OK):
        print(f"weft binary not found at {weft}")
        return 1
    tmp = tempfile.mkdtemp(prefix=tmp_prefix)
    try:
        failures = body(weft, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"\nFAIL: {len(failures)} {summary}:")
        for f in failures:
            print("  " + f)
        return 1
    print("\nPASS")
    return 0


def model_and_batch(mdir, cfg, seed, lengths, prompts, batch_seed, **batch_kw):
    """Writes a random model (files.make_model) into mdir and a batch of documents of `lengths`
    tokens with masked prompts of `prompts` tokens (files.make_batch) to mdir/batch.jsonl.
    Returns (full cfg, params, batch path, docs)."""
    cfg, params = files.make_model(mdir, cfg, seed=seed)
    bpath = os.path.join(mdir, "batch.jsonl")
    docs = files.make_batch(bpath, lengths, prompts, cfg["vocab_size"], batch_seed, **batch_kw)
    return cfg, params, bpath, docs


def model_variants(tmp, name, key, values, cfg, seeds, lengths, prompts):
    """For each value v of config field `key`: a model with cfg[key] = v and its batch
    (model_and_batch into tmp/<name><index>, seeds(v) giving (model seed, batch seed)). Yields
    (v, label "<name>=<v>", full cfg, params, batch path, docs)."""
    for i, v in enumerate(values):
        seed, batch_seed = seeds(v)
        mdir = os.path.join(tmp, f"{name}{i}")
        yield (v, f"{name}={v}", *model_and_batch(mdir, dict(cfg, **{key: v}), seed, lengths,
                                                  prompts, batch_seed))


def grad_args(mdir, bpath, *options):
    """The arguments of `weft grad` on the model in mdir and the batch file bpath, followed by
    `options` (flags such as --logits and key=value settings); run_weft adds --out."""
    return ["grad", "--model", mdir, "--batch", bpath, *options]


def try_grad(weft, args, tag, failures):
    """runner.run_weft(weft, args), returning (tensors, statistics). When weft fails, prints its
    command and output, appends "<tag>: weft grad failed" to failures and returns (None, None),
    so that the test goes on with its other cases."""
    try:
        return runner.run_weft(weft, args)
    except runner.WeftError as e:
        print(f"  FAIL weft grad ({tag}) failed:\n{e}")
        failures.append(f"{tag}: weft grad failed")
        return None, None


def compare_loss_and_grads(out, loss, grads, tol, logits=None, mtp_losses=None,
                           grad_scales=None):
    """Compares weft's output tensors `out` with a reference: "loss" with loss, "logits" with
    logits when given, "mtp_losses" with mtp_losses (the per-depth MTP losses, shape (D,)) when
    given, and every "grad.<name>" with grads[name] (and no extra grad.*), each to
    max|diff|/max|ref| <= tol (compare.compare; grad_scales {name: scale} passes compare's scale
    for gradients that are zero only by cancellation). Returns the names that failed."""
    bad = []
    if not compare("loss", out.get("loss"), loss, tol):
        bad.append("loss")
    if logits is not None and not compare("logits", out.get("logits"), logits, tol):
        bad.append("logits")
    if mtp_losses is not None:
        got = out.get("mtp_losses")
        if got is not None and np.shape(got) == np.shape(mtp_losses):
            print("  mtp_losses: weft " + " ".join(f"{float(x):.8f}" for x in np.ravel(got))
                  + " | reference " + " ".join(f"{float(x):.8f}" for x in np.ravel(mtp_losses)))
        if not compare("mtp_losses", got, mtp_losses, tol):
            bad.append("mtp_losses")
    bad += compare_all("grad.", out, grads, tol, scales=grad_scales)
    return bad


def outputs_identical(a, b, names):
    """compare.identical on each of `names` in weft outputs a and b (both must hold it). Returns the
    names that are missing or differ in any bit."""
    return [n for n in names if not identical(n, b.get(n), a.get(n))]


def cosine(a, b):
    """Cosine similarity of two tensors in float64 (1 for two zero tensors)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


def gpus_listed():
    """How many GPUs nvidia-smi lists (0 without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    r = subprocess.run([smi, "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return sum(line.startswith("GPU") for line in r.stdout.splitlines()) if r.returncode == 0 else 0


def cuda_weft(weft, gpus):
    """The program for device=cuda runs that need `gpus` GPUs: weft itself where nvidia-smi lists
    that many, else weft_emulated beside it (the CUDA backend executed on the CPU, NCCL's calls
    made of MPI ones), else None. Returns (program, emulated)."""
    if gpus_listed() >= gpus:
        return weft, False
    emulated = os.path.join(os.path.dirname(os.path.abspath(weft)), "weft_emulated")
    return (emulated, True) if os.path.exists(emulated) else (None, True)



def run_cuda_test(body, tmp_prefix, summary="checks failed", gpus=1):
    """run_test for a device=cuda test: body(weft, program, emulated, tmp) with the program of
    cuda_weft for device=cuda (it says which), or the skip status 77 when there is neither GPU nor
    emulator."""
    program, emulated = cuda_weft(runner.weft_path(), gpus)
    if program is None:
        print(f"fewer than {gpus} GPU(s) listed by nvidia-smi and no weft_emulated beside weft: "
              "skipped")
        return 77
    print(f"device=cuda on {'the CPU emulation (' + program + ')' if emulated else 'the GPU'}")
    return run_test(lambda weft, tmp: body(weft, program, emulated, tmp), tmp_prefix, summary)


def run_emulated_cuda_test(body, tmp_prefix, summary="checks failed"):
    """run_test for a test of the CUDA backend on its CPU emulation alone (what it checks needs
    no GPU and must run in CI): body(emulated, tmp) with weft_emulated beside weft, or the skip
    status 77 where weft was built without the CUDA toolkit."""
    emulated = os.path.join(os.path.dirname(os.path.abspath(runner.weft_path())), "weft_emulated")
    if not os.path.exists(emulated):
        print("built without CUDA (no weft_emulated beside weft): skipped")
        return 77
    return run_test(lambda weft, tmp: body(emulated, tmp), tmp_prefix, summary)


def one_clear_error(name, cmd, must_contain, wrote=lambda: False, timeout=120):
    """Runs cmd, which must fail with one clear error: a non-zero exit, one stderr line that
    starts "weft: error:" and holds every string of must_contain, and nothing written (wrote()
    false afterwards). Prints one line; returns "name: problems" or None."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    problems = ["exit status 0"] if r.returncode == 0 else []
    if len(lines) != 1 or not lines[0].startswith("weft: error:"):
        problems.append(f"stderr is not one error line: {r.stderr!r}")
    problems += [f"message lacks {s!r}" for s in must_contain if s not in r.stderr]
    if wrote():
        problems.append("output was written")
    print(f"{name}: exit {r.returncode}: {lines[0] if lines else ''}")
    return f"{name}: " + "; ".join(problems) if problems else None
