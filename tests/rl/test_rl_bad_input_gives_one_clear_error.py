"""Bad input to `weft rl`: each case ends with one "weft: error:" line naming the input (the
prompt's FILE:LINE, the setting, the command) and a non-zero exit.

Settings and prompts that cannot work are refused before anything is written (no output
directory): sampling.n=1 with rl.adv_estimator=grpo and rl.norm_adv_by_std=true;
rl.ppo_mini_batch_size not dividing train.global_batch_size; rl.rollout_ranks leaving no rank
to train (1 of 1); rl.one_step_off_policy without rollout ranks; rl.policy_loss=geo_mean with
rl.tis_imp_ratio_cap; a prompt longer than the model's
context (max_position_embeddings), and one that fits alone but not with sampling.max_tokens. Not
refused: an rl.ppo_mini_batch_size of at least the step's prompts (the job's default of 16 with 4
prompts a step), which runs as one update of the whole step, metrics for metrics as 0 does.

Failures that only show mid-run happen after checkpoints were saved (train.save_every=1), and
leave every published checkpoint intact (trainer_state.json there and every file it records of its
recorded size and hash), nothing half-written in checkpoints/ (no step_N.tmp), metrics.jsonl
ending at the newest checkpoint's step, and a run that resumes from it: a reward command that
crashes (exits 3 in step 3), hangs (sleeps past reward.timeout in step 3; it must not outlive
weft), or answers garbage (a line that is not JSON; {"reward": "high"}; {"score": 1}) in step 3;
a command that cannot be started; exact_match on a prompt file with a row without "answer"
(which weft reports when it first scores that row: here in step 4).
"""
import os
import subprocess
import sys
import tempfile

from reference import fixtures
from reference.rl_loop import (checkpoint_problem, checkpoints, command, environment, kill_pid,
                               make_tiny_model, metrics, reward_command, rl_args, run_rl,
                               wait_gone, without_timings, write_prompts, write_reward_script)

P, N = 2, 2  # prompts per step, samples per prompt: P x N reward requests a step
MID_RUN = ["train.steps=5", f"train.global_batch_size={P}", f"sampling.n={N}",
           "train.save_every=1"]
FAILING_STEP = 3


def one_clear_error(name, args, must_contain, failures, allow=lambda line: False, timeout=120):
    """Runs weft (args) and checks one clear error: non-zero exit, exactly one stderr line that
    starts "weft: error:" and holds every string of must_contain, no other stderr line except
    those allow() accepts (the reward command's own messages). Returns the CompletedProcess."""
    # Output to files, not pipes: a reward command left running after weft exits would hold a
    # pipe open and stall the test instead of being reported.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        r = subprocess.run(command(WEFT, args), stdout=out, stderr=err, text=True,
                           timeout=timeout, env=environment(1))
        out.seek(0), err.seek(0)
        r.stdout, r.stderr = out.read(), err.read()
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("weft: error:")]
    problems = ["exit status 0"] if r.returncode == 0 else []
    if len(errors) != 1 or any(l not in errors and not allow(l) for l in lines):
        problems.append(f"stderr is not one error line: {r.stderr!r}")
    problems += [f"message lacks {s!r}" for s in must_contain if s not in r.stderr]
    print(f"{name}: exit {r.returncode}: {errors[0] if errors else r.stderr.strip()}")
    if problems:
        failures.append(f"{name}: " + "; ".join(problems))
    return r


def nothing_written(name, out, failures):
    if os.path.exists(out):
        failures.append(f"{name}: {out} was created: {sorted(os.listdir(out))}")


def intact(name, out, failures, newest=None):
    """Every published checkpoint under out is complete, nothing else is in checkpoints/,
    metrics.jsonl ends at the newest checkpoint's step (== newest when given). Returns the newest
    step (0: none)."""
    found, other = checkpoints(out)
    for step, d in sorted(found.items()):
        problem = checkpoint_problem(d, step)
        if problem:
            failures.append(f"{name}: checkpoint {os.path.basename(d)} is damaged: {problem}")
    if other:
        failures.append(f"{name}: checkpoints/ holds leftovers {other}")
    last = max(found, default=0)
    steps = sorted(metrics(out)) if os.path.exists(os.path.join(out, "metrics.jsonl")) else []
    print(f"  {name}: checkpoints {sorted(found)}, metrics of steps {steps}")
    if newest is not None and last != newest:
        failures.append(f"{name}: newest checkpoint is step {last}, expected {newest}")
    if steps != list(range(1, last + 1)):
        failures.append(f"{name}: metrics.jsonl has steps {steps}; the newest checkpoint is "
                        f"step {last}")
    return last


