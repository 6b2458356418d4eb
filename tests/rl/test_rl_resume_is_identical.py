"""weft rl resumes exactly: 6 RL steps straight (checkpoints at steps 3 and 6) versus

  (a) a run of 3 steps, then `resume=` of its directory with train.steps=6;
  (b) a run of 6 steps SIGKILLed in step 5 (its reward command pauses at step 5's first request
      and the test kills weft there: metrics.jsonl already has step 4, the newest checkpoint is
      step 3's), then `resume=` of its directory to 6;

give metrics.jsonl lines of steps 1-6 identical in every field but the timings (*_seconds,
*_per_s), and the same final checkpoint, byte for byte (model and optimizer). Each step makes 2
optimizer updates (rl.ppo_mini_batch_size=1 of 2 prompts), so AdamW's step count is not the RL
step's, and held-out evaluation runs every 3 steps. The learning rate is constant (as weft rl's
default is; a decaying schedule spans train.steps, so a 3-step run would decay faster than the
first 3 steps of a 6-step one); rewards come from a reward command (a fixed
function of the response's bytes), so advantages and updates are not 0.
"""
import hashlib
import os
import signal
import subprocess
import sys
import time

from reference import fixtures
from reference.rl_loop import (checkpoint_problem, checkpoints, command, environment,
                               kill_pid, learning_setup, metrics, reward_command, rl_args,
                               run_rl, without_timings)

P, N, EVAL = 2, 4, 2  # prompts per step, samples per prompt, held-out prompts
SETTINGS = [f"train.global_batch_size={P}", f"sampling.n={N}", "sampling.max_tokens=8",
            "rl.ppo_mini_batch_size=1", "train.save_every=3", "rl.eval_every=3",
            f"rl.eval_prompts={EVAL}", "optim.lr=1e-3", "optim.min_lr=1e-3"]
# Reward requests before step 5's first: held-out evaluations at the start and after step 3,
# and 4 steps of P x N samples.
BEFORE_STEP_5 = EVAL + 4 * P * N + EVAL


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def compare(label, ref, out, failures):
    """metrics of steps 1-6 and the final checkpoint of run `out` against the straight run's."""
    got = metrics(out)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = sum(1 for line in f if line.strip())
    if sorted(got) != list(range(1, 7)) or lines != 6:
        failures.append(f"{label}: metrics.jsonl has {lines} lines of steps {sorted(got)}, not "
                        "one of each step 1-6")
        return
    m_ref = metrics(ref)
    bad = []
    for s in range(1, 7):
        a, b = without_timings(m_ref[s]), without_timings(got[s])
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            bad.append(s)
            print(f"{label} step {s} differs in {keys}: straight "
                  f"{ {k: a.get(k) for k in keys} } resumed { {k: b.get(k) for k in keys} }")
    if bad:
        failures.append(f"{label}: metrics of steps {bad} differ from the straight run's")
    found, other = checkpoints(out)
    final = found.get(6)
    if not final or checkpoint_problem(final, 6):
        failures.append(f"{label}: no valid step-6 checkpoint: "
                        f"{checkpoint_problem(final, 6) if final else sorted(found)}")
        return
    straight = checkpoints(ref)[0][6]
    for name in ("model.safetensors", "optimizer.safetensors"):
        if digest(os.path.join(final, name)) != digest(os.path.join(straight, name)):
            failures.append(f"{label}: the step-6 {name} differs from the straight run's")
    if not bad:
        print(f"{label}: steps 1-6 identical but for timings, step-6 checkpoint byte for byte "
              f"the straight run's (leftovers in checkpoints/: {other or 'none'})")


def killed_in_step_5(weft, args, out, tmp, failures):
    """Runs weft rl (args) with a reward command that pauses at step 5's first request, kills
    weft there; returns True if the kill landed as intended."""
    marker = os.path.join(tmp, "step5.marker")
    cmd = command(weft, [*args, *reward_command(os.path.join(tmp, "reward.py"),
                                                pause_after=BEFORE_STEP_5, marker=marker)])
    with open(os.path.join(tmp, "killed.log"), "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment(1))
        deadline = time.time() + 240
        while not os.path.exists(marker) and p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        paused = os.path.exists(marker)
        p.send_signal(signal.SIGKILL)
        p.wait()
    if paused:
        with open(marker) as f:
            kill_pid(int(f.read()))  # the paused reward script, orphaned by the kill
    if not paused:
        with open(os.path.join(tmp, "killed.log")) as f:
            print(f.read())
        failures.append("kill: the reward command never reached step 5")
        return False
    done, other = checkpoints(out)
    steps = sorted(metrics(out))
    print(f"killed in step 5: metrics.jsonl has steps {steps}, checkpoints {sorted(done)}, "
          f"other entries {other}")
    if steps != [1, 2, 3, 4] or sorted(done) != [3] or checkpoint_problem(done[3], 3):
        failures.append(f"kill: expected metrics of steps 1-4 and one valid step-3 checkpoint, "
                        f"found steps {steps}, checkpoints {sorted(done)}")
        return False
    return True


def cases(weft, tmp):
    failures = []
    mdir, prompts, reward = learning_setup(tmp)
    straight, split, killed = (os.path.join(tmp, d) for d in ("straight", "split", "killed"))
    try:
        run_rl(weft, rl_args(mdir, prompts, straight, *SETTINGS, *reward, "train.steps=6"))
        m = metrics(straight)
        print("straight: rewards " + ", ".join(f"{m[s]['reward_mean']:.3f}" for s in sorted(m)) +
              "; pg_loss " + ", ".join(f"{m[s]['pg_loss']:.3g}" for s in sorted(m)))
        if any(m[s]["grad_norm"] == 0 for s in m) or "eval_accuracy" not in m.get(3, {}):
            failures.append("straight: a step made no update or step 3 has no eval_accuracy")

        run_rl(weft, rl_args(mdir, prompts, split, *SETTINGS, *reward, "train.steps=3"))
        r = run_rl(weft, rl_args(mdir, prompts, split, *SETTINGS, *reward, "train.steps=6",
                                 f"resume={split}"))
        if "resumed from" not in r.stdout or "step_00000003" not in r.stdout:
            failures.append(f"3 + 3: the second run did not resume from step 3:\n{r.stdout}")
        compare("3 steps, then resumed to 6", straight, split, failures)

        args = rl_args(mdir, prompts, killed, *SETTINGS, "train.steps=6")
        if killed_in_step_5(weft, args, killed, tmp, failures):
            r = run_rl(weft, [*args, *reward, f"resume={killed}"])
            if "resumed from" not in r.stdout or "step_00000003" not in r.stdout:
                failures.append(f"kill: the run did not resume from step 3:\n{r.stdout}")
            compare("killed in step 5, resumed to 6", straight, killed, failures)
    except RuntimeError as e:
        print(e)
        failures.append("weft rl failed")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_resume_", "checks failed"))
