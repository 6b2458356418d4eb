#!/usr/bin/env python3
"""GPU generation throughput: `weft generate` (device=cuda) against Hugging Face `transformers`
`generate` on the same GPU, and against the GPU's memory-bandwidth bound, at several numbers of
concurrent sequences.

    make && python3 bench/gpu_generate_throughput.py --weft build/weft [--model 1b|small]
        [--batches 1,64,256] [--new-tokens 128] [--prompt-tokens 128] [--profile-batches 1,64,256]
        [--json runs/gpu_generate_throughput.json]

Model: bench/gpu_train_throughput.py's (its writer and MODELS): "1b" is a Qwen2-format decoder
of 1.10e9 parameters (TinyLlama's shape, bf16 random weights, no biases), "small" checks the
script itself. Prompts: B random token-id prompts of --prompt-tokens tokens (seed B), written as
{"input_ids": [...]} rows; no tokenizer. Every sample is greedy and runs to --new-tokens new
tokens (no stop token on either side).

Runners, each timed on the generation alone (model loading excluded; prefill included):
- weft: `weft generate ... device=cuda sampling.temperature=0 sampling.max_tokens=N
  sampling.stop_token_ids=[]`; seconds = --stats' generation_seconds (the engine's time). One
  warm-up run at the smallest batch first. Every response must hold N tokens. Its decode steps
  replay recorded CUDA graphs (rollout.cuda_graphs, the default); `--stats` says how many.
- weft eager: the same with rollout.cuda_graphs=false (every kernel launched from the host):
  what the graphs save.
- weft sync, on a GPU: the same with rollout.async_scheduling=false, each decode step launched
  only once the host has read the last one's tokens, where by default it is queued while the last
  one runs (its tokens taken on the GPU, src/rollout/async.c): what hiding the host's turnaround
  gains.
- weft cublas, at batches up to 64 on a GPU: weft with WEFT_CUDA_FEW_ROWS=0, every matmul on
  cuBLASLt, where weft's default multiplies up to 8 rows with its own kernel (few_rows.cu) and
  9 to 64 with its tensor-core one (skinny.cu): what those kernels gain.
- weft splitk, at batches past 64 on a GPU: weft with WEFT_CUDA_GEMM_SPLIT_K=1, cuBLASLt
  splitting K where a product's tiles leave SMs idle (src/backend/cuda/matmul.h; off by
  default): whether it should be the default.
- weft skinny256, at batches past 64 on a GPU: weft with WEFT_CUDA_SKINNY_ROWS=256, the
  products of up to 256 rows on skinny.cu (blocks of 64 rows, x staged in shared memory)
  instead of cuBLASLt: whether it should be the default.
- weft l2x, at batches 33 to 64 on a GPU: weft with WEFT_CUDA_SKINNY_SHARED_X=0, each column
  group of a skinny product reading x from L2, where by default from 33 rows on the block stages
  x in shared memory once for all four: what the staging gains.
- weft noprefetch, at batches up to 64 on a GPU: weft with WEFT_CUDA_PREFETCH_WEIGHTS=0, where
  by default an early-launched few-row or skinny product asks L2 for its weights while the kernel
  before it still runs (common.cuh's fixed_rows): what that prefetch gains.
- weft nofold, at batches up to 8 on a GPU: weft with WEFT_CUDA_FOLD_NORM=0, each RMSNorm and
  the q|k|v split_store their own launches, where by default a forward-only pass's few-row
  q|k|v and gate|up products normalize their rows themselves and the q|k|v one stores its rows
  as split_store would (few_rows.cu): what the 3 launches a layer fewer gain.
- weft invariant, on a GPU: weft with rollout.batch_invariant=true, every row's bits its own
  whatever the batching (every product on skinny.cu, every row's attention paged at fixed
  splits): what byte-identical output across batchings costs.
- weft serial, on a GPU: weft with WEFT_CUDA_EARLY_LAUNCH=0, each kernel launched only once the
  one before it has ended, where weft's default on sm_90 launches it early (programmatic
  dependent launch, kernels.h): what hiding the launches gains.
- weft filtered, on a GPU: weft sampling at temperature 1 with top-k 50, top-p 0.9 and min-p
  0.01, drawn on the device (a radix select a filter, sampling.cu) where greedy takes the
  largest logit: what the filters cost a step.
- weft at --profile-batches (default 1,64,256) under WEFT_CUDA_PROFILE=1, after the default
  cache's peer: the GPU time of every op of the run (kernels launched one by one), printed and
  kept in the JSON: where a decode step goes, for the kernel work that follows.
- transformers default: AutoModelForCausalLM in bf16 on the GPU (its default attention, SDPA
  on torch 2), generate(do_sample=False, min_new_tokens=max_new_tokens=N) with its default
  (dynamic) cache; one identical warm-up call first, then the timed call between
  torch.cuda.synchronize()s. Each (cache, batch) runs in its own process. Qwen2 in
  transformers always has q/k/v biases: they are set to zero (the model has none).
- transformers static: the same with cache_implementation="static" (recent transformers then
  compile the decode step with torch.compile; the warm-up call absorbs the compile).
A runner that cannot run (no transformers, static cache unsupported by the installed version,
out of memory, past --peer-timeout) is reported unavailable with the reason. The runners go one
after another, each at every batch (weft, then the runners that decide a default: sync, cublas,
splitk, skinny256, l2x, noprefetch and nofold; then the default cache and weft's profile; then
weft invariant, eager, serial and filtered; last the static cache, whose compiles take longest:
RUN_ORDER), and the JSON is rewritten after each run, so a run cut off by a time limit keeps
what it measured.

Bound: the tokens/s at which the GPU could stream what each decode step must read, at its
measured copy bandwidth (torch: a 1 GiB device-to-device copy, bytes read + written over the
median of 10 copies). Bytes per decode step = the weights (every matmul, the output head
included, the norms, and B rows of the embedding) + the KV cache read at that step, B x context
x layers x 2 x kv_heads x head_dim, the context averaged over the decode steps (prompt + N/2);
2 bytes an element in bf16. Bound tokens/s = B / (bytes per step / bandwidth). The measured
times include the prefill, which the bound leaves out, so weft/bound is a little below the
decode steps' own fraction of the bound.

`agree`: the share of greedy tokens on which weft and the transformers runner agree, up to each
sample's first difference (random weights leave near ties and bf16 rounding differs, so it need
not be 100%; a low share says the two did not do the same work).

Without a GPU the script says so and exits non-zero. --device cpu checks it end to end on the
CPU (weft device=cpu, transformers fp32 on the CPU, the CPU's copy bandwidth); weft_emulated
(the CUDA backend run on the CPU) also runs device=cuda without a GPU, its peers on
--peer-device (default: --device).
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_train_throughput as gtt  # noqa: E402  (model writer, MODELS; tests/ on the path)
from generate_throughput import agreement  # noqa: E402
from reference.fixtures import gpus_listed  # noqa: E402
from reference.generation import random_prompts, write_prompts  # noqa: E402

# Decode steps replayed as CUDA graphs; replayed with every matmul on cuBLASLt (neither the
# few-row nor the skinny kernel, which serve batches up to SKINNY_ROWS); replayed with cuBLASLt
# splitting K where tiles leave SMs idle (past SKINNY_ROWS); replayed with skinny.cu taking up to
# 256 rows (past SKINNY_ROWS); replayed with x read from L2 by skinny's column groups (33 to
# SKINNY_ROWS); replayed with no weights asked for
# before a product's wait (up to SKINNY_ROWS); batch-invariant; launched kernel by kernel; and
# replayed with each kernel launched after the last ends (no programmatic dependent launch). In
# the order they run (the ones that decide a default first); the environment of each.
DECIDING = ("weft", "sync", "cublas", "splitk", "skinny256", "l2x", "noprefetch", "nofold")
INFORMING = ("invariant", "eager", "serial", "filtered")
WEFT_RUNNERS = DECIDING + INFORMING
RUNNER_ENV = {"cublas": {"WEFT_CUDA_FEW_ROWS": "0"}, "splitk": {"WEFT_CUDA_GEMM_SPLIT_K": "1"},
              "skinny256": {"WEFT_CUDA_SKINNY_ROWS": "256"},
              "l2x": {"WEFT_CUDA_SKINNY_SHARED_X": "0"},
              "noprefetch": {"WEFT_CUDA_PREFETCH_WEIGHTS": "0"},
              "nofold": {"WEFT_CUDA_FOLD_NORM": "0"},
              "serial": {"WEFT_CUDA_EARLY_LAUNCH": "0"}}
RUNNER_SETTINGS = {"eager": ["rollout.cuda_graphs=false"],
                   "sync": ["rollout.async_scheduling=false"],
                   "invariant": ["rollout.batch_invariant=true"],
                   "filtered": ["sampling.temperature=1", "sampling.top_k=50",
                                "sampling.top_p=0.9", "sampling.min_p=0.01"]}
SKINNY_ROWS = 64  # kernels.h's WEFT_CUDA_SKINNY_ROWS
FEW_ROWS = 8  # kernels.h's WEFT_CUDA_FEW_ROWS
PEERS = ("default", "static")  # transformers' caches: its default (dynamic) one, and static
# The runners that decide defaults first, then the peer's default cache and weft's profile, then
# what only informs (the batch-invariant mode's cost, graphs and early launch, already timed on
# an H200), the static cache's compiles last.
RUN_ORDER = DECIDING + ("default", "profile") + INFORMING + ("static",)
BANDWIDTH_BYTES = {"cuda": 1 << 30, "cpu": 1 << 28}  # the copy that measures the bandwidth


# ------------------------------------------------------------------------- bytes and bound ----

def weight_bytes(cfg, batch, elt):
    """Bytes of weights one decode step reads: every matmul (the output head too), the norms,
    and the embedding rows of the batch's tokens."""
    h, I, V, nl = (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"],
                   cfg["num_hidden_layers"])
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // H
    matmuls = nl * (h * H * hd + 2 * h * KV * hd + H * hd * h + 3 * h * I) + V * h
    return elt * (matmuls + (2 * nl + 1) * h + batch * h)


