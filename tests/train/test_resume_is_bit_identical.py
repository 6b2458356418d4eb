"""Resume: 20 uninterrupted steps versus a run killed after its step-10 checkpoint and resumed to
20: the losses of steps 11-20 are bit-identical. The newest checkpoint is then truncated as if a
save had been cut mid-write: resume detects it and loads the previous one."""
import json, os, shutil, signal, subprocess, sys, tempfile

from reference.runner import stats_of, weft_path

WEFT = weft_path()
COMMON = ["model.hidden_size=64", "model.intermediate_size=160", "model.num_layers=2",
          "model.num_heads=4", "model.num_kv_heads=2", "data.synthetic_documents=400",
          "train.global_batch_size=16", "train.max_tokens_per_microbatch=1024", "train.steps=20",
          "train.save_every=5", "optim.warmup_steps=3"]


def losses(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def train(run, *extra):
    """Runs weft train; returns (its statistics, the CompletedProcess)."""
    def go(args):
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"weft train failed:\n{r.stdout}\n{r.stderr}")
        return r
    return stats_of([WEFT, "train", *COMMON, f"train.output_dir={run}", *extra], go)


def main():
    tmp = tempfile.mkdtemp()
    try:
        full, cut = os.path.join(tmp, "full"), os.path.join(tmp, "cut")
        train(full)
        ref = losses(full)
        assert sorted(ref) == list(range(1, 21)), ref

        # Kill the second run mid-step 13, after its step-10 checkpoint. A one-rank job still
        # counts its collectives (4 a step: count, reduce-scatter, metrics, all-gather), so the
        # kill lands at a fixed point: call 49 is step 13's reduce-scatter.
        env = dict(os.environ, WEFT_TEST_KILL_AT_COLLECTIVE="0:49")
        p = subprocess.run([WEFT, "train", *COMMON, f"train.output_dir={cut}"],
                           capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr)
        ckpts = sorted(d for d in os.listdir(os.path.join(cut, "checkpoints")) if not d.endswith(".tmp"))
        print("checkpoints after the kill:", ckpts)
        assert ckpts == ["step_00000005", "step_00000010"], ckpts
        assert max(losses(cut)) == 12, "the run did not die in step 13"

        # Damage the newest checkpoint as a save cut mid-write would.
        newest = os.path.join(cut, "checkpoints", ckpts[-1], "model.safetensors")
        size = os.path.getsize(newest)
        with open(newest, "r+b") as f:
            f.truncate(size // 2)
        stats, r = train(cut, f"resume={cut}")
        print(r.stderr.strip())
        assert "skipping checkpoint" in r.stderr and ckpts[-1] in r.stderr, r.stderr
        expected_resume = ckpts[-2]
        assert expected_resume in (stats["resumed_from"] or "") and \
            stats["resumed_from_step"] == 5, stats

        got = losses(cut)
        assert sorted(got) == list(range(1, 21)), sorted(got)
        bad = [s for s in range(11, 21) if got[s] != ref[s]]
        for s in range(11, 21):
            print(f"step {s}: uninterrupted {ref[s]!r} resumed {got[s]!r}")
        if bad:
            sys.exit(f"FAIL: steps {bad} differ after resume")
        print("ok: steps 11-20 bit-identical after kill, damaged checkpoint skipped, resume")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
