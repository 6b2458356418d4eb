#!/usr/bin/env python3
"""Generation tokens/s of `weft generate` against Hugging Face `transformers` `generate` on the CPU.

The same model (a Qwen2 written by transformers' save_pretrained, fp32, random weights: the
"small" (4M parameters) and "medium" (28M) shapes of train_throughput.py), the same prompts (B
random prompts of 128 tokens),
the same threads, greedy, 128 new tokens each (no end-of-text: every sample runs to the limit).
Timed: generation alone (weft's engine time from --stats, transformers' generate() call), model
loading excluded. The peer runs in a subprocess as the strongest CPU PyTorch a user would get on
this machine: OPENBLAS_CORETYPE=SKYLAKEX on AVX-512 CPUs (the core-type fix weft applies to
itself) and the OpenMP OpenBLAS that weft links, so both share one thread pool per process
(see train_throughput.py). transformers uses its default dynamic cache, eager attention
(torch 1.13 has no SDPA path in transformers 4.45).

Prints, per batch size, tokens/s of both and the ratio weft / transformers, the share of greedy
tokens on which the two agree (a check that both did the same work; random weights leave near
ties, so it need not be 100%), and how many cores other processes used meanwhile (trust a row
only when that is near 0). With --repeats N each row runs both engines N times, interleaved, and
gives the median tokens/s of each, the median of the run-by-run ratios and their range (a shared
machine's speed can swing by a fifth between runs). Writes the table as JSON with --json.

With --shared-prefix N every prompt starts with the same N tokens (a system prompt or few-shot
examples, as in most RL datasets) before its own 128: weft also runs with
rollout.prefix_caching=false, and the row adds that run's tokens/s and the gain of caching
(weft computes the shared tokens once; transformers' generate has no cache across prompts).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "tests"))
import train_throughput as tt  # noqa: E402  (its process and BLAS helpers)

MODELS = {name: {k: v for k, v in cfg.items() if k != "attention_bias"}  # Qwen2 always has it
          for name, cfg in tt.MODELS}
PROMPT_LEN = 128


def write_model(mdir, shape, seed=0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(**shape, max_position_embeddings=2048, eos_token_id=None, bos_token_id=None)
    Qwen2ForCausalLM(cfg).float().save_pretrained(mdir, safe_serialization=True)


def peer_main(a):
    """In the subprocess: transformers' greedy generate on the prompts; prints one JSON line."""
    import time

    import torch
    from transformers import Qwen2ForCausalLM
    torch.set_num_threads(a.threads)
    model = Qwen2ForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
    with open(a.prompts) as f:
        ids = torch.tensor([json.loads(line)["input_ids"] for line in f])
    with torch.no_grad():
        def greedy(x, n):
            return model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                  pad_token_id=0, max_new_tokens=n, min_new_tokens=n)
        greedy(ids[:1, :8], 2)  # warm-up
        t0 = time.time()
        out = greedy(ids, a.new_tokens)
        seconds = time.time() - t0
    print(json.dumps({"seconds": seconds, "tokens": out[:, ids.shape[1]:].tolist()}))


def run_weft(weft, mdir, prompts, out, threads, new_tokens, *settings):
    stats = out + ".stats.json"
    cmd = [weft, "generate", "--model", mdir, "--prompts", prompts, "--out", out, "--stats",
           stats, "sampling.temperature=0", f"sampling.max_tokens={new_tokens}",
           "sampling.stop_token_ids=[]", *settings]
    r, wall, other = tt.run_measured(cmd, tt.base_env(threads))
    if r.returncode != 0:
        sys.exit(f"weft failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    with open(stats) as f:
        st = json.load(f)
    with open(out) as f:
        tokens = [json.loads(line)["responses"][0]["token_ids"] for line in f]
    return dict(seconds=st["generation_seconds"], tokens=tokens, other=other,
                prefix_hits=st.get("prefix_cache", {}).get("hit_positions", 0))


def run_peer(mdir, prompts, threads, new_tokens, env_extra):
    env = tt.base_env(threads)
    env.update(env_extra)
    cmd = [sys.executable, os.path.abspath(__file__), "--peer", "--model", mdir, "--prompts",
           prompts, "--threads", str(threads), "--new-tokens", str(new_tokens)]
    r, wall, other = tt.run_measured(cmd, env)
    if r.returncode != 0:
        sys.exit(f"transformers peer failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["other"] = other
    return res


def peer_env(weft):
    """The strongest PyTorch setting on this machine (see the module docstring)."""
    env = {}
    with open("/proc/cpuinfo") as f:
        if "avx512f" in f.read():
            env["OPENBLAS_CORETYPE"] = "SKYLAKEX"
    omp_dir = tt.weft_blas_dir(weft)
    if omp_dir:
        ld = os.environ.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = omp_dir + (":" + ld if ld else "")
    return env


def agreement(a, b):
    """Share of positions where both generated the same token, up to each sample's first
    difference (after one, the contexts differ and so may everything after)."""
    same = total = 0
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), len(x))
        same, total = same + n, total + len(x)
    return same / total if total else 0.0


