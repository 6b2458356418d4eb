"""GPU training throughput and MFU: weft (device=cuda) against PyTorch on the same GPU, same
model, same packed micro-batches, same optimizer and learning rate, in the same run.

    make && /usr/bin/python3 bench/gpu_train_throughput.py --weft build/weft [--steps 6]
        [--model 1b|small] [--shapes 4k,16k,32k] [--out runs/gpu_train_throughput.json]

Model "1b": a Qwen2-format decoder of 1.10e9 parameters (TinyLlama's shape: hidden 2048,
intermediate 5632, 22 layers, 32 heads / 4 kv heads, head_dim 64, vocab 32000, untied, no
biases). "small" (hidden 512, 4 layers) checks the script itself in seconds.

Step shapes (--shapes), each a separate run of every runner on its own batch:
  4k:  4 micro-batches of exactly 4096 packed tokens (documents 2048, 1024, 512, 512): 16384
       tokens per step, gradient accumulation over 4 micro-batches;
  16k: 1 micro-batch of one 16384-token document: 16384 tokens per step;
  32k: 1 micro-batch of one 32768-token document: 32768 tokens per step.
Every document's first tokens are a masked prompt. A step is forward + backward of each
micro-batch, global clip, AdamW at a constant learning rate (weft: optim.warmup_steps=0 and
optim.min_lr = optim.lr, so both sides take the same updates and their losses compare). Step 1
warms up (and compiles); the median of the others is reported.

Runners:
- weft: `weft grad ... device=cuda train.steps=K train.max_tokens_per_microbatch=<shape's>`:
  bf16 weights and activations, fp32 gradients and master weights, cuBLASLt GEMMs, weft's kernels.
- torch eager: the usual mixed-precision recipe: fp32 parameters under torch.autocast(bfloat16),
  F.scaled_dot_product_attention(is_causal=True) per document, fused AdamW, clip_grad_norm_;
  weights from the same safetensors.
- torch compile: the same model under torch.compile(model) (inductor; needs triton). A runner
  that cannot run (no triton, out of memory, ...) is reported unavailable with the reason.

MFU = model FLOPs per step / (step seconds x peak dense bf16 FLOP/s of the GPU). Model FLOPs:
6 x tokens x (matmul parameters, the output head included, the embedding lookup not) plus causal
attention, 12 x layers x heads x head_dim x sum over the step's documents of L(L+1)/2 (QK^T and
PV, forward and backward). Peak: 989e12 for H100 SXM and H200, 756e12 for H100 PCIe; --peak
overrides.
"""

import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

MODELS = {
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4),
    "small": dict(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4),
}
# Per step shape: the documents of one micro-batch, their masked prompt tokens, and micro-batches
# per step. A micro-batch holds exactly sum(docs) tokens, weft's train.max_tokens_per_microbatch.
SHAPES = {
    "4k": dict(docs=(2048, 1024, 512, 512), prompts=(128, 64, 0, 32), micro_batches=4),
    "16k": dict(docs=(16384,), prompts=(128,), micro_batches=1),
    "32k": dict(docs=(32768,), prompts=(128,), micro_batches=1),
}
PEERS = ("eager", "compile")  # torch runners: plain autocast, and the same under torch.compile
OPTIM = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip=1.0)
STEP_RE = re.compile(r"^step (\d+)/(\d+): loss ([-+0-9.eEnaif]+), .*?, ([0-9.]+) s, ")
PEAKS = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12}


