"""`weft plot` checks where it writes before drawing, writes PNG or SVG by the file's extension,
keeps underscores in titles literal, draws the loss on a log scale when asked (--log) or when it
spans more than two decades, and never dumps gnuplot's output or image bytes to the terminal.

Checked on hand-written metrics in a directory named with underscores: a path under a file (where
no directory can be made; a missing one is made) and an unknown extension are each one clear error with nothing written and nothing on stdout; an SVG is
an SVG whose title holds the path literally (gnuplot's enhanced text would turn "_r" into a
subscript); loss from 5.5 down to 0.004 gets log-scale ticks (0.01, 0.1) and loss from 5 to 0.1
linear ones, unless --log (then 0.1 and 10). RL metrics draw the KL to the reference that the
rewards were charged (rl.use_kl_in_reward) beside the entropy when the records carry it, and no
such curve when they do not; likewise the held-out pass@N (the largest eval_pass_at_K, from
rl.eval_n) and the trainers' wait for samples (rl.rollout_ranks: sample_wait_seconds above 0),
each drawn exactly when the records carry it.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

from reference.runner import weft_path


def write_metrics(path, losses):
    with open(path, "w") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"step": i + 1, "loss": loss, "accuracy": 0.5, "lr": 1e-3}) + "\n")


def write_rl_metrics(path, kl_in_reward, extras=False):
    """20 steps; extras: held-out pass@k every 5 steps (rl.eval_n=8) and a wait for samples."""
    with open(path, "w") as f:
        for i in range(20):
            row = {"step": i + 1, "loss": 0.01, "reward_mean": 0.2 + 0.01 * i, "accuracy": 0.3,
                   "response_length_mean": 20, "entropy": 0.2, "rollout_seconds": 0.5,
                   "old_logprob_seconds": 0.2, "update_seconds": 0.8,
                   "sample_wait_seconds": 0.1 if extras else 0.0}
            if kl_in_reward:
                row.update(reward_kl_penalty=0.01 * i, reward_kl_penalty_coeff=0.001)
            if extras and i % 5 == 4:
                row.update(eval_accuracy=0.3, eval_pass_at_1=0.3, eval_pass_at_2=0.45,
                           eval_pass_at_4=0.6, eval_pass_at_8=0.7)
            f.write(json.dumps(row) + "\n")


def plot(weft, *args):
    return subprocess.run([weft, "plot", *args], capture_output=True, text=True, timeout=60)


def main():
    weft = weft_path()
    failures = []
    with tempfile.TemporaryDirectory(prefix="weft_test_plot_") as tmp:
        run = os.path.join(tmp, "my_run")
        os.makedirs(run)
        wide, narrow = os.path.join(run, "metrics.jsonl"), os.path.join(run, "narrow.jsonl")
        write_metrics(wide, [5.5 * 0.9 ** k for k in range(70)])  # 5.5 -> 0.004
        write_metrics(narrow, [5.0 * 0.02 ** (k / 69) for k in range(70)])  # 5 -> 0.1

        for out, what in [(os.path.join(wide, "x.png"), "cannot write the plot there"),
                          (os.path.join(tmp, "x.jpg"), "ending in .png or .svg")]:
            r = plot(weft, wide, "-o", out)
            errors = [l for l in r.stderr.splitlines() if l.startswith("weft: error:")]
            if r.returncode == 0 or len(errors) != 1 or what not in errors[0] or r.stdout:
                failures.append(f"-o {out}: exit {r.returncode}, stdout {len(r.stdout)} bytes, "
                                f"stderr {r.stderr!r}")
            if os.path.exists(out) or any(".tmp" in f for f in os.listdir(tmp)):
                failures.append(f"-o {out}: something was written")

        def svg(metrics, name, *extra):
            out = os.path.join(tmp, name)
            r = plot(weft, metrics, "-o", out, *extra)
            if r.returncode != 0 or not os.path.exists(out):
                failures.append(f"{name}: exit {r.returncode}: {r.stderr}")
                return ""
            with open(out) as f:
                return f.read()

        text = svg(wide, "wide.svg")
        if not text.startswith("<?xml") or "<svg" not in text[:500]:
            failures.append("wide.svg is not an SVG")
        if "my_run/metrics.jsonl" not in text:
            failures.append("the title lost its underscore (enhanced text)")
        def log_ticks(t, ticks=("0.01", "0.1")):  # a log axis' labels: <text> 0.01</text>, ...
            return all(re.search(r">\s*%s</" % re.escape(v), t) for v in ticks)
        if not log_ticks(text):
            failures.append("a loss spanning three decades was not drawn on a log scale")
        if log_ticks(svg(narrow, "narrow.svg"), ("0.1", "10")):
            failures.append("a loss from 5 to 0.1 was drawn on a log scale unasked")
        if not log_ticks(svg(narrow, "narrow_log.svg", "--log"), ("0.1", "10")):
            failures.append("--log did not draw the loss on a log scale")
        for kl in (True, False):
            rl = os.path.join(run, f"rl_{kl}.jsonl")
            write_rl_metrics(rl, kl, extras=kl)
            drawing = svg(rl, f"rl_{kl}.svg")
            for what, key in (("KL to reference", "reward_kl_penalty"),
                              ("held-out pass@8", "eval_pass_at_8"),
                              ("waiting for samples", "sample_wait_seconds > 0")):
                if (what in drawing) != kl:
                    failures.append(f"RL metrics {'with' if kl else 'without'} {key}: the "
                                    f"{what} curve is {'missing' if kl else 'drawn'}")
        r = plot(weft, wide, "-o", os.path.join(tmp, "wide.png"))
        with open(os.path.join(tmp, "wide.png"), "rb") as f:
            if r.returncode != 0 or f.read(8) != b"\x89PNG\r\n\x1a\n":
                failures.append(f"wide.png is not a PNG: {r.stderr}")
    for f in failures:
        print("FAIL:", f)
    print(json.dumps({"failures": len(failures)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