def resumes(name, args, out, last, failures):
    """The run resumes from its newest checkpoint with good settings and finishes."""
    try:
        r = run_rl(WEFT, [*args, f"resume={out}"])
    except RuntimeError as e:
        print(e)
        failures.append(f"{name}: resuming from the last good checkpoint failed")
        return
    if f"step_{last:08d}" not in r.stdout or sorted(metrics(out)) != [1, 2, 3, 4, 5]:
        failures.append(f"{name}: the resumed run did not continue from step {last} to 5:\n"
                        f"{r.stdout}")


def refused_up_front(tmp, mdir, prompts, failures):
    out = os.path.join(tmp, "never")
    for name, extra, words in [
            ("sampling.n=1 with GRPO's std normalization",
             ["sampling.n=1", "rl.adv_estimator=grpo", "rl.norm_adv_by_std=true"],
             ["sampling.n=1", "rl.adv_estimator=grpo", "rl.norm_adv_by_std=true"]),
            ("ppo_mini_batch_size not dividing the batch",
             ["train.global_batch_size=4", "rl.ppo_mini_batch_size=3"],
             ["rl.ppo_mini_batch_size=3", "train.global_batch_size=4"]),
            ("every rank given to generation", ["rl.rollout_ranks=1"],
             ["rl.rollout_ranks=1", "no rank to train"]),
            ("one step off policy without rollout ranks", ["rl.one_step_off_policy=true"],
             ["rl.one_step_off_policy=true", "rl.rollout_ranks"]),
            ("GMPO with truncated importance sampling",
             ["rl.policy_loss=geo_mean", "rl.tis_imp_ratio_cap=2"],
             ["rl.policy_loss=geo_mean", "rl.tis_imp_ratio_cap=2"])]:
        one_clear_error(name, rl_args(mdir, prompts, out, *extra), words, failures)
        nothing_written(name, out, failures)

    runs = {}
    for mbs in (0, 16):
        o = os.path.join(tmp, f"mini_batch_{mbs}")
        r = run_rl(WEFT, rl_args(mdir, prompts, o, f"rl.ppo_mini_batch_size={mbs}"), check=False)
        runs[mbs] = ({k: without_timings(v) for k, v in metrics(o).items()}
                     if r.returncode == 0 else r.stderr.strip())
    print(f"rl.ppo_mini_batch_size=16 with 4 prompts a step: "
          f"{'the whole step, as 0' if runs[16] == runs[0] else runs[16]}")
    if runs[16] != runs[0]:
        failures.append(f"rl.ppo_mini_batch_size=16 of 4 prompts: {runs[16]} vs 0's {runs[0]}")

    short = os.path.join(tmp, "short_context")
    make_tiny_model(short, seed=2, max_position_embeddings=32)
    long_prompt = write_prompts(os.path.join(tmp, "long.jsonl"), [5, 40, 6, 7], seed=3)
    one_clear_error("a prompt longer than the context",
                    rl_args(short, long_prompt, out, "sampling.max_tokens=4"),
                    [f"{long_prompt}:2", "40 tokens", "context (32)"], failures)
    nothing_written("a prompt longer than the context", out, failures)
    tight = write_prompts(os.path.join(tmp, "tight.jsonl"), [5, 6, 28, 7], seed=4)
    one_clear_error("a prompt that fits only without sampling.max_tokens",
                    rl_args(short, tight, out, "sampling.max_tokens=8"),
                    [f"{tight}:3", "sampling.max_tokens=8", "context (32)"], failures)
    nothing_written("a prompt that fits only without sampling.max_tokens", out, failures)


