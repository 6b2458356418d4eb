#!/usr/bin/env python3
"""MTP speculative decoding in `weft generate` on the CPU (--device cuda: on a GPU): decode
tokens/s with speculation on (rollout.speculative_tokens=k, k = 1 .. the model's MTP depth)
against off, at batch 1 and 16, with the acceptance rate per draft depth, the mean accepted
length and the drafts' share of the time, next to the trainer's per-depth top-1 accuracy of the
same model.

The model: weft's built-in default job (a 1.28M-parameter Qwen2 with its MTP modules, byte-level
tokens, learning multi-term addition with worked steps from scratch, src/data/synthetic.c) with
model.mtp_layers=2, trained for --train-steps steps (5000: about 13 minutes on one thread) on first
use and kept under --cache (bench/.cache/ by default, git-ignored), so later runs skip training.
Training runs on --train-threads threads (the trained bits depend on the thread count and on the
OpenBLAS kernels). The trainer's per-depth top-1 accuracy is the mean of metrics.jsonl's
"accuracy" and "mtp_accuracy" over the last 50 steps (training batches, teacher-forced against
the data).

The prompts: --prompts problems drawn from the same distribution as the training task (with
Python's random, seeded, so not the training documents), as byte ids ("input_ids"); each sample
ends at the model's end-of-text (id 256) or sampling.max_tokens. Batch 1 runs them one at a time
(rollout.max_running=1), batch 16 sixteen at a time in one continuous batch
(rollout.max_running=16). Greedy (sampling.temperature=0) and sampled (temperature 1).

Timed: the engine time of `weft generate` (generation_seconds of --stats), model loading
excluded; tokens/s is the tokens generated over it. Beside it, tokens per CPU second of the
process, less the CPU time of a run that only starts up: with one thread (the default) this is
the work done, which waiting for a core on a busy machine does not inflate. Each configuration
runs --repeats times, interleaved with the others; the tables give medians, and `vs off` is the
median of the run-by-run ratios (trust a row only when `others`, the cores other processes used
meanwhile, is near 0). At batch 1 the engine's steps can be counted, so the table also splits the
time into milliseconds per main forward and per step's MTP draft passes.

--device cuda trains (into its own cache directory) and generates on the GPU. Tokens per CPU
second then measure the host's share of the work, not the work.

Checks: greedy output with speculation must equal output without, token for token (`same`; on
the CPU the script exits with status 1 otherwise; in bf16 on a GPU a verification's 1 + k rows
may round a near-tie differently from one row, so there `same` is reported, not enforced). With
torch present, a teacher-forced float64 pass of the reference model over the greedy outputs
(tests/reference/qwen2.py) gives each MTP module's top-1 agreement with the main model on its own
text and predicts what greedy speculation should accept (module j's argmax against the tokens the
main model chose, walked step by step as the engine verifies): the engine's counts should match
it up to near-ties.
"""
import argparse
import importlib.util
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "tests"))
import train_throughput as tt  # noqa: E402  (its process helpers)
from generate_throughput import agreement  # noqa: E402

DEFAULT_TRAIN_STEPS = 5000
EOS = 256  # the byte-level tokenizer's end-of-text
MTP_LAYERS = 2
TRAIN_SETTINGS = [f"model.mtp_layers={MTP_LAYERS}"]  # on top of the built-in default job


# ------------------------------------------------------------------------------- the task ----

def synthetic_problem(rng):
    """(prompt, response) of src/data/synthetic.c's addition task: 2 + a lognormal tail of terms
    (at most 48), each below 10, 100, 1000 or 10000 (one of the four at random)."""
    n = min(48, 2 + int(math.exp(0.4 + rng.gauss(0.0, 1.0))))
    terms = [rng.randrange([10, 100, 1000, 10000][rng.randrange(4)]) for _ in range(n)]
    prompt = "+".join(str(t) for t in terms) + "="
    total, steps = terms[0], []
    for t in terms[1:]:
        steps.append(f"{total}+{t}={total + t} ")
        total += t
    return prompt, "".join(steps) + f"so {total}\n"