def kv_bytes(cfg, batch, context, elt):
    """Bytes of keys and values one decode step reads at `context` positions per sequence."""
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    return elt * batch * context * cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * hd


def bound(cfg, batch, prompt, new, bandwidth, elt):
    """(bytes per decode step, tokens/s at the bandwidth bound) at `batch` sequences."""
    step = weight_bytes(cfg, batch, elt) + kv_bytes(cfg, batch, prompt + new / 2, elt)
    return step, (batch * bandwidth / step if bandwidth else None)


# --------------------------------------------------------------- the torch side (own process) ----

def measure_bandwidth(torch, device):
    """Copy bandwidth in bytes/s: (read + written) / median time of a large copy."""
    n = BANDWIDTH_BYTES[device]
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    secs = []
    for i in range(12):
        sync()
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        if i >= 2:  # two warm-up copies
            secs.append(time.perf_counter() - t0)
    return 2 * n / statistics.median(secs)


def load_peer_model(torch, model_dir, device):
    """transformers' model of the directory: bf16 on a GPU, fp32 on the CPU; biases zeroed."""
    import transformers
    from transformers import AutoModelForCausalLM
    transformers.logging.set_verbosity_error()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    kw = {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}  # renamed
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kw).to(device=device, dtype=dtype)
    for m in model.modules():  # Qwen2's q/k/v biases, which the checkpoint lacks
        if isinstance(m, torch.nn.Linear) and m.bias is not None:
            m.bias.data.zero_()
    return model.eval()


