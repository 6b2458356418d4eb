"""Running `weft rl` from the tests: a tiny random byte-level model, prompt files, a deterministic
reward command, the command line (plainly or under mpirun), and reading back what a run wrote:
metrics.jsonl, rollouts/step_NNNNNN.jsonl and checkpoints (each checked against the sizes and
hashes its trainer_state.json records).

The model is a random Qwen2 of the byte-level tokenizer's vocabulary (257: the 256 bytes and the
end-of-text token 256, which is also its eos_token_id), so `weft rl` needs no tokenizer file.
A random model never gets an exact_match answer right, so tests whose rewards must vary use
REWARD_SCRIPT: a long-lived process whose reward is a fixed function of the response's bytes,
that can also be told to crash, hang, answer garbage or pause after a number of answers.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np

from reference.files import make_model
from reference.mpi import mpirun

VOCAB, EOS = 257, 256
TINY_CFG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, rope_theta=10000.0,
                rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=True,
                eos_token_id=EOS)
# Time and memory, not computation; and how many rewards came in while generating, which
# depends on how fast the reward command answers.
TIMING = re.compile(r"(_seconds|_per_s|_bytes)$|^rewards_while_generating$")
CHECKPOINT = re.compile(r"step_(\d{8})$")

# The reward command: one JSON request per line on stdin, one {"reward": x} line per answer.
# reward = (sum of the response's UTF-8 bytes) mod 4 / 3, so samples of one prompt differ.
# Options: --crash-after K (exit 3 silently instead of answering request K+1), --hang-after K
# (sleep instead of answering request K+1), --garbage-after K (answer request K+1 with a line that
# is not {"reward": x}: --garbage TEXT, default "not json"), --pause-after K (before answering
# request K+1 write the marker file --marker PATH holding the script's pid, then sleep), --pid PATH
# (write the pid at start), --log PATH (append each request line), --pids PATH (append the pid,
# a line per request).
REWARD_SCRIPT = r'''
import json, os, sys, time
opts = {}
args = sys.argv[1:]
while args:
    opts[args[0].lstrip("-")] = args[1]
    args = args[2:]
def after(name):
    return int(opts[name]) if name in opts else -1
if "pid" in opts:
    with open(opts["pid"], "w") as f:
        f.write(str(os.getpid()))
if "hang-after" in opts or "pause-after" in opts:
    # A sleeping script must not hold weft's stderr (the test's pipe) open after weft ends.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
answered = 0
for line in sys.stdin:
    if "log" in opts:
        with open(opts["log"], "a") as f:
            f.write(line)
    if "pids" in opts:
        with open(opts["pids"], "a") as f:
            f.write(f"{os.getpid()}\n")
    if answered == after("crash-after"):
        sys.exit(3)
    if answered == after("hang-after"):
        time.sleep(3600)
    if answered == after("pause-after"):
        with open(opts["marker"] + ".part", "w") as f:
            f.write(str(os.getpid()))
        os.rename(opts["marker"] + ".part", opts["marker"])
        time.sleep(600)
    if answered == after("garbage-after"):
        sys.stdout.write(opts.get("garbage", "not json") + "\n")
        sys.stdout.flush()
        answered += 1
        continue
    response = json.loads(line)["response"]
    reward = (sum(response.encode("utf-8")) % 4) / 3.0
    sys.stdout.write(json.dumps({"reward": reward}) + "\n")
    sys.stdout.flush()
    answered += 1
'''


def write_reward_script(tmp):
    path = os.path.join(tmp, "reward.py")
    with open(path, "w") as f:
        f.write(REWARD_SCRIPT)
    return path


def reward_command(script, **opts):
    """The settings reward.type=command and reward.command running `script` with options
    (crash_after=3 -> --crash-after 3)."""
    words = [sys.executable, script]
    for k, v in opts.items():
        words += ["--" + k.replace("_", "-"), str(v)]
    return ["reward.type=command", "reward.command=" + " ".join(map(shlex.quote, words))]


def make_tiny_model(mdir, seed=1, std=0.3, **over):
    """A random tiny Qwen2 for the byte-level tokenizer in mdir; returns its full config."""
    cfg, _ = make_model(mdir, dict(TINY_CFG, **over), seed=seed, std=std)
    return cfg


def write_prompts(path, lengths, seed, answers=True, drop_answer=()):
    """One row per length: {"prompt": <that many printable ASCII bytes>, "answer": "<index>",
    "id": index}; rows whose index is in drop_answer have no "answer" (answers=False: none
    has)."""
    rng = np.random.default_rng(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 +=?"
    with open(path, "w") as f:
        for i, n in enumerate(lengths):
            text = "".join(alphabet[int(k)] for k in rng.integers(0, len(alphabet), size=n))
            row = {"prompt": text, "id": i}
            if answers and i not in drop_answer:
                row["answer"] = str(i)
            f.write(json.dumps(row) + "\n")
    return path


# Settings every test's run shares unless it overrides them: 2 steps of 4 prompts x 4 samples of
# at most 8 tokens, one update per step, no held-out evaluation, a checkpoint only at the end.
BASE = ["train.steps=2", "train.global_batch_size=4", "rl.ppo_mini_batch_size=0", "sampling.n=4",
        "sampling.max_tokens=8", "sampling.seed=7", "rl.eval_every=0", "rl.eval_prompts=0",
        "train.save_every=0"]


LEARNING_LENGTHS = [5, 12, 3, 20, 8, 15, 9, 11, 4, 7]


def learning_setup(tmp, lengths=LEARNING_LENGTHS, seed=21):
    """A job whose updates move the policy: the tiny model (seed, std 0.2), prompts of `lengths`
    (seed + 1) and REWARD_SCRIPT's rewards, which differ within a group. Returns (model
    directory, prompt file, the reward settings)."""
    mdir, prompts = os.path.join(tmp, "model"), os.path.join(tmp, "prompts.jsonl")
    make_tiny_model(mdir, seed=seed, std=0.2)
    write_prompts(prompts, lengths, seed=seed + 1)
    return mdir, prompts, reward_command(write_reward_script(tmp))


def on_cpu_and_cuda(weft, tmp, cpu_case, cuda_case, failures):
    """learning_setup's job, then cpu_case(weft, mdir, prompts, reward, tmp, failures) and, where
    fixtures.cuda_weft finds a GPU or weft_emulated, cuda_case(program, emulated, mdir, prompts,
    reward, tmp, failures). Returns learning_setup's (mdir, prompts, reward)."""
    from reference import fixtures
    setup = learning_setup(tmp)
    cpu_case(weft, *setup, tmp, failures)
    program, emulated = fixtures.cuda_weft(weft, 1)
    if program:
        cuda_case(program, emulated, *setup, tmp, failures)
    else:
        print("device=cuda: skipped (no GPU listed and no weft_emulated beside weft)")
    return setup