def reward_command_failures(tmp, mdir, prompts, script, failures):
    after = (FAILING_STEP - 1) * P * N  # answers given before step 3's first request
    for name, opts, settings, words in [
            ("reward command crashes in step 3", dict(crash_after=after), [],
             ["reward.command", script, "exited with status 3", f"{prompts}:"]),
            ("reward command hangs in step 3", dict(hang_after=after), ["reward.timeout=1"],
             ["reward.command", script, "no answer in time", "reward.timeout=1", f"{prompts}:"]),
            ("reward command answers a line that is not JSON", dict(garbage_after=after), [],
             ["reward.command", script, '"not json"', f"{prompts}:"]),
            ("reward command answers a non-number reward",
             dict(garbage_after=after, garbage='{"reward":"high"}'), [],
             ["reward.command", script, '{"reward":"high"}', f"{prompts}:"]),
            ("reward command answers without a reward",
             dict(garbage_after=after, garbage='{"score":1}'), [],
             ["reward.command", script, '{"score":1}', f"{prompts}:"])]:
        out = os.path.join(tmp, name.replace(" ", "_"))
        pid_file = os.path.join(tmp, "reward.pid")
        if os.path.exists(pid_file):
            os.remove(pid_file)
        cmd = reward_command(script, pid=pid_file, **opts)
        args = rl_args(mdir, prompts, out, *MID_RUN, *settings)
        one_clear_error(name, [*args, *cmd], words, failures)
        if os.path.exists(pid_file):
            with open(pid_file) as f:
                pid = int(f.read())
            if not wait_gone(pid, 2.0):
                failures.append(f"{name}: the reward command (pid {pid}) is still running after "
                                "weft exited")
                kill_pid(pid)
        else:
            failures.append(f"{name}: the reward command never started")
        last = intact(name, out, failures, newest=FAILING_STEP - 1)
        if opts.get("crash_after") is not None:
            resumes(name, [*args, *reward_command(script)], out, last, failures)

    # Two processes of the command: one's malformed first answer ends both, and the job.
    out, pids = os.path.join(tmp, "two_processes"), os.path.join(tmp, "two.pids")
    one_clear_error("reward.processes=2, a malformed answer",
                    [*rl_args(mdir, prompts, out, *MID_RUN, "reward.processes=2"),
                     *reward_command(script, pids=pids, garbage_after=0)],
                    ["reward.command", script, '"not json"', f"{prompts}:"], failures)
    with open(pids) as f:
        for pid in set(map(int, f.read().split())):
            if not wait_gone(pid, 2.0):
                failures.append(f"reward.processes=2: process {pid} still runs after weft exited")
                kill_pid(pid)
    one_clear_error("reward.processes=0", [*rl_args(mdir, prompts, out, "reward.processes=0"),
                                           *reward_command(script)],
                    ["reward.processes=0"], failures)

    out = os.path.join(tmp, "no_command")
    missing = os.path.join(tmp, "no-such-reward-command")
    one_clear_error("a reward command that cannot be started",
                    rl_args(mdir, prompts, out, *MID_RUN, "reward.type=command",
                            f"reward.command={missing}"),
                    ["reward.command", missing], failures,
                    allow=lambda line: "not found" in line and missing in line)
    intact("a reward command that cannot be started", out, failures, newest=0)


def missing_answer(tmp, mdir, failures):
    """exact_match on a file whose first row has no "answer". weft finds it when the row is first
    scored (with this seed's data order, in step 4, after 3 checkpoints), not before the run
    starts; the test requires the error and intact checkpoints, whenever it comes."""
    name = "exact_match on a row without an answer"
    prompts = write_prompts(os.path.join(tmp, "no_answer.jsonl"), [5, 6, 7, 8, 9, 10, 11, 12],
                            seed=6, drop_answer=(0,))
    out = os.path.join(tmp, "no_answer")
    one_clear_error(name, rl_args(mdir, prompts, out, *MID_RUN, "reward.type=exact_match"),
                    [f"{prompts}:1:", '"answer"', "exact_match"], failures)
    last = intact(name, out, failures)
    print(f"  {name}: reported after {last} checkpointed step(s)")


def cases(weft, tmp):
    global WEFT
    WEFT = weft
    failures = []
    mdir, prompts = os.path.join(tmp, "model"), os.path.join(tmp, "prompts.jsonl")
    make_tiny_model(mdir, seed=1)
    write_prompts(prompts, [5, 9, 13, 4, 7, 11], seed=2)
    script = write_reward_script(tmp)
    refused_up_front(tmp, mdir, prompts, failures)
    reward_command_failures(tmp, mdir, prompts, script, failures)
    missing_answer(tmp, mdir, failures)
    return failures


WEFT = None

if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_bad_input_", "cases failed"))