def peer_generate(torch, a):
    """transformers' greedy generate on the prompts: seconds of the timed call and the tokens."""
    import transformers
    model = load_peer_model(torch, a.model_dir, a.device)
    with open(a.prompts) as f:
        ids = torch.tensor([json.loads(l)["input_ids"] for l in f if l.strip()], device=a.device)
    extra = {"cache_implementation": "static"} if a.peer == "static" else {}
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def greedy():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                              pad_token_id=0, **extra)

    with torch.inference_mode():
        greedy()  # warm-up (and compile, for the static cache on recent versions)
        sync()
        t0 = time.perf_counter()
        out = greedy()
        sync()
        seconds = time.perf_counter() - t0
    return dict(seconds=seconds, tokens=out[:, ids.shape[1]:].tolist(),
                transformers=transformers.__version__)


def peer_main(a):
    """One torch job (a.peer: default, static or bandwidth); prints one JSON line, or
    {"unavailable": reason} when it cannot run."""
    try:
        import torch
        if a.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} sees no CUDA device")
        if a.peer == "bandwidth":
            res = dict(bandwidth=measure_bandwidth(torch, a.device))
        else:
            res = peer_generate(torch, a)
        res.update(torch=torch.__version__, cuda=torch.version.cuda)
    except Exception as e:  # noqa: BLE001: any failure makes this runner unavailable, with why
        reason = (str(e).strip().splitlines() or [""])[0][:300]
        print(json.dumps(dict(unavailable=f"{type(e).__name__}: {reason}")))
        return 1
    print(json.dumps(res))
    return 0


