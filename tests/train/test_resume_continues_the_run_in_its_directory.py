"""resume=RUN continues RUN in place, with RUN's own saved settings (issue 23, item 2):

- a run of a non-default model in A is resumed with only `resume=A train.steps=5`, from a working
  directory where ./runs/default holds another run: the job rebuilds A's model from A's
  config.yaml (not the defaults, whose shape would not match the checkpoint), appends steps 4-5
  to A's metrics.jsonl and checkpoints, and leaves ./runs/default untouched;
- the same through one of A's checkpoint directories (resume=A/checkpoints/step_N);
- resuming a finished run says so and changes nothing;
- resume=A with train.output_dir=B is one clear error that creates nothing."""
import json, os, shutil, subprocess, sys, tempfile

from reference.runner import weft_path

WEFT = weft_path()
SHAPE = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
         "model.num_heads=2", "model.num_kv_heads=1", "data.synthetic_documents=64",
         "train.global_batch_size=8", "train.max_tokens_per_microbatch=512"]


def weft(cwd, *args, ok=True):
    r = subprocess.run([WEFT, "train", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    if ok and r.returncode != 0:
        sys.exit(f"weft train {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r


def steps(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


def stats(path):
    with open(path) as f:
        return json.load(f)


def main():
    tmp = tempfile.mkdtemp()
    try:
        run, other = os.path.join(tmp, "A"), os.path.join(tmp, "runs", "default")
        weft(tmp, *SHAPE, "train.steps=3", "train.output_dir=runs/default")
        other_metrics = open(os.path.join(other, "metrics.jsonl")).read()
        weft(tmp, *SHAPE, "train.steps=3", "train.save_every=3", f"train.output_dir={run}")

        st = os.path.join(tmp, "resume.json")
        weft(tmp, "resume=A", "train.steps=5", "--stats", st)
        s = stats(st)
        assert s["resumed_from_step"] == 3 and s["last_step"] == 5, s
        assert steps(run) == [1, 2, 3, 4, 5], steps(run)
        ckpts = sorted(os.listdir(os.path.join(run, "checkpoints")))
        assert ckpts == ["step_00000003", "step_00000005"], ckpts
        saved = open(os.path.join(run, "config.yaml")).read()
        assert "model.hidden_size: 32\n" in saved and "train.steps: 5\n" in saved, saved
        assert open(os.path.join(other, "metrics.jsonl")).read() == other_metrics, \
            "resume wrote into ./runs/default"
        print("resume=A train.steps=5: steps 4-5 appended in A with A's model; runs/default untouched")

        ckpt = os.path.join(run, "checkpoints", "step_00000005")
        weft(tmp, f"resume={ckpt}", "train.steps=6", "--stats", st)
        assert stats(st)["resumed_from_step"] == 5 and steps(run) == list(range(1, 7)), steps(run)
        print("resume=A/checkpoints/step_5 train.steps=6: continued in A")

        before = (open(os.path.join(run, "metrics.jsonl")).read(), sorted(os.listdir(os.path.join(run, "checkpoints"))))
        r = weft(tmp, "resume=A")
        assert "already at step 6 of 6" in r.stdout and "raise train.steps" in r.stdout, r.stdout
        after = (open(os.path.join(run, "metrics.jsonl")).read(), sorted(os.listdir(os.path.join(run, "checkpoints"))))
        assert before == after, "resuming a finished run changed it"
        print("resume of a finished run:", r.stdout.strip().splitlines()[-1])

        r = weft(tmp, "resume=A", "train.steps=8", "train.output_dir=B", ok=False)
        errors = [l for l in r.stderr.splitlines() if "error" in l]
        assert r.returncode != 0 and len(errors) == 1 and "train.output_dir=B" in errors[0], r.stderr
        assert not os.path.exists(os.path.join(tmp, "B")), "B was created"
        print("resume=A train.output_dir=B:", errors[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