def write_model(dir, cfg, seed=0, std=0.02):
    """config.json and a BF16 model.safetensors with N(0, std^2) matrices and unit norms."""
    os.makedirs(dir, exist_ok=True)
    h, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // H
    shapes = {"model.embed_tokens.weight": (V, h), "model.norm.weight": (h,),
              "lm_head.weight": (V, h)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (H * hd, h),
                       p + "self_attn.k_proj.weight": (KV * hd, h),
                       p + "self_attn.v_proj.weight": (KV * hd, h),
                       p + "self_attn.o_proj.weight": (h, H * hd),
                       p + "mlp.gate_proj.weight": (I, h), p + "mlp.up_proj.weight": (I, h),
                       p + "mlp.down_proj.weight": (h, I)})
    rng = np.random.default_rng(seed)
    # transformers' from_pretrained refuses a file whose metadata lacks "format": "pt"
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(shapes):
        n = int(np.prod(shapes[name]))
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]),
                        "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(os.path.join(dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name in sorted(shapes):
            if name.endswith("norm.weight"):
                a = np.ones(shapes[name], dtype=np.float32)
            else:
                a = (rng.standard_normal(shapes[name], dtype=np.float32) * std)
            f.write((a.view(np.uint32) >> 16).astype(np.uint16).tobytes())  # truncate to bf16
    conf = dict(cfg, model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu",
                rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                attention_bias=False, torch_dtype="bfloat16")
    with open(os.path.join(dir, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    return sum(int(np.prod(s)) for s in shapes.values())


def shape_tokens(shape):
    """(tokens per micro-batch, tokens per step) of a SHAPES entry."""
    micro = sum(shape["docs"])
    return micro, micro * shape["micro_batches"]


def write_batch(path, vocab, shape, seed=1):
    """The step's documents, micro-batch after micro-batch, as JSONL rows of token ids."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(shape["micro_batches"]):
            for L, P in zip(shape["docs"], shape["prompts"]):
                ids = rng.integers(0, vocab, L).tolist()
                f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * P + [1] * (L - P)}) + "\n")


def model_flops(cfg, shape):
    """Model FLOPs of one step of `shape`: matmuls of every token, plus causal attention."""
    h, I, V, nl = (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"],
                   cfg["num_hidden_layers"])
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // H
    matmul_params = nl * (h * H * hd + 2 * h * KV * hd + H * hd * h + 3 * h * I) + V * h
    _, tokens = shape_tokens(shape)
    pairs = shape["micro_batches"] * sum(L * (L + 1) // 2 for L in shape["docs"])
    return 6 * tokens * matmul_params + 12 * nl * H * hd * pairs


# ------------------------------------------------------------------------------ the peer ----

def peer_model(cfg):
    """The torch model of config.json's Qwen2 decoder (fp32 parameters, on the CPU)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    V, h, I = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    H, KV, nl = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    hd, eps = h // H, cfg["rms_norm_eps"]

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * self.weight.to(x.dtype)

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(h), RMSNorm(h)
            self.q_proj = nn.Linear(h, H * hd, bias=False)
            self.k_proj = nn.Linear(h, KV * hd, bias=False)
            self.v_proj = nn.Linear(h, KV * hd, bias=False)
            self.o_proj = nn.Linear(H * hd, h, bias=False)
            self.gate_proj = nn.Linear(h, I, bias=False)
            self.up_proj = nn.Linear(h, I, bias=False)
            self.down_proj = nn.Linear(I, h, bias=False)

        def forward(self, x, cos, sin, lengths):
            T = x.shape[0]
            y = self.input_layernorm(x)
            q = self.q_proj(y).view(T, H, hd)
            k = self.k_proj(y).view(T, KV, hd)
            v = self.v_proj(y).view(T, KV, hd)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            q = q.transpose(0, 1)
            k = k.repeat_interleave(H // KV, dim=1).transpose(0, 1)
            v = v.repeat_interleave(H // KV, dim=1).transpose(0, 1)
            outs = [F.scaled_dot_product_attention(qd[None], kd[None], vd[None], is_causal=True)[0]
                    for qd, kd, vd in zip(q.split(lengths, 1), k.split(lengths, 1),
                                          v.split(lengths, 1))]
            o = torch.cat(outs, dim=1).transpose(0, 1).reshape(T, H * hd)
            x = x + self.o_proj(o)
            y = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, h)
            self.layers = nn.ModuleList(Layer() for _ in range(nl))
            self.norm = RMSNorm(h)
            self.lm_head = nn.Linear(h, V, bias=False)

        def forward(self, ids, labels, n_targets, cos, sin, lengths):
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x = layer(x, cos, sin, lengths)
            logits = self.lm_head(self.norm(x))
            return F.cross_entropy(logits.float(), labels, ignore_index=-100,
                                   reduction="sum") / n_targets

    return Model()


def peer_load(model, mdir):
    """The weights of mdir's model.safetensors, the names mapped to peer_model's."""
    import torch
    from reference import files

    sd = {}
    for k, v in files.read_safetensors(os.path.join(mdir, "model.safetensors")).items():
        k = k.replace("model.", "", 1) if k.startswith("model.") else k
        k = k.replace("self_attn.", "").replace("mlp.", "")
        sd[k] = torch.from_numpy(np.asarray(v, dtype=np.float32))
    model.load_state_dict(sd, strict=True)


def peer_batches(cfg, path, shape, dev):
    """The batch file's micro-batches as (ids, labels, cos, sin, lengths), and the step's count
    of loss targets (every micro-batch's loss is a share of the step's mean)."""
    import torch

    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    with open(path) as f:
        docs = [json.loads(l) for l in f if l.strip()]
    per, micro, n_targets = len(shape["docs"]), [], 0
    for m in range(shape["micro_batches"]):
        ids, labels, pos, lengths = [], [], [], []
        for d in docs[m * per:(m + 1) * per]:
            t, mask = d["input_ids"], d["loss_mask"]
            ids += t
            labels += [t[i + 1] if mask[i + 1] else -100 for i in range(len(t) - 1)] + [-100]
            pos += range(len(t))
            lengths.append(len(t))
        inv = cfg["rope_theta"] ** (-(torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.tensor(pos, dtype=torch.float64)[:, None] * inv[None, :]
        cos = torch.cat((ang.cos(), ang.cos()), -1)[:, None, :].to(dev, torch.bfloat16)
        sin = torch.cat((ang.sin(), ang.sin()), -1)[:, None, :].to(dev, torch.bfloat16)
        lab = torch.tensor(labels, device=dev)
        n_targets += int((lab != -100).sum())
        micro.append((torch.tensor(ids, device=dev), lab, cos, sin, lengths))
    return micro, n_targets


def peer_steps(model, run, micro, n_targets, steps):
    """`steps` AdamW steps of `run` (the model, or its compiled form): seconds and losses."""
    import torch

    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() == 2],
                              "weight_decay": OPTIM["weight_decay"]},
                             {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}],
                            lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"], fused=True)
    secs, losses = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for ids, lab, cos, sin, lengths in micro:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = run(ids, lab, n_targets, cos, sin, lengths)
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(params, OPTIM["clip"])
        opt.step()
        torch.cuda.synchronize()
        secs.append(time.perf_counter() - t0)
        losses.append(float(total))
    return secs, losses


def compile_unavailable(torch):
    """Why torch.compile cannot run here, or None."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile (2.0 or later needed)"
    try:
        import triton  # noqa: F401  (inductor's GPU code generator)
    except ImportError as e:
        return f"no triton, which torch.compile's inductor backend needs ({e})"
    return None


def peer_main(a):
    """One torch runner (a.peer: eager or compile) on one shape; writes one JSON record to
    a.result: seconds and losses, or {"unavailable": reason} when it cannot run."""
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} sees no CUDA device")
        why = compile_unavailable(torch) if a.peer == "compile" else None
        if why:
            raise RuntimeError(why)
        with open(os.path.join(a.model_dir, "config.json")) as f:
            cfg = json.load(f)
        dev = torch.device("cuda")
        model = peer_model(cfg)
        peer_load(model, a.model_dir)
        model.to(dev)
        micro, n_targets = peer_batches(cfg, a.batch, SHAPES[a.shape], dev)
        run = torch.compile(model) if a.peer == "compile" else model
        secs, losses = peer_steps(model, run, micro, n_targets, a.steps)
    except Exception as e:  # noqa: BLE001: any failure makes this runner unavailable, with why
        reason = (str(e).strip().splitlines() or [""])[0][:300]
        write_result(a.result, dict(unavailable=f"{type(e).__name__}: {reason}"))
        return 1
    write_result(a.result, dict(seconds=secs, losses=losses, torch=torch.__version__,
                                peak_memory=torch.cuda.max_memory_allocated()))
    return 0


def write_result(path, record):
    """The runner's one JSON record, into its own file: stdout is shared with whatever torch and
    its libraries print (on the H100 the peers' last stdout line was not the record, and both
    peers were reported unavailable after a run that had worked)."""
    text = json.dumps(record)
    print(text, flush=True)
    with open(path, "w") as f:
        f.write(text + "\n")


# ------------------------------------------------------------------------------ the driver ----

def gpu_name():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           stdout=subprocess.PIPE, text=True, timeout=30)
        return r.stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown GPU"


def peak_flops(name):
    for key, value in PEAKS.items():  # "H100 PCIe" before the plain "H100"
        if key in name:
            return value
    return None


def weft_command(a, mdir, batch, shape, device="cuda"):
    """weft grad taking a.steps AdamW steps on the batch at the peer's constant learning rate."""
    micro, _ = shape_tokens(shape)
    o = OPTIM
    return [a.weft, "grad", "--model", mdir, "--batch", batch, "--out",
            os.path.join(a.tmp, "weft_out.safetensors"), f"device={device}",
            f"train.steps={a.steps}", f"train.max_tokens_per_microbatch={micro}",
            f"optim.lr={o['lr']}", f"optim.min_lr={o['lr']}", "optim.warmup_steps=0",
            f"optim.beta1={o['betas'][0]}", f"optim.beta2={o['betas'][1]}", f"optim.eps={o['eps']}",
            f"optim.weight_decay={o['weight_decay']}", f"optim.clip_grad={o['clip']}"]


def last_line(text):
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1][:300] if lines else "no output"


def run_weft(a, mdir, batch, shape):
    cmd = weft_command(a, mdir, batch, shape)
    print("$ " + " ".join(cmd), flush=True)
    env = dict(os.environ, WEFT_CUDA_PROFILE="1") if a.profile else None
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        print(f"weft failed:\n{r.stdout[-3000:]}")
        return dict(unavailable=f"weft failed: {last_line(r.stdout)}")
    if a.profile:  # the backend's per-op table, printed when it shuts down
        lines = r.stdout.splitlines()
        start = next((i for i, l in enumerate(lines) if l.startswith("cuda profile")), len(lines))
        print("\n".join(lines[start:]))
    steps = [m for m in map(STEP_RE.match, r.stdout.splitlines()) if m]
    if not steps:
        return dict(unavailable=f"no step lines in weft's output: {last_line(r.stdout)}")
    return dict(seconds=[float(m.group(4)) for m in steps],
                losses=[float(m.group(3)) for m in steps])


def run_peer(a, mdir, batch, shape_name, mode):
    """A torch runner in its own process (its memory and compile caches go with it)."""
    result = os.path.join(a.tmp, f"peer_{mode}_{shape_name}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--peer", mode, "--model-dir", mdir,
           "--batch", batch, "--shape", shape_name, "--steps", str(a.steps), "--result", result]
    env = dict(os.environ)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        with open(result) as f:
            return json.load(f)
    except (OSError, ValueError):
        print(f"torch {mode} failed (exit status {r.returncode}); its stdout ends:\n"
              f"{r.stdout[-1500:]}\nits stderr ends:\n{r.stderr[-3000:]}")
        return dict(unavailable=f"exit status {r.returncode}: "
                                f"{last_line(r.stderr + chr(10) + r.stdout)}")


def report(results, tokens, flops, peak):
    """Prints a row per runner, adding step_ms, tokens_per_s, mfu and weft_ratio (weft's
    tokens/s over the row's; also its MFU ratio and step-time ratio, as tokens and FLOPs match)."""
    print(f"  {'runner':<14} {'step ms':>9} {'tokens/s':>10} {'MFU':>6} {'weft/this':>9}  losses")
    for who, r in results.items():
        if "unavailable" in r:
            print(f"  {who:<14} unavailable: {r['unavailable']}")
            continue
        s = statistics.median(r["seconds"][1:] or r["seconds"])
        r.update(step_ms=s * 1e3, tokens_per_s=tokens / s,
                 mfu=flops / (s * peak) if peak else float("nan"))
        w = results["weft"]
        r["weft_ratio"] = w["tokens_per_s"] / r["tokens_per_s"] if "tokens_per_s" in w else None
        ratio = f"{r['weft_ratio']:.2f}x" if r["weft_ratio"] else "-"
        print(f"  {who:<14} {r['step_ms']:9.1f} {r['tokens_per_s']:10.0f} "
              f"{r['mfu'] * 100:5.1f}% {ratio:>9}  {' '.join(f'{x:.4f}' for x in r['losses'])}")


def batch_path(a, name):
    return os.path.join(a.tmp, f"batch_{name}.jsonl")


def shape_header(name, record):
    print(f"\nshape {name}: {record['tokens']} tokens per step in {record['micro_batches']} "
          f"micro-batch(es) of {record['tokens'] // record['micro_batches']} (documents "
          f"{', '.join(map(str, record['docs']))}); {record['flops'] / 1e12:.1f} TFLOP/step",
          flush=True)


def weft_on_shape(a, name, cfg, mdir, peak):
    """weft on one step shape; returns the shape's JSON record, its results weft's alone."""
    shape = SHAPES[name]
    _, tokens = shape_tokens(shape)
    record = dict(docs=shape["docs"], micro_batches=shape["micro_batches"], tokens=tokens,
                  flops=model_flops(cfg, shape))
    shape_header(name, record)
    write_batch(batch_path(a, name), cfg["vocab_size"], shape)
    record["results"] = {"weft": run_weft(a, mdir, batch_path(a, name), shape)}
    report(record["results"], tokens, record["flops"], peak)
    return record


def peers_on_shape(a, name, record, mdir, peak):
    """The torch runners on a shape weft ran, then the shape's whole table again."""
    shape_header(name, record)
    for mode in PEERS:
        record["results"][f"torch {mode}"] = run_peer(a, mdir, batch_path(a, name), name, mode)
    report(record["results"], record["tokens"], record["flops"], peak)


def shape_list(text):
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SHAPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown shape(s) {bad}; choose from {sorted(SHAPES)}")
    return names


def main():
    p = argparse.ArgumentParser(description="weft vs PyTorch training throughput and MFU on "
                                "one GPU (see the module docstring)")
    p.add_argument("--weft", default=os.path.join(os.path.dirname(HERE), "build", "weft"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--model", choices=sorted(MODELS), default="1b")
    p.add_argument("--shapes", type=shape_list, default=list(SHAPES),
                   help=f"comma-separated step shapes out of {','.join(SHAPES)} (default: all)")
    p.add_argument("--peak", type=float, help="peak dense bf16 FLOP/s (default: by GPU name)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "runs",
                                                 "gpu_train_throughput.json"))
    p.add_argument("--profile", action="store_true",
                   help="print weft's GPU time per op (WEFT_CUDA_PROFILE=1); skips PyTorch")
    # The torch runner's own process (run_peer): which runner, on which model directory and batch.
    p.add_argument("--peer", choices=PEERS, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--batch", help=argparse.SUPPRESS)
    p.add_argument("--shape", choices=sorted(SHAPES), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.peer:
        if not (a.model_dir and os.path.isdir(a.model_dir) and a.batch and a.shape and a.result):
            p.error("--peer needs --model-dir DIR, --batch FILE, --shape and --result FILE")
        return peer_main(a)

    cfg = MODELS[a.model]
    name = gpu_name()
    peak = a.peak or peak_flops(name)
    a.tmp = tempfile.mkdtemp(prefix="weft_gpu_bench_")
    mdir = os.path.join(a.tmp, "model")
    n_params = write_model(mdir, cfg)
    print(f"GPU: {name}; peak bf16 {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s")
    print(f"model {a.model}: {n_params / 1e9:.3f}e9 parameters; AdamW at a constant lr "
          f"{OPTIM['lr']:g}; step 1 warms up, the median of steps 2-{a.steps} is reported")
    shapes = {}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    def save():  # after each shape's runs: a run cut off by a time limit keeps what it measured
        with open(a.out, "w") as f:
            json.dump(dict(gpu=name, peak=peak, model=a.model, params=n_params, optim=OPTIM,
                           steps=a.steps, shapes=shapes), f, indent=1)

    # weft on every shape first, then the peers (torch.compile's compiles take minutes), so a
    # session's time limit cuts peers rather than weft's long-document shapes.
    for s in a.shapes:
        shapes[s] = weft_on_shape(a, s, cfg, mdir, peak)
        save()
    if not a.profile:
        print("\nthe PyTorch peers on the same shapes:")
        for s in a.shapes:
            peers_on_shape(a, s, shapes[s], mdir, peak)
            save()
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