# --------------------------------------------------------------------------------- runners ----

def run_peer(a, mode, device, prompts=None):
    """A torch job in its own process (its GPU memory and compile caches go with it)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--peer", mode, "--device", device,
           "--model-dir", a.mdir, "--new-tokens", str(a.new_tokens)]
    cmd += ["--prompts", prompts] if prompts else []
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=a.peer_timeout)
    except subprocess.TimeoutExpired:
        return dict(unavailable=f"past --peer-timeout {a.peer_timeout} s")
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])  # (gtt.last_line cuts it short)
    except (ValueError, IndexError):
        print(f"torch {mode} failed:\n{r.stderr[-3000:]}")
        return dict(unavailable=f"exit status {r.returncode}: {gtt.last_line(r.stderr)}")


def weft_command(a, prompts, out, stats, settings=()):
    return [a.weft, "generate", "--model", a.mdir, "--prompts", prompts, "--out", out,
            "--stats", stats, f"device={a.device}", "sampling.temperature=0",
            f"sampling.max_tokens={a.new_tokens}", "sampling.stop_token_ids=[]", *settings]


def run_weft(a, prompts, batch, settings=(), profile=False, env=None):
    """weft generate on the prompts: engine seconds, every sample's tokens, steps replayed; with
    `profile`, the CUDA profile's per-op table too (it launches every kernel: no graphs);
    `settings` and `env`: a runner's (RUNNER_SETTINGS, RUNNER_ENV)."""
    out = os.path.join(a.tmp, f"weft_{batch}.out.jsonl")
    stats = out + ".stats.json"
    cmd = weft_command(a, prompts, out, stats, settings)
    profile_json = os.path.join(a.tmp, f"profile_{batch}.json")
    extra = dict(({"WEFT_CUDA_PROFILE": profile_json} if profile else {}), **(env or {}))
    print("$ " + " ".join([f"{k}={v}" for k, v in extra.items()] + cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, **extra))
    if r.returncode != 0:
        print(f"weft failed:\n{r.stdout[-3000:]}")
        return dict(unavailable=f"weft failed: {gtt.last_line(r.stdout)}")
    with open(stats) as f:
        st = json.load(f)
    with open(out) as f:
        tokens = [json.loads(l)["responses"][0]["token_ids"] for l in f if l.strip()]
    short = [i for i, t in enumerate(tokens) if len(t) != a.new_tokens]
    if len(tokens) != batch or short:
        return dict(unavailable=f"{len(tokens)} responses of {batch}, {len(short)} of them not "
                    f"{a.new_tokens} tokens long")
    lines = r.stdout.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("cuda profile")), len(lines))
    table = None
    if profile:
        with open(profile_json) as f:
            table = dict(json.load(f), printed=lines[start:])
    return dict(seconds=st["generation_seconds"], tokens=tokens, stats_tokens=st["tokens"],
                peak_batch=st.get("peak_batch"), forwards=st.get("forwards"),
                graphs=st.get("graphs"), async_steps=st.get("async", {}).get("steps"),
                profile=table)