def write_prompts(path, n, seed):
    """n problems as rows {"input_ids": prompt bytes, "id": i, "answer": the right response}."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            prompt, response = synthetic_problem(rng)
            f.write(json.dumps({"input_ids": list(prompt.encode()), "id": i,
                                "answer": response}) + "\n")
    return path


# ------------------------------------------------------------------------------ the model ----

def checkpoint_dir(run_dir, steps):
    return os.path.join(run_dir, "checkpoints", f"step_{steps:08d}")


def ensure_model(weft, run_dir, steps, threads, device):
    """The checkpoint after `steps` steps of the default job with MTP, trained now unless it is
    already there. Returns (checkpoint directory, training seconds or None when cached)."""
    ckpt = checkpoint_dir(run_dir, steps)
    if os.path.exists(os.path.join(ckpt, "model.safetensors")):
        return ckpt, None
    cmd = [weft, "train", *TRAIN_SETTINGS, f"train.steps={steps}", f"train.save_every={steps}",
           f"train.log_every={max(1, steps // 10)}", f"train.output_dir={run_dir}",
           f"device={device}"]
    if os.path.isdir(run_dir):  # an interrupted run's leftovers
        shutil.rmtree(run_dir)
    print(f"training the model (once; cached in {run_dir}): {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    r = subprocess.run(cmd, env=tt.base_env(threads))  # its progress lines show
    if r.returncode != 0 or not os.path.exists(os.path.join(ckpt, "model.safetensors")):
        sys.exit(f"weft train failed ({r.returncode}): {' '.join(cmd)}")
    return ckpt, time.time() - t0


def trainer_accuracy(run_dir, steps, last=50):
    """Mean top-1 accuracy of the main head and of each MTP depth over the last `last` logged
    steps up to `steps` (metrics.jsonl: one line per step)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r["step"] <= steps][-last:]
    depth = len(rows[-1].get("mtp_accuracy", []))
    return dict(steps=[rows[0]["step"], rows[-1]["step"]],
                main=statistics.mean(r["accuracy"] for r in rows),
                mtp=[statistics.mean(r["mtp_accuracy"][j] for r in rows) for j in range(depth)])


# ------------------------------------------------------------------------------ the runs ----

def run_measured(cmd, env):
    """Runs cmd; returns (CompletedProcess, its CPU seconds, cores' worth of CPU that other
    processes used meanwhile), as train_throughput.run_measured but with the process's own CPU
    time, a measure of the work done that waiting for a core on a shared machine does not
    inflate (with one thread)."""
    b0, r0, t0 = tt.cpu_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.time() - t0
    b1, r1 = tt.cpu_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    other = None
    if b0 is not None and b1 is not None and wall > 0:
        other = max(0.0, (b1 - b0) - own) / wall
    return r, own, other