def measure(weft, name, mdir, B, tmp, a, env):
    """One table row: both engines on B prompts, a.repeats times each, interleaved (weft, then
    transformers): medians, and the median and range of the run-by-run ratios."""
    from reference.generation import random_prompts, write_prompts
    vocab = MODELS[name]["vocab_size"]
    shared = random_prompts([a.shared_prefix], vocab, 1000)[0]
    prompts = write_prompts(os.path.join(tmp, f"{name}_{B}.jsonl"),
                            [shared + p for p in random_prompts([PROMPT_LEN] * B, vocab, B)])
    out = os.path.join(tmp, f"{name}_{B}.out.jsonl")
    runs, uncached = [], []
    for _ in range(a.repeats):
        w = run_weft(weft, mdir, prompts, out, a.threads, a.new_tokens)
        if a.shared_prefix:
            uncached.append(run_weft(weft, mdir, prompts, out, a.threads, a.new_tokens,
                                     "rollout.prefix_caching=false"))
        p = run_peer(mdir, prompts, a.threads, a.new_tokens, env)
        runs.append((w, p))
    n = B * a.new_tokens
    ratios = [p["seconds"] / w["seconds"] for w, p in runs]
    last_w, last_p = runs[-1]  # greedy: every run's tokens are the same
    row = dict(model=name, batch=B,
               weft_tokens_per_s=n / statistics.median(w["seconds"] for w, _ in runs),
               transformers_tokens_per_s=n / statistics.median(p["seconds"] for _, p in runs),
               ratio=statistics.median(ratios), ratio_range=[min(ratios), max(ratios)],
               runs=len(runs), agree=agreement(last_w["tokens"], last_p["tokens"]),
               others=max(max(w["other"] or 0, p["other"] or 0) for w, p in runs))
    spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(runs) > 1 else ""
    cached = ""
    if uncached:
        row["weft_uncached_tokens_per_s"] = n / statistics.median(u["seconds"] for u in uncached)
        row["prefix_cache_gain"] = row["weft_tokens_per_s"] / row["weft_uncached_tokens_per_s"]
        row["prefix_hit_positions"] = last_w["prefix_hits"]
        cached = (f" {row['weft_uncached_tokens_per_s']:11.0f} {row['prefix_cache_gain']:5.2f}x "
                  f"{row['prefix_hit_positions']:8.0f}")
    print(f"{name:>6} {B:5d} {row['weft_tokens_per_s']:11.0f} "
          f"{row['transformers_tokens_per_s']:13.0f} {row['ratio']:5.2f}x{spread} "
          f"{row['agree']:6.1%} {row['others']:7.2f}{cached}")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"), help="the weft binary")
    ap.add_argument("--threads", type=int, default=2, help="threads for both")
    ap.add_argument("--batches", default="1,32", help="comma-separated numbers of prompts")
    ap.add_argument("--models", default="small,medium", help="comma-separated: small,medium")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each engine per row, interleaved; the row gives medians and "
                         "the ratios' range (use 3 or more on a shared machine)")
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="tokens every prompt starts with (the same ones) before its own "
                         f"{PROMPT_LEN}; adds weft without prefix caching to each row")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        return peer_main(a)
    weft = os.path.abspath(a.weft)
    if not os.access(weft, os.X_OK):
        sys.exit(f"{weft}: not an executable; build it with `make` or pass --weft PATH")
    import transformers

    env = peer_env(weft)
    shared = f"{a.shared_prefix} shared + " if a.shared_prefix else ""
    print(f"prompts of {shared}{PROMPT_LEN} tokens, {a.new_tokens} new (greedy), fp32, "
          f"{a.threads} threads; peer: transformers {transformers.__version__} generate, "
          f"{' '.join(f'{k}={v}' for k, v in env.items()) or 'as shipped'}")
    print(f"{'model':>6} {'batch':>5} {'weft tok/s':>11} {'transformers':>13} {'ratio':>6} "
          f"{'agree':>6} {'others':>7}" +
          (f" {'no cache':>11} {'gain':>6} {'found':>8}" if a.shared_prefix else ""))
    rows = []
    with tempfile.TemporaryDirectory(prefix="weft_bench_generate_") as tmp:
        for name in a.models.split(","):
            if name not in MODELS:
                ap.error(f"unknown model {name!r}; choose from {list(MODELS)}")
            mdir = os.path.join(tmp, name)
            write_model(mdir, MODELS[name])
            for B in [int(x) for x in a.batches.split(",")]:
                rows.append(measure(weft, name, mdir, B, tmp, a, env))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(threads=a.threads, new_tokens=a.new_tokens, repeats=a.repeats,
                           shared_prefix=a.shared_prefix, rows=rows), f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
