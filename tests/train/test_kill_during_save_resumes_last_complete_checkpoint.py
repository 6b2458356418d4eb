"""Kill during save: a job that saves a checkpoint after every step is killed with SIGKILL at a
uniformly random moment after its first checkpoint, again and again (a fresh run each time), until
20 kills have landed inside a save. A kill is inside a save when it left the save's step_N.tmp
directory behind (a kill after the rename that publishes step N, while older leftovers are
removed, is counted outside: the count of kills inside is a lower bound). After every kill:

  - every checkpoint the killed run published (step_N) is byte for byte the uninterrupted run's
    step_N, whose files parse and match their recorded sizes and hashes: never a half-written one;
  - the newest one is the last save the killed run completed: the step of its last metrics line,
    or the step before when that step's save was cut;
  - resume= starts from exactly that checkpoint (its --stats), warns about nothing, and runs to the
    end with every loss and every final checkpoint file bit-identical to the uninterrupted run's.

The delays are drawn from a seeded generator (--seed N replays them; where a kill lands still
depends on the machine's timing), uniformly over the window from the first checkpoint to the end
of the quickest run seen so far (the uninterrupted one, or a later one that finished before its
kill: a loaded machine that gets faster would otherwise let most runs end first). The last lines are a JSON summary (kills, kills_inside_save,
clean_resumes, seed, ...) and ok or FAIL."""
import json, os, random, re, shutil, signal, subprocess, sys, tempfile, time

from reference.files import read_safetensors
from reference.runner import weft_path

WEFT = weft_path()
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "train.global_batch_size=4",
        "data.synthetic_documents=16", "train.save_every=1"]
STEPS = 16
FILES = ["config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"]
WANT_INSIDE = 20     # kills inside a save the test needs
MAX_ATTEMPTS = 150   # killed runs and runs that finished before their kill, together
STEP_DIR = re.compile(r"step_(\d{8})(\.old)?$")


def seed_arg():
    for i, a in enumerate(sys.argv):
        if a == "--seed" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
        if a.startswith("--seed="):
            return int(a.split("=", 1)[1])
    return random.SystemRandom().randrange(2**32)


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def check_complete(d, step):
    """None if the checkpoint directory d is a complete checkpoint of `step`, else the problem:
    trainer_state.json parses and names the step, every file has its recorded size and hash, the
    safetensors files and config.json parse."""
    try:
        with open(os.path.join(d, "trainer_state.json")) as f:
            state = json.load(f)
        if state.get("step") != step:
            return f"trainer_state.json says step {state.get('step')}, not {step}"
        for name in FILES[:3]:
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            want = state["files"][name]
            if len(data) != want["bytes"] or f"{fnv1a64(data):016x}" != want["fnv1a64"]:
                return f"{name}: {len(data)} bytes, not the {want['bytes']} recorded (or its hash)"
        read_safetensors(os.path.join(d, "model.safetensors"))
        read_safetensors(os.path.join(d, "optimizer.safetensors"))
        with open(os.path.join(d, "config.json")) as f:
            json.load(f)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def read_dir(d):
    out = {}
    for name in FILES:
        try:
            with open(os.path.join(d, name), "rb") as f:
                out[name] = f.read()
        except OSError:
            out[name] = None
    return out


def metrics(run):
    """{step: loss} of metrics.jsonl's complete lines."""
    out = {}
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            text = f.read()
    except FileNotFoundError:
        return out
    for line in text.split("\n")[:-1]:  # the part after the last newline is not a whole line
        r = json.loads(line)
        out[r["step"]] = r["loss"]
    return out


def start(run, *extra, log):
    return subprocess.Popen([WEFT, "train", *TINY, f"train.steps={STEPS}",
                             f"train.output_dir={run}", *extra],
                            stdout=subprocess.DEVNULL, stderr=log)


def wait_first_checkpoint(p, run):
    first = os.path.join(run, "checkpoints", "step_00000001")
    while not os.path.isdir(first):
        if p.poll() is not None:
            return False
        time.sleep(0.0005)
    return True


