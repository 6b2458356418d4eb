"""Every verb that runs a job settles its settings the same way: defaults, then --config
FILE.yaml, then key=value overrides, with one validation.

  - weft grad --config: train.micro_batches: 3 from the file cuts the batch into 3 micro-batches
    (its --busy statistics), and train.micro_batches=2 on the command line wins over the file;
  - weft train --config: train.steps from the file is the run's last step;
  - weft plan --config: parallel.* settings from the file make the plan's layout;
  - weft calibrate --config: parallel.max_seqlen_per_rank from the file sets the longest probe;
  - weft generate --config: sampling.n and sampling.max_tokens from the file (a YAML mapping)
    shape the responses, and sampling.n=2 on the command line wins over the file;
  - an unknown key in the file is one clear error naming the file and the closest key, for grad,
    train and generate.
"""
import json
import os
import subprocess
import sys

from reference import fixtures, qwen2
from reference.mpi import run_ranks
from reference.runner import stats_of

TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "train.global_batch_size=4",
        "data.synthetic_documents=16", "train.save_every=0"]


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def run(args):
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def cases(weft, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    _, _, bpath, _ = fixtures.model_and_batch(mdir, qwen2.SMALL_CFG, 3, [9, 5, 12, 7, 3],
                                              [2, 1, 3, 2, 1], 4)
    grad = [weft, *fixtures.grad_args(mdir, bpath, "--busy"), "--out",
            os.path.join(tmp, "g.safetensors")]
    cfg = write(os.path.join(tmp, "grad.yaml"), "train:\n  micro_batches: 3\n")
    for extra, want in (([], 3), (["train.micro_batches=2"], 2)):
        stats, r = stats_of([*grad, "--config", cfg, *extra], run)
        got = len(stats["busy"][0]["micro_batches"]) if stats else None
        print(f"grad --config {cfg} {extra}: {got} micro-batches (want {want})")
        if got != want:
            failures.append(f"grad --config with {extra}: {got} micro-batches, want {want}: {r.stderr}")

    cfg = write(os.path.join(tmp, "train.yaml"), "train:\n  steps: 3\n")
    stats, r = stats_of([weft, "train", "--config", cfg, *TINY,
                         f"train.output_dir={os.path.join(tmp, 'run')}"], run)
    print(f"train --config: last step {stats.get('last_step')}")
    if stats.get("last_step") != 3:
        failures.append(f"train --config: last step {stats.get('last_step')}, want 3: {r.stderr}")

    cfg = write(os.path.join(tmp, "plan.yaml"),
                "parallel:\n  dynamic_context_parallel: true\n  max_seqlen_per_rank: 8\n")
    stats, r = stats_of([weft, "plan", "--config", cfg, "--ranks", "2", "--batch", bpath], run)
    print(f"plan --config: layout {stats.get('layout')}, limit {stats.get('limit')}")
    if stats.get("layout") != "uniform" or stats.get("limit") != 8:
        failures.append(f"plan --config: layout {stats.get('layout')} limit {stats.get('limit')}")

    cfg = write(os.path.join(tmp, "cal.yaml"), "parallel.max_seqlen_per_rank: 32\n")
    stats, _ = stats_of([weft, "calibrate", "--config", cfg, "--repeats", "1", *TINY[:5]],
                        lambda a: run_ranks(1, a, timeout=300))
    longest = max((p["len"] for p in stats.get("probes", [])), default=None)
    print(f"calibrate --config: longest probe {longest}")
    if longest != 32:
        failures.append(f"calibrate --config: longest probe {longest}, want 32")

    prompts = write(os.path.join(tmp, "prompts.jsonl"), '{"input_ids": [3, 1, 4]}\n')
    generate = [weft, "generate", "--model", mdir, "--prompts", prompts, "--out",
                os.path.join(tmp, "out.jsonl")]
    cfg = write(os.path.join(tmp, "gen.yaml"), "sampling:\n  n: 3\n  max_tokens: 2\n")
    for extra, want in (([], 3), (["sampling.n=2"], 2)):
        r = run([*generate, "--config", cfg, *extra])
        with open(os.path.join(tmp, "out.jsonl")) as f:
            got = [len(x["token_ids"]) for x in json.loads(f.readline())["responses"]]
        print(f"generate --config {extra}: response lengths {got} (want {want} of at most 2)")
        if r.returncode != 0 or len(got) != want or max(got) > 2:
            failures.append(f"generate --config with {extra}: responses {got}: {r.stderr}")

    bad = write(os.path.join(tmp, "bad.yaml"), "train:\n  micro_batchez: 2\n")
    for verb in ([*grad], [weft, "train", *TINY, f"train.output_dir={os.path.join(tmp, 'r2')}"],
                 [*generate]):
        r = run([*verb, "--config", bad])
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        print(f"{verb[1]} --config with an unknown key: exit {r.returncode}: {lines[:1]}")
        if (r.returncode == 0 or len(lines) != 1 or bad not in lines[0]
                or '"train.micro_batches"' not in lines[0]):
            failures.append(f"{verb[1]}: an unknown key in --config did not give one clear error")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_config_path_", "checks failed"))