# ---------------------------------------------------------------------------------- driver ----

def prompts_file(a, batch):
    rows = random_prompts([a.prompt_tokens] * batch, a.cfg["vocab_size"], batch)
    return write_prompts(os.path.join(a.tmp, f"prompts_{batch}.jsonl"), rows)


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def run_one(a, who, batch):
    """One runner (weft or a transformers cache) on `batch` prompts; adds tokens_per_s."""
    prompts = prompts_file(a, batch)
    if who in WEFT_RUNNERS:
        r = run_weft(a, prompts, batch, RUNNER_SETTINGS.get(who, ()), env=RUNNER_ENV.get(who))
    else:
        r = run_peer(a, who, a.peer_device, prompts)
    if "seconds" in r:
        r["tokens_per_s"] = batch * a.new_tokens / r["seconds"]
    tps = fmt(r.get("tokens_per_s"), ".0f")
    g = r.get("graphs")
    replayed = (f" ({g['replayed_steps']} of {r['forwards']} steps replayed from graphs, "
                f"{r.get('async_steps')} queued ahead of the host)" if g else "")
    print(f"  {who} at batch {batch}: {tps} tokens/s{replayed}" if "seconds" in r else
          f"  {who} at batch {batch}: unavailable: {r['unavailable']}", flush=True)
    return r


COLUMNS = WEFT_RUNNERS + PEERS  # a table row's "<who>_tokens_per_s", in the table's order
LABELS = {"weft": "weft tok/s", "default": "tf default", "static": "tf static"}


def make_row(a, batch, runs, bandwidth):
    """A table row out of the runs at `batch` so far (a runner not run yet: None), and the
    bound."""
    tps = {k: runs[k].get("tokens_per_s") if k in runs else None for k in COLUMNS}
    peers = [tps[m] for m in PEERS if tps[m]]
    step_bytes, bound_tps = bound(a.cfg, batch, a.prompt_tokens, a.new_tokens, bandwidth, a.elt)
    w, wt = tps["weft"], runs.get("weft", {}).get("tokens")
    return dict(batch=batch, **{f"{k}_tokens_per_s": tps[k] for k in COLUMNS},
                weft_over_peer=w / max(peers) if w and peers else None,
                bytes_per_step=step_bytes, bound_tokens_per_s=bound_tps,
                weft_over_bound=w / bound_tps if w and bound_tps else None,
                agree={m: agreement(wt, runs[m]["tokens"])
                       for m in PEERS if wt and "tokens" in runs.get(m, {})},
                runs={k: {x: y for x, y in r.items() if x != "tokens"} for k, r in runs.items()})


def column_width(who):
    return max(len(LABELS.get(who, who)), 7)


HEAD = (f"{'batch':>5} " + " ".join(f"{LABELS.get(k, k):>{column_width(k)}}" for k in COLUMNS)
        + f" {'weft/peer':>9} {'bound tok/s':>11} {'weft/bound':>10} {'agree d/s':>13}")


def table_line(row):
    """A row of the table under HEAD (agree: with the default and with the static runner)."""
    agree = "/".join(fmt(row["agree"].get(m), ".1%") for m in PEERS)
    ratio = fmt(row["weft_over_peer"], ".2f") + ("x" if row["weft_over_peer"] else "")
    cells = " ".join(f"{fmt(row.get(f'{k}_tokens_per_s'), '.0f'):>{column_width(k)}}"
                     for k in COLUMNS)
    return (f"{row['batch']:>5} {cells} {ratio:>9} "
            f"{fmt(row['bound_tokens_per_s'], '.0f'):>11} {fmt(row['weft_over_bound'], '.1%'):>10} "
            f"{agree:>13}")


def decision_lines(rows):
    """Each runner that decides a default against weft's defaults, batch by batch: above 1.00x
    its setting is the faster one there (one run each: a few percent is noise)."""
    lines = []
    for who in DECIDING[1:]:
        ratios = [f"{r[f'{who}_tokens_per_s'] / r['weft_tokens_per_s']:.2f}x at {r['batch']}"
                  for r in rows if r.get(f"{who}_tokens_per_s") and r["weft_tokens_per_s"]]
        if ratios:
            how = RUNNER_SETTINGS.get(who) or [f"{k}={v}" for k, v in RUNNER_ENV[who].items()]
            lines.append(f"  {who} ({' '.join(how)}) / weft: {', '.join(ratios)}")
    return lines