def run_generate(weft, mdir, prompts, out, threads, settings):
    stats = out + ".stats.json"
    cmd = [weft, "generate", "--model", mdir, "--prompts", prompts, "--out", out, "--stats",
           stats, *settings]
    r, cpu, other = run_measured(cmd, tt.base_env(threads))
    if r.returncode != 0:
        sys.exit(f"weft failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    with open(stats) as f:
        st = json.load(f)
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    return dict(seconds=st["generation_seconds"], tokens=int(st["tokens"]),
                peak_batch=st.get("peak_batch"), spec=st.get("speculative"), other=other,
                cpu=cpu,
                prompts=[row["input_ids"] for row in rows],
                outputs=[[r["token_ids"] for r in row["responses"]] for row in rows],
                answers=[row.get("answer") for row in rows])


def settings_of(batch, k, temperature, max_tokens, seed):
    s = [f"sampling.temperature={temperature}", f"sampling.max_tokens={max_tokens}",
         f"sampling.stop_token_ids=[{EOS}]", f"sampling.seed={seed}",
         f"rollout.max_running={batch}"]
    return s + ([f"rollout.speculative_tokens={k}"] if k else [])


def on_device(settings, device):
    return settings + [f"device={device}"]


def correct_share(run):
    """Share of samples whose text is the task's right response (how well the model learned)."""
    ok = n = 0
    for samples, answer in zip(run["outputs"], run["answers"]):
        for ids in samples:
            text = bytes(t for t in ids if t < 256).decode("utf-8", "replace")
            ok, n = ok + (text == answer), n + 1
    return ok / n if n else 0.0


def flat(outputs):
    return [ids for samples in outputs for ids in samples]


# ---------------------------------------------------- the teacher-forced acceptance check ----

def teacher_forced_drafts(mdir, sequences):
    """For each token sequence: (the sequence, main argmax at each position, [module j's argmax at
    each position for j = 1..D]), from a float64 forward of the reference model
    (tests/reference/qwen2.py) with the MTP modules fed the sequence's own tokens (as greedy
    speculation feeds them whenever the earlier drafts were accepted). Position t of module j
    predicts token t+j+1."""
    import torch

    from reference import qwen2
    from reference.files import read_safetensors
    with open(os.path.join(mdir, "config.json")) as f:
        cfg = qwen2.full_cfg(json.load(f))
    W = {k: torch.tensor(v, dtype=torch.float64)
         for k, v in read_safetensors(os.path.join(mdir, "model.safetensors")).items()}
    h, H, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["rms_norm_eps"]
    hd, D = cfg.get("head_dim") or h // H, qwen2.mtp_depth(cfg)
    assert hd == h // H, "the reference layer assumes head_dim = hidden_size / heads"
    E = W["model.embed_tokens.weight"]
    lm = E if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    inv_freq = cfg["rope_theta"] ** (-(torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    result = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor(seq, dtype=torch.long)
            L = len(seq)
            ang = torch.arange(L, dtype=torch.float64)[:, None] * inv_freq[None, :]
            cos = torch.cat((torch.cos(ang), torch.cos(ang)), dim=-1)[:, None, :]
            sin = torch.cat((torch.sin(ang), torch.sin(ang)), dim=-1)[:, None, :]
            causal = torch.ones(L, L, dtype=torch.bool).tril()
            x = E[ids]
            for l in range(cfg["num_hidden_layers"]):
                x = qwen2._decoder_layer(x, W, f"model.layers.{l}.", cfg, cos, sin, causal)
            x = qwen2._rmsnorm(x, W["model.norm.weight"], eps)
            main = (x @ lm.T).argmax(dim=-1).tolist()
            drafts, hprev = [], x
            for j in range(1, D + 1):
                p = f"model.mtp_layers.{j - 1}."
                e = E[torch.tensor(qwen2.mtp_input_ids(seq, j), dtype=torch.long)]
                z = torch.cat((qwen2._rmsnorm(e, W[p + "enorm.weight"], eps),
                               qwen2._rmsnorm(hprev, W[p + "hnorm.weight"], eps)), dim=-1)
                z = qwen2._decoder_layer(z @ W[p + "eh_proj.weight"].T, W, p, cfg, cos, sin,
                                         causal)
                hprev = qwen2._rmsnorm(z, W[p + "final_layernorm.weight"], eps)
                drafts.append((hprev @ lm.T).argmax(dim=-1).tolist())
            result.append((list(seq), main, drafts))
    return result


def predicted_acceptance(forced, prompt_lens, k):
    """Greedy speculation with k drafts walked over the teacher-forced argmaxes of
    teacher_forced_drafts (sequence = prompt + completion): a step whose last emitted token is at
    position n drafts tokens n+1..n+k from position n-1 (module j's argmax there predicts token
    n+j), accepts the longest prefix of drafts equal to the tokens the main model emitted, and
    emits those plus one. Returns drafted and accepted per depth (a depth-j draft is accepted only
    with all before it), verify steps, and the main head's disagreements with the emitted tokens
    (the reference's argmax against weft's choice: near-ties; the prediction is exact while 0).
    The walk stops at the sample's end, as weft's counts do (only emitted tokens count)."""
    drafted, accepted = [0] * k, [0] * k
    steps = mismatches = 0
    for (seq, main, drafts), P in zip(forced, prompt_lens):
        end = len(seq)
        mismatches += sum(main[t] != seq[t + 1] for t in range(P - 1, end - 1))
        n = P  # the first completion token comes from the prompt's forward
        while n < end - 1:
            t, a = n - 1, 0
            steps += 1
            for j in range(1, k + 1):
                drafted[j - 1] += 1
                if a == j - 1 and n + j < end and drafts[j - 1][t] == seq[n + j]:
                    a = j
            for j in range(a):
                accepted[j] += 1
            n += a + 1
    return dict(drafted=drafted, accepted=accepted, verify_steps=steps, mismatches=mismatches)


def check_prediction(ckpt, run, depths, rows):
    """Prints and returns the teacher-forced prediction of greedy acceptance for each k next to
    what weft reported at each batch size."""
    seqs, lens = [], []
    for prompt, samples in zip(run["prompts"], run["outputs"]):
        for ids in samples:
            seqs.append(prompt + ids)
            lens.append(len(prompt))
    forced = teacher_forced_drafts(ckpt, seqs)
    # Module j's top-1 agreement with the main model's greedy tokens at every completion
    # position, the analogue of the trainer's MTP accuracy on the model's own text.
    depth = len(forced[0][2]) if forced else 0
    agree = []
    for j in range(1, depth + 1):
        hits = total = 0
        for (seq, _, drafts), P in zip(forced, lens):
            for t in range(P - 1, len(seq) - 1 - j):
                hits, total = hits + (drafts[j - 1][t] == seq[t + j + 1]), total + 1
        agree.append(hits / total if total else 0.0)
    print("\nteacher-forced pass (float64 reference) over the greedy outputs: module j's top-1 "
          "agreement with the main model's tokens at every position: "
          + ", ".join(f"depth {j + 1} {x:.1%}" for j, x in enumerate(agree)))
    print("predicted greedy acceptance (the same argmaxes walked as the engine verifies):")
    result = []
    for k in depths:
        p = predicted_acceptance(forced, lens, k)
        p["acceptance"] = [x / d if d else 0.0 for x, d in zip(p["accepted"], p["drafted"])]
        p["mean_accepted_length"] = 1 + sum(p["accepted"]) / max(1, p["verify_steps"])
        p["k"] = k
        result.append(p)
        weft = "; ".join(
            f"weft at batch {r['batch']}: " + " ".join(f"{x:.1%}" for x in r["acceptance"])
            + f", MAL {r['mean_accepted_length']:.2f}, {r['verify_steps']} steps"
            for r in rows if r["temperature"] == 0 and r["k"] == k)
        print(f"  k={k}: " + " ".join(f"{x:.1%}" for x in p["acceptance"])
              + f", MAL {p['mean_accepted_length']:.2f}, {p['verify_steps']} steps"
              + f" (main-head near-ties: {p['mismatches']}); {weft}")
    return dict(agreement=agree, walks=result)


def compare_with_training(acc, prediction, rows, depth):
    """Per depth: the trainer's top-1 accuracy (teacher-forced, against the data), module j's
    agreement with the main model on its own greedy text, and the acceptance at the deepest k
    (greedy and sampled, batch 1), unconditional and given the draft before it accepted."""
    if depth == 0:
        return
    print(f"\nper depth: trainer's top-1 accuracy against acceptance (k={depth}, batch "
          f"{min(r['batch'] for r in rows)}):")
    cols = ["trainer top-1", "own-text agreement"]
    picked = {}
    for r in rows:
        if r["k"] == depth and r["batch"] == min(x["batch"] for x in rows):
            picked[r["temperature"]] = r
            cols.append(f"accepted t={r['temperature']:g}")
            cols.append("  given previous")
    print(f"{'':7s}" + "".join(f"{c:>20s}" for c in cols))
    for j in range(depth):
        cells = [f"{acc['mtp'][j]:.1%}" if j < len(acc["mtp"]) else "",
                 f"{prediction['agreement'][j]:.1%}" if prediction else ""]
        for r in picked.values():
            acc_j = r["accepted"][j] / r["drafted"][j] if r["drafted"][j] else 0.0
            prev = r["accepted"][j - 1] if j else r["drafted"][0]
            cells += [f"{acc_j:.1%}", f"{r['accepted'][j] / prev:.1%}" if prev else ""]
        print(f"depth {j + 1}" + "".join(f"{c:>20s}" for c in cells))


# ------------------------------------------------------------------------------ the table ----

def spec_fields(spec, k):
    """Acceptance per depth, mean accepted length and draft seconds from --stats' "speculative"
    (None for speculation off)."""
    if not spec:
        return dict(acceptance=[], mean_accepted_length=1.0, draft_seconds=0.0, verify_steps=None,
                    drafted=[], accepted=[])
    return dict(acceptance=list(spec["acceptance"]), drafted=list(spec["drafted"]),
                accepted=list(spec["accepted"]), verify_steps=spec["verify_steps"],
                mean_accepted_length=spec["mean_accepted_length"],
                draft_seconds=spec["draft_seconds"])


def summarize(runs, off_runs, k, B, n_samples, load_cpu):
    """One table row from the repeats of one configuration and those of speculation off at the
    same batch and temperature (run i of each was taken side by side). load_cpu: the CPU seconds
    of a run that generates nothing to speak of (start-up, loading), taken off every run's."""
    tok_s = [r["tokens"] / r["seconds"] for r in runs]
    ratios = [(r["tokens"] / r["seconds"]) / (o["tokens"] / o["seconds"])
              for r, o in zip(runs, off_runs)]
    def cpu_rate(r):
        return r["tokens"] / max(1e-9, r["cpu"] - load_cpu)
    cpu_tok_s = [cpu_rate(r) for r in runs]
    cpu_ratios = [cpu_rate(r) / cpu_rate(o) for r, o in zip(runs, off_runs)]
    sf = spec_fields(runs[0]["spec"], k)
    seconds = statistics.median(r["seconds"] for r in runs)
    draft = statistics.median(spec_fields(r["spec"], k)["draft_seconds"] for r in runs)
    ratio = statistics.median(ratios)
    # Tokens a verification step emitted (each sample's first token comes from its prompt's
    # forward). The engine's mean accepted length (1 + accepted per step) is a little higher: it
    # counts the bonus token of a sample's last step, which its end-of-text does not emit.
    per_step = (runs[0]["tokens"] - n_samples) / sf["verify_steps"] if k else 1.0
    row = dict(k=k, tokens=runs[0]["tokens"], tokens_per_s=statistics.median(tok_s),
               tokens_per_s_range=[min(tok_s), max(tok_s)], speedup=ratio,
               speedup_range=[min(ratios), max(ratios)], generation_seconds=seconds,
               cpu_tokens_per_s=statistics.median(cpu_tok_s),
               cpu_speedup=statistics.median(cpu_ratios),
               cpu_speedup_range=[min(cpu_ratios), max(cpu_ratios)],
               draft_seconds=draft, draft_share=draft / seconds if seconds > 0 else 0.0,
               tokens_per_verification=per_step,
               # the time of one speculative step over one plain step, per sequence
               step_cost=per_step / ratio if k else 1.0,
               peak_batch=runs[0]["peak_batch"],
               others=max((r["other"] or 0.0) for r in runs + off_runs),
               **{key: v for key, v in sf.items() if key != "draft_seconds"})
    if B == 1:  # one sequence at a time: engine steps are countable
        # a prompt's forward draws its first token; then one forward per token, or per
        # verification (the few steps at the token limit with nothing to draft not counted)
        forwards = n_samples + sf["verify_steps"] if k else runs[0]["tokens"]
        row["forward_ms"] = 1e3 * (seconds - draft) / forwards
        row["draft_ms"] = 1e3 * draft / sf["verify_steps"] if k else 0.0
    return row


def print_row(temp, B, row, same, depth):
    acc = " ".join(f"{x:6.1%}" for x in row["acceptance"]) if row["k"] else ""
    acc = acc + " " * (7 * depth - len(acc))
    same_s = "" if same is None else f"{same:6.1%}"
    ms = (f"{row['forward_ms']:6.3f} {row['draft_ms']:6.3f}" if "forward_ms" in row
          else " " * 13)
    print(f"{temp:>4} {B:5d} {row['k']:2d} {row['tokens_per_s']:8.0f} {row['speedup']:6.2f}x "
          f"{row['cpu_tokens_per_s']:8.0f} {row['cpu_speedup']:6.2f}x  "
          f"{acc} {row['mean_accepted_length']:5.2f} {row['tokens_per_verification']:5.2f} "
          f"{row['draft_share']:6.1%} {ms} "
          f"{row['step_cost']:5.2f} {same_s:>6} {row['others']:6.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"), help="the weft binary")
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of the generation runs (1: the CPU-time column is "
                    "meaningful; 2 threads do not speed up batch 1 of this small model)")
    ap.add_argument("--train-threads", type=int, default=1,
                    help="OMP_NUM_THREADS of training (the trained bits depend on it)")
    ap.add_argument("--train-steps", type=int, default=DEFAULT_TRAIN_STEPS,
                    help="optimizer steps of the default job with model.mtp_layers=2")
    ap.add_argument("--cache", default=os.path.join(REPO, "bench", ".cache"),
                    help="where the trained model is kept between runs")
    ap.add_argument("--prompts", type=int, default=64, help="problems generated for")
    ap.add_argument("--batches", default="1,16", help="comma-separated rollout.max_running")
    ap.add_argument("--depths", default="1,2", help="comma-separated speculative_tokens k > 0")
    ap.add_argument("--temperatures", default="0,1", help="comma-separated; 0 is greedy")
    ap.add_argument("--max-tokens", type=int, default=256, help="sampling.max_tokens")
    ap.add_argument("--repeats", type=int, default=5, help="runs of every configuration")
    ap.add_argument("--seed", type=int, default=7, help="of the prompts and the sampling")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the teacher-forced prediction of greedy acceptance (needs torch)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the model is trained and generates")
    a = ap.parse_args()
    weft = os.path.abspath(a.weft)
    if not os.access(weft, os.X_OK):
        sys.exit(f"{weft}: not an executable; build it with `make` or pass --weft PATH")
    batches = [int(x) for x in a.batches.split(",")]
    depths = [int(x) for x in a.depths.split(",") if x]  # "": speculation off only
    temps = [float(x) for x in a.temperatures.split(",")]
    if any(k < 1 or k > MTP_LAYERS for k in depths):
        ap.error(f"--depths: each k in 1..{MTP_LAYERS} (the model's MTP depth)")

    run_dir = os.path.join(os.path.abspath(a.cache),
                           f"speculative_decoding_mtp{MTP_LAYERS}_steps{a.train_steps}"
                           f"_threads{a.train_threads}"
                           + ("" if a.device == "cpu" else f"_{a.device}"))
    ckpt, train_seconds = ensure_model(weft, run_dir, a.train_steps, a.train_threads, a.device)
    acc = trainer_accuracy(run_dir, a.train_steps)
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    print(f"model: the default job with model.mtp_layers={MTP_LAYERS}, {a.train_steps} steps "
          + (f"(trained now in {train_seconds:.0f} s)" if train_seconds is not None
             else f"(cached: {ckpt})"))
    print(f"  hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers + "
          f"{cfg.get('num_nextn_predict_layers', 0)} MTP modules, vocab {cfg['vocab_size']}")
    print(f"trainer's top-1 accuracy, mean of steps {acc['steps'][0]}-{acc['steps'][1]}: main "
          f"{acc['main']:.3f}, MTP depth " + ", ".join(f"{j + 1}: {x:.3f}"
                                                      for j, x in enumerate(acc["mtp"])))

    ks = [0] + depths
    results = {}
    with tempfile.TemporaryDirectory(prefix="weft_bench_spec_") as tmp:
        prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"), a.prompts, a.seed)
        print(f"{a.prompts} prompts of the training task, at most {a.max_tokens} new tokens "
              f"each (end-of-text stops), {a.threads} threads, median of {a.repeats} runs\n")
        one = os.path.join(tmp, "one.jsonl")
        with open(prompts) as f, open(one, "w") as g:
            g.write(f.readline())
        loads = []
        for rep in range(a.repeats):
            loads.append(run_generate(weft, ckpt, one, os.path.join(tmp, "one.out.jsonl"),
                                      a.threads, on_device(settings_of(1, 0, 0, 1, a.seed),
                                                           a.device))["cpu"])
            for temp in temps:
                for B in batches:
                    for k in ks:
                        out = os.path.join(tmp, f"out_{temp}_{B}_{k}.jsonl")
                        run = run_generate(weft, ckpt, prompts, out, a.threads,
                                           on_device(settings_of(B, k, temp, a.max_tokens,
                                                                 a.seed), a.device))
                        if k and not run["spec"]:
                            sys.exit("weft generate wrote no \"speculative\" statistics: does "
                                     "this build have rollout.speculative_tokens?")
                        results.setdefault((temp, B, k), []).append(run)
            print(f"  run {rep + 1}/{a.repeats} done", file=sys.stderr, flush=True)

    load_cpu = statistics.median(loads)
    depth = max(depths, default=0)
    head_acc = " ".join(f"{'acc d' + str(j + 1):>6}" for j in range(depth))
    print(f"{'temp':>4} {'batch':>5} {'k':>2} {'tok/s':>8} {'vs off':>7} {'cpu':>8} {'vs off':>7}  "
          f"{head_acc} "
          f"{'MAL':>5} {'t/ver':>5} {'draft':>6} {'fwd ms':>6} {'dft ms':>6} {'cost':>5} "
          f"{'same':>6} {'others':>6}")
    rows, failed = [], False
    greedy_off = None
    for temp in temps:
        for B in batches:
            off = results[(temp, B, 0)]
            if temp == 0 and greedy_off is None:
                greedy_off = off[0]
            for k in ks:
                runs = results[(temp, B, k)]
                row = summarize(runs, off, k, B, a.prompts, load_cpu)
                row.update(temperature=temp, batch=B)
                same = None
                if temp == 0:  # greedy: every run must equal speculation off's output at the
                    # first batch size, token for token (whatever the batch, too)
                    ref = flat(greedy_off["outputs"])
                    same = min(agreement(flat(r["outputs"]), ref) for r in runs)
                    row["same"] = same
                    failed |= same < 1.0 and a.device == "cpu"
                if k == 0:
                    row["correct"] = correct_share(runs[0])
                rows.append(row)
                print_row(f"{temp:g}", B, row, same, depth)
    print("\nvs off: median of the runs' tokens/s over speculation off's, run by run; cpu: "
          "tokens per CPU second of the process (less a start-up run's), and its ratio; acc dj: "
          "accepted / drafted at depth j; MAL: the engine's mean accepted length (1 + accepted "
          "per verification); t/ver: tokens a verification emitted (MAL counts a bonus token "
          "after a sample's end-of-text); draft: share of engine time in the MTP draft passes; "
          "fwd ms, dft ms (batch 1): milliseconds per main forward and per step's draft passes; "
          "cost: one speculative step's time over a plain step's (t/ver / speedup); same: "
          f"greedy tokens equal to speculation off's at batch {batches[0]}")
    if greedy_off:
        print(f"greedy outputs that are the task's right answer: {correct_share(greedy_off):.1%}")

    prediction = None
    if greedy_off and not a.no_check:
        if importlib.util.find_spec("torch") is None:
            print("(no torch: the teacher-forced prediction is skipped)")
        else:
            prediction = check_prediction(ckpt, greedy_off, depths, rows)
    compare_with_training(acc, prediction, rows, depth)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(model=dict(checkpoint=ckpt, train_steps=a.train_steps, config=cfg),
                           trainer_accuracy=acc, threads=a.threads, prompts=a.prompts,
                           device=a.device,
                           max_tokens=a.max_tokens, repeats=a.repeats, rows=rows,
                           teacher_forced_prediction=prediction), f, indent=2)
    if failed:
        print("FAILED: greedy output with speculation differs from output without")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
