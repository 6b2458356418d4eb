"""Collective discipline: when one rank skips a collective, debug mode reports the divergence
(which call, which op on which rank) and the job exits non-zero within 30 s instead of hanging.
Without debug mode the mismatch or the collective timeout ends it, naming the op."""
import os, subprocess, sys, tempfile, time

from reference.fixtures import model_and_batch, run_test
from reference.mpi import mpirun

CFG = dict(vocab_size=53, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
           num_attention_heads=2, num_key_value_heads=1, rope_theta=100.0, rms_norm_eps=1e-6,
           tie_word_embeddings=True, attention_bias=True)


def launch(weft, mdir, extra_env, *options):
    args = [weft, "grad", "--model", mdir, "--batch", os.path.join(mdir, "batch.jsonl"),
            "--out", os.path.join(mdir, "out.safetensors"), "train.steps=3", *options]
    env = dict(os.environ, **extra_env)
    start = time.time()
    r = subprocess.run(mpirun(2, *args), capture_output=True, text=True, timeout=120, env=env)
    return r, time.time() - start


def body(weft, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    model_and_batch(mdir, CFG, 3, [9, 4, 12, 6], [2, 1, 3, 0], 4)
    # Rank 1 skips its third collective (call #2, the metrics all-reduce of the first gradient).
    r, took = launch(weft, mdir, {"WEFT_TEST_SKIP_COLLECTIVE": "1:2"},
                     "parallel.debug_collectives=true")
    print(f"debug mode: exit {r.returncode} after {took:.1f} s\n{r.stderr.strip()[:800]}")
    if r.returncode == 0 or took > 30:
        failures.append(f"debug mode: exit {r.returncode} after {took:.1f} s")
    for needed in ("collective sequence diverged", "rank 0: call #2 allreduce", "rank 1: call #3"):
        if needed not in r.stderr:
            failures.append(f"debug mode: report lacks {needed!r}")

    r, took = launch(weft, mdir, {"WEFT_TEST_SKIP_COLLECTIVE": "1:2"},
                     "parallel.collective_timeout=5")
    print(f"mismatched call: exit {r.returncode} after {took:.1f} s\n{r.stderr.strip()[:800]}")
    if r.returncode == 0 or took > 30:
        failures.append(f"mismatched call: exit {r.returncode} after {took:.1f} s")
    # Calls that disagree in size are an erroneous MPI program: OpenMPI may end the job itself
    # with its own words before our wait sees an error code. It must still end, fast; naming the
    # call is debug mode's job (above).

    # Rank 1 skips the job's last collective and finishes; rank 0 waits for a partner that never
    # comes, until the timeout names what it waited on.
    r, took = launch(weft, mdir, {"WEFT_TEST_SKIP_COLLECTIVE": "1:16"},
                     "parallel.collective_timeout=5")
    print(f"last call skipped: exit {r.returncode} after {took:.1f} s\n{r.stderr.strip()[:800]}")
    if r.returncode == 0 or took > 30:
        failures.append(f"last call skipped: exit {r.returncode} after {took:.1f} s")
    if "allgather #16 on group world timed out" not in r.stderr:
        failures.append("last call skipped: no timeout message naming the op and group")
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_diverged_"))