def git_commit():
    r = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return r.stdout.strip() or None


def write_json(a, doc):
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)


def batch_list(text):
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive numbers, e.g. 1,64,256")
    return out


def check_device(a):
    """Exits with a message when device=cuda has no GPU to run on (weft_emulated excepted)."""
    if a.device != "cuda" or gpus_listed() > 0:
        return
    if os.path.basename(a.weft).startswith("weft_emulated"):
        print("no GPU listed by nvidia-smi: weft_emulated runs device=cuda on the CPU (a check "
              "of the script, not a measurement)")
        return
    sys.exit("gpu_generate_throughput: no GPU (nvidia-smi lists none); this benchmark needs one. "
             "--device cpu checks the script on the CPU.")


def parse_args():
    p = argparse.ArgumentParser(description="weft generate vs transformers generate tokens/s on "
                                "one GPU, and the bandwidth bound (see the module docstring)")
    p.add_argument("--weft", default=os.path.join(os.path.dirname(HERE), "build", "weft"))
    p.add_argument("--model", choices=sorted(gtt.MODELS), default="1b")
    p.add_argument("--batches", type=batch_list, default=[1, 64, 256],
                   help="comma-separated numbers of concurrent sequences (default 1,64,256)")
    p.add_argument("--profile-batches", type=lambda t: [] if t == "none" else batch_list(t),
                   default=[1, 64, 256], help="batches at which to print weft's GPU time per op "
                   "(CUDA profile, kernels launched one by one), or none (default 1,64,256: a "
                   "step on the few-row kernel, one on the skinny kernel, one on cuBLASLt)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--prompt-tokens", type=int, default=128, help="tokens of each prompt")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="weft's device, and the peers' (cpu: a check of the script)")
    p.add_argument("--peer-device", choices=("cuda", "cpu"),
                   help="the transformers runners' device (default: --device)")
    p.add_argument("--peer-timeout", type=int, default=300, help="seconds per transformers run")
    p.add_argument("--json", default=os.path.join(os.path.dirname(HERE), "runs",
                                                  "gpu_generate_throughput.json"))
    # A torch job's own process (run_peer): which one, on which model and prompts.
    p.add_argument("--peer", choices=PEERS + ("bandwidth",), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.new_tokens < 1 or a.prompt_tokens < 1:
        p.error("--new-tokens and --prompt-tokens must be at least 1")
    a.peer_device = a.peer_device or a.device
    return a


def main():
    a = parse_args()
    if a.peer:
        return peer_main(a)
    a.weft = os.path.abspath(a.weft)
    if not os.access(a.weft, os.X_OK):
        sys.exit(f"{a.weft}: not an executable; build it with `make` or pass --weft PATH")
    check_device(a)
    a.cfg = gtt.MODELS[a.model]
    a.elt = 2 if a.device == "cuda" else 4  # bf16 weights and KV on the GPU, fp32 on the CPU
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a time limit: remove a.tmp too
    with tempfile.TemporaryDirectory(prefix="weft_gpu_generate_") as a.tmp:
        return run(a)


def per_forward(table, forwards):
    """The profile's kernels and GPU time per forward (prefill and decode steps alike; copies
    apart): how many launches a step makes, which graphs replay but do not remove."""
    kernels = [o for o in table["ops"] if o["op"] not in ("upload", "download")]
    launches = sum(o["calls"] for o in kernels) / forwards
    own = sum(o["own_ms"] for o in kernels) / forwards
    idle = sum(o["idle_ms"] for o in kernels) / forwards
    matmuls = sum(o["calls"] for o in kernels if o["op"].startswith("matmul")) / forwards
    return dict(forwards=forwards, launches=launches, matmuls=matmuls, own_ms=own, idle_ms=idle,
                printed=f"per forward ({forwards} forwards): {launches:.1f} kernel launches "
                        f"({matmuls:.1f} matmuls), {own:.3f} ms of their own GPU time, "
                        f"{idle:.3f} ms idle before them")


def profile(a, doc):
    """weft's GPU time per op at each of a.profile_batches: where a decode step goes."""
    for batch in a.profile_batches if a.device == "cuda" else []:
        print(f"weft's GPU time per op at batch {batch} (every kernel launched, no graphs):")
        r = run_weft(a, prompts_file(a, batch), batch, RUNNER_SETTINGS["eager"], profile=True)
        doc.setdefault("profiles", {})[str(batch)] = r.get("profile") or r.get("unavailable")
        print("\n".join(r["profile"]["printed"] if r.get("profile") else
                        [r.get("unavailable", "")]), flush=True)
        if r.get("profile") and r.get("forwards"):
            r["profile"]["per_forward"] = per_forward(r["profile"], r["forwards"])
            print(r["profile"]["per_forward"]["printed"], flush=True)
        write_json(a, doc)


def run(a):
    """The benchmark, in the temporary directory a.tmp (the model is 2.2 GB at 1b)."""
    a.mdir = os.path.join(a.tmp, "model")
    n_params = gtt.write_model(a.mdir, a.cfg)
    gpu = gtt.gpu_name() if a.device == "cuda" else "cpu"
    bw = run_peer(a, "bandwidth", a.device)
    bandwidth = bw.get("bandwidth")
    why = f" ({bw['unavailable']})" if "unavailable" in bw else ""
    print(f"GPU: {gpu}; copy bandwidth {fmt(bandwidth and bandwidth / 1e9, '.0f')} GB/s{why}")
    print(f"model {a.model}: {n_params / 1e9:.3f}e9 parameters, weights of one decode step "
          f"{weight_bytes(a.cfg, 1, a.elt) / 1e9:.2f} GB ({a.elt} bytes each); prompts of "
          f"{a.prompt_tokens} tokens, {a.new_tokens} new (greedy)", flush=True)
    print("weft warm-up:", flush=True)
    run_weft(a, prompts_file(a, min(a.batches)), min(a.batches))
    doc = dict(gpu=gpu, device=a.device, peer_device=a.peer_device, model=a.model,
               params=n_params, prompt_tokens=a.prompt_tokens, new_tokens=a.new_tokens,
               bandwidth=bandwidth, bandwidth_note=bw.get("unavailable"), torch=bw.get("torch"),
               cuda=bw.get("cuda"), weft=a.weft, commit=git_commit(), rows=[])
    # Runner after runner, each at every batch, in RUN_ORDER: a run cut off by a time limit keeps
    # weft's numbers and those that decide its defaults, the default cache's and weft's profile
    # (on the H100 the static cache's compiles at batch 256 outlasted the session step's 300 s).
    runs = {batch: {} for batch in a.batches}
    for who in RUN_ORDER:
        if who == "profile":
            profile(a, doc)
            continue
        for batch in a.batches:
            if ((who in RUNNER_ENV or who in ("sync", "invariant", "filtered"))
                    and a.device != "cuda"
                    or who in ("cublas", "noprefetch") and batch > SKINNY_ROWS
                    or who in ("splitk", "skinny256") and batch <= SKINNY_ROWS
                    or who == "l2x" and not 32 < batch <= SKINNY_ROWS
                    or who == "nofold" and batch > FEW_ROWS):
                continue  # the same kernels and launches as "weft" there
            runs[batch][who] = run_one(a, who, batch)
            doc["rows"] = [make_row(a, b, runs[b], bandwidth) for b in a.batches]
            doc["transformers"] = doc.get("transformers") or runs[batch][who].get("transformers")
            write_json(a, doc)
    print(f"\n{HEAD}")
    for row in doc["rows"]:
        print(table_line(row))
    print("the runners that decide defaults, against weft's defaults:")
    print("\n".join(decision_lines(doc["rows"])) or "  none run")
    print(f"wrote {a.json}")
    return 0 if all(r["weft_tokens_per_s"] for r in doc["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