def tmp_stage(d):
    """What a cut save's step_N.tmp holds, in the order the save writes it: e.g.
    "optimizer+config+model.tmp" (model.safetensors written but not yet renamed into place)."""
    order = ["optimizer", "config", "model", "trainer_state"]  # as weft_checkpoint_save writes
    names = sorted(os.listdir(d), key=lambda n: ([i for i, f in enumerate(order)
                                                  if n.startswith(f)] or [9], n))
    short = [re.sub(r"\.(json|safetensors)", "", re.sub(r"\.tmp\.\d+$", ".tmp", n)) for n in names]
    return "+".join(short) or "empty"


def main():
    seed = seed_arg()
    rng = random.Random(seed)
    print(f"seed {seed} (--seed {seed} replays the delays)")
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="weft_killsave_")
    failures = []
    summary = {"kills": 0, "kills_inside_save": 0, "kills_outside_save": 0,
               "finished_before_kill": 0, "clean_resumes": 0, "seed": seed, "steps": STEPS}
    stages = {}
    try:
        # The uninterrupted run: its checkpoints (one a step) and losses are what every resumed
        # run must reproduce; the time from its first checkpoint to its end is the kill window.
        ref = os.path.join(tmp, "ref")
        with open(os.path.join(tmp, "ref.log"), "w") as log:
            p = start(ref, log=log)
            assert wait_first_checkpoint(p, ref), "the uninterrupted run ended without a checkpoint"
            t_first = time.monotonic()
            assert p.wait(timeout=120) == 0, open(os.path.join(tmp, "ref.log")).read()
            window = time.monotonic() - t_first
        ref_losses = metrics(ref)
        assert sorted(ref_losses) == list(range(1, STEPS + 1)), sorted(ref_losses)
        ref_ck = {}
        for s in range(1, STEPS + 1):
            d = os.path.join(ref, "checkpoints", f"step_{s:08d}")
            problem = check_complete(d, s)
            assert problem is None, f"the uninterrupted run's {d}: {problem}"
            ref_ck[s] = read_dir(d)
        summary["kill_window_s"] = round(window, 3)

        attempt = 0
        while summary["kills_inside_save"] < WANT_INSIDE and attempt < MAX_ATTEMPTS:
            attempt += 1
            run = os.path.join(tmp, f"run{attempt}")
            log_path = os.path.join(tmp, f"run{attempt}.log")
            delay = rng.uniform(0, window)
            with open(log_path, "w") as log:
                p = start(run, log=log)
                if not wait_first_checkpoint(p, run):
                    failures.append(f"attempt {attempt}: the run ended before its first checkpoint")
                    continue
                t_first = time.monotonic()
                time.sleep(delay)
                p.send_signal(signal.SIGKILL)  # a no-op if it has already exited
                rc = p.wait(timeout=120)
            if rc == 0:
                # The machine got faster than when the window was measured: the window follows
                # the quickest run seen, so later delays land inside the run again.
                summary["finished_before_kill"] += 1
                window = min(window, max(0.01, time.monotonic() - t_first))
                shutil.rmtree(run)
                continue
            where = f"kill {summary['kills'] + 1} (attempt {attempt}, {delay * 1e3:.1f} ms)"
            if rc != -signal.SIGKILL:
                failures.append(f"{where}: exit status {rc}: {open(log_path).read()[-500:]}")
                continue
            summary["kills"] += 1

            # What the kill left: published checkpoints, the cut save's .tmp, the last metrics.
            ck = os.path.join(run, "checkpoints")
            names = sorted(os.listdir(ck))
            tmps = [n for n in names if n.endswith(".tmp")]
            published = {}
            for n in names:
                m = STEP_DIR.match(n)
                if m:
                    published[n] = int(m.group(1))
                elif n not in tmps:
                    failures.append(f"{where}: unexpected {n} in checkpoints/")
            last = max(metrics(run) or [0])
            inside = bool(tmps) or any(n.endswith(".old") for n in names)
            summary["kills_inside_save" if inside else "kills_outside_save"] += 1
            if tmps:
                stage = tmp_stage(os.path.join(ck, tmps[0]))
                stages[stage] = stages.get(stage, 0) + 1
                if tmps != [f"step_{last:08d}.tmp"]:
                    failures.append(f"{where}: {tmps} left, but the run's last step was {last}")

            # Every published checkpoint is the uninterrupted run's, whole.
            for n, s in sorted(published.items()):
                if s not in ref_ck or read_dir(os.path.join(ck, n)) != ref_ck[s]:
                    problem = check_complete(os.path.join(ck, n), s)
                    failures.append(f"{where}: published {n} is "
                                    + (f"half-written: {problem}" if problem else
                                       "complete but differs from the uninterrupted run's"))
            steps = sorted(set(published.values()))
            newest = steps[-1] if steps else 0
            if steps != list(range(1, newest + 1)) or newest not in (last - 1, last):
                failures.append(f"{where}: published {sorted(published)} after a run whose last "
                                f"step was {last}: want steps 1..{last - 1} or 1..{last}")
                continue
            if any(n.endswith(".old") for n in published):
                failures.append(f"{where}: {sorted(published)}: a .old copy in a run that never "
                                f"re-saved a step")
                continue
            expect = os.path.join(ck, f"step_{newest:08d}")

            # Resume: from exactly that checkpoint, to the end, bit-identical.
            stats_path = os.path.join(tmp, f"stats{attempt}.json")
            with open(log_path, "w") as log:
                p = start(run, f"resume={run}", "--stats", stats_path, log=log)
                rc = p.wait(timeout=120)
            err = open(log_path).read()
            if rc != 0:
                failures.append(f"{where}: resume failed (exit {rc}): {err[-500:]}")
                continue
            with open(stats_path) as f:
                stats = json.load(f)
            got_from = os.path.normpath(stats.get("resumed_from") or "")
            bad = []
            if got_from != expect or stats.get("resumed_from_step") != newest:
                bad.append(f"resumed from {got_from} at step {stats.get('resumed_from_step')}, "
                           f"not {expect}")
            if "skipping checkpoint" in err:
                bad.append(f"resume skipped a checkpoint: {err[-300:]}")
            losses = metrics(run)
            if losses != ref_losses:
                diff = [s for s in range(1, STEPS + 1) if losses.get(s) != ref_losses[s]]
                bad.append(f"losses of steps {diff} differ from the uninterrupted run's")
            final = sorted(os.listdir(ck))
            if final != [f"step_{s:08d}" for s in range(1, STEPS + 1)]:
                bad.append(f"checkpoints/ holds {final} at the end")
            else:
                diff = [s for s in range(newest + 1, STEPS + 1)
                        if read_dir(os.path.join(ck, f"step_{s:08d}")) != ref_ck[s]]
                if diff:
                    bad.append(f"checkpoints of steps {diff} differ from the uninterrupted run's")
            if bad:
                failures.append(f"{where}: " + "; ".join(bad))
            else:
                summary["clean_resumes"] += 1
            shutil.rmtree(run)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    summary["save_stages_cut"] = dict(sorted(stages.items(), key=lambda kv: -kv[1]))
    summary["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(summary))
    if summary["kills_inside_save"] < WANT_INSIDE:
        failures.append(f"only {summary['kills_inside_save']} of {summary['kills']} kills landed "
                        f"inside a save in {MAX_ATTEMPTS} attempts; {WANT_INSIDE} are needed")
    if summary["clean_resumes"] != summary["kills"]:
        failures.append(f"{summary['clean_resumes']} clean resumes after {summary['kills']} kills")
    if failures:
        sys.exit(f"FAIL (seed {seed}):\n" + "\n".join(dict.fromkeys(failures)))
    print(f"ok: {summary['kills']} random kills ({summary['kills_inside_save']} inside a save), "
          f"{summary['clean_resumes']} clean resumes from the last complete checkpoint")


if __name__ == "__main__":
    main()