def rl_args(mdir, prompts, out, *extra):
    """The arguments of `weft rl` (after the binary) on the model mdir and the prompt file,
    writing under out; BASE first, so `extra` overrides it."""
    return ["rl", f"model.path={mdir}", "data.tokenizer=bytes", f"data.source={prompts}",
            f"train.output_dir={out}", *BASE, *extra]


def environment(ranks, extra=None):
    """OpenMP threads that sleep while they wait (spinning ones make runs many times slower on a
    busy machine), one thread per rank under mpirun, two alone."""
    return dict(os.environ, OMP_WAIT_POLICY="passive",
                OMP_NUM_THREADS="1" if ranks > 1 else os.environ.get("OMP_NUM_THREADS", "2"),
                **(extra or {}))


def command(weft, args, ranks=1):
    cmd = [weft, *args]
    if ranks > 1:
        cmd = mpirun(ranks, *cmd)
        cmd[1:1] = ["-x", "OMP_WAIT_POLICY=passive"]
    return cmd


def run_rl(weft, args, ranks=1, timeout=300, check=True, env=None):
    """Runs `weft rl` (args from rl_args) on `ranks` ranks; returns the CompletedProcess (text).
    With check, a failure raises RuntimeError carrying the command and its output."""
    cmd = command(weft, args, ranks)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=environment(ranks, env))
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nexit status {r.returncode}\nstdout:\n{r.stdout}\n"
                           f"stderr:\n{r.stderr}")
    return r


def metrics(out):
    """metrics.jsonl's lines, as {step: dict}."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r for r in rows}


def without_timings(row):
    return {k: v for k, v in row.items() if not TIMING.search(k)}


def rollouts(out, step):
    """rollouts/step_NNNNNN.jsonl: one dict per sample, in the file's order."""
    with open(os.path.join(out, "rollouts", f"step_{step:06d}.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def f32(values):
    """JSON log-probs (written with 9 significant digits: every float32 exactly) as float32."""
    return np.asarray(values, dtype=np.float64).astype(np.float32)


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def checkpoint_problem(d, step=None):
    """None if directory d is a complete checkpoint (of `step` when given): trainer_state.json
    parses (and names the step) and every file it records has its recorded size and FNV-1a
    hash; else what is wrong."""
    try:
        with open(os.path.join(d, "trainer_state.json")) as f:
            state = json.load(f)
        if step is not None and state.get("step") != step:
            return f"trainer_state.json says step {state.get('step')}, not {step}"
        recorded = state["files"]
        if not recorded:
            return "trainer_state.json records no files"
        for name, want in recorded.items():
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            if len(data) != want["bytes"] or f"{fnv1a64(data):016x}" != want["fnv1a64"]:
                return f"{name}: {len(data)} bytes or its hash differ from trainer_state.json's"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def checkpoints(out):
    """{step: path} of the published checkpoints under out/checkpoints, and the other names
    there (leftovers such as step_N.tmp)."""
    root = os.path.join(out, "checkpoints")
    found, other = {}, []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        m = CHECKPOINT.match(name)
        if m:
            found[int(m.group(1))] = os.path.join(root, name)
        else:
            other.append(name)
    return found, other


def pid_alive(pid):
    """Whether process pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid, seconds):
    """Waits up to `seconds` for process pid to end; returns whether it did."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def kill_pid(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
