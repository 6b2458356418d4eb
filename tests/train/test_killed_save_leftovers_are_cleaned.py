"""What killed checkpoint saves leave behind never reaches a resumed run's checkpoints: a
half-written step_N.tmp (with a model.safetensors.tmp.PID file) is not published, an old
checkpoint moved aside to step_N.old by a save killed before the new one was in place is what
resume finds, and once a new checkpoint is published no .tmp or .old directory is left."""
import os, shutil, subprocess, sys, tempfile

from reference.runner import weft_path

WEFT = weft_path()
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "train.global_batch_size=4",
        "data.synthetic_documents=16", "train.save_every=1"]


def train(run, steps, resume=False):
    args = [WEFT, "train", *TINY, f"train.steps={steps}", f"train.output_dir={run}"]
    r = subprocess.run(args + ([f"resume={run}"] if resume else []), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def main():
    tmp = tempfile.mkdtemp()
    failures = []
    try:
        run = os.path.join(tmp, "run")
        train(run, 2)
        ck = os.path.join(run, "checkpoints")
        # A save of step 2 killed between moving the old checkpoint aside and publishing the new
        # one; a killed save of step 3 with a partial file; a stale .tmp of another step.
        os.rename(os.path.join(ck, "step_00000002"), os.path.join(ck, "step_00000002.old"))
        os.makedirs(os.path.join(ck, "step_00000003.tmp"))
        with open(os.path.join(ck, "step_00000003.tmp", "model.safetensors.tmp.12345"), "w") as f:
            f.write("half written")
        os.makedirs(os.path.join(ck, "step_00000009.tmp"))
        out = train(run, 3, resume=True)
        if "resumed from" not in out or "step_00000002.old" not in out:
            failures.append(f"resume did not find the moved-aside step 2: {out[-300:]}")
        # step_00000002.old, resumed from, goes too once step 3 (newer) is published.
        want = ["step_00000001", "step_00000003"]
        left = sorted(os.listdir(ck))
        if left != want:
            failures.append(f"checkpoints/ holds {left}, not {want}")
        inside = os.listdir(os.path.join(ck, "step_00000003"))
        if any(".tmp" in f for f in inside):
            failures.append(f"step 3 holds leftovers: {inside}")
        # Re-saving an existing step (resume at 3 with 3 steps) replaces it and leaves no .old.
        train(run, 3, resume=True)
        if sorted(os.listdir(ck)) != want:
            failures.append(f"after re-saving step 3: {sorted(os.listdir(ck))}")
    finally:
        shutil.rmtree(tmp)
    if failures:
        sys.exit("FAIL:\n" + "\n".join(failures))
    print("ok: leftovers of killed saves are never published and are cleaned")


if __name__ == "__main__":
    main()
