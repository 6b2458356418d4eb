"""GPU training throughput and MFU: weft (device=cuda) against PyTorch on the same GPU, same
model, same packed micro-batches, in the same run.

    make && /usr/bin/python3 bench/gpu_train_throughput.py --weft build/weft [--steps 6]
        [--model 1b|small] [--out runs/gpu_train_throughput.json]

Model "1b": a Qwen2-format decoder of 1.10e9 parameters (TinyLlama's shape: hidden 2048,
intermediate 5632, 22 layers, 32 heads / 4 kv heads, head_dim 64, vocab 32000, untied, no
biases). "small" (hidden 512, 4 layers) checks the script itself in seconds.

A step is one global batch of 16384 tokens in 4 micro-batches of exactly 4096 packed tokens
(documents 2048, 1024, 512, 512 per micro-batch, prompts masked), gradient accumulation, global
clip, AdamW. Step 1 warms up; the median of the others is reported.

- weft: `weft grad ... device=cuda train.steps=K train.max_tokens_per_microbatch=4096`: bf16
  weights and activations, fp32 gradients and master weights, cuBLASLt GEMMs, weft's kernels.
- torch: the usual mixed-precision recipe: fp32 parameters under torch.autocast(bfloat16),
  F.scaled_dot_product_attention(is_causal=True) per document (flash kernels), fused AdamW,
  clip_grad_norm_; weights from the same safetensors.
- both: AdamW at a constant learning rate (weft: optim.warmup_steps=0, optim.min_lr = optim.lr;
  its default warmup + cosine would make the losses incomparable).

MFU = model FLOPs per step / (step seconds x peak dense bf16 FLOP/s of the GPU). Model FLOPs:
6 x tokens x (matmul parameters, the output head included, the embedding lookup not) plus causal
attention, 12 x layers x heads x head_dim x sum over documents of L(L+1)/2 (QK^T and PV, forward
and backward). Peak: 989e12 for H100 SXM and H200, 756e12 for H100 PCIe; --peak overrides.
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
MICROBATCH_DOCS = [2048, 1024, 512, 512]  # 4096 tokens
PROMPTS = [128, 64, 0, 32]
MICROBATCHES = 4
TOKENS_PER_MICROBATCH = 4096
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
    header, offset = {}, 0
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


def write_batch(path, vocab, seed=1):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(MICROBATCHES):
            for L, P in zip(MICROBATCH_DOCS, PROMPTS):
                ids = rng.integers(0, vocab, L).tolist()
                f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * P + [1] * (L - P)}) + "\n")


def model_flops(cfg):
    h, I, V, nl = (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"],
                   cfg["num_hidden_layers"])
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // H
    matmul_params = nl * (h * H * hd + 2 * h * KV * hd + H * hd * h + 3 * h * I) + V * h
    tokens = MICROBATCHES * TOKENS_PER_MICROBATCH
    attention = 12 * nl * H * hd * MICROBATCHES * sum(L * (L + 1) // 2 for L in MICROBATCH_DOCS)
    return 6 * tokens * matmul_params + attention


# ------------------------------------------------------------------------------ the peer ----

def peer_main(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from reference import files

    dev = torch.device("cuda")
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
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

    model = Model()
    st = files.read_safetensors(os.path.join(a.model_dir, "model.safetensors"))
    sd = {}
    for k, v in st.items():
        k = k.replace("model.", "", 1) if k.startswith("model.") else k
        k = k.replace("self_attn.", "").replace("mlp.", "")
        sd[k] = torch.from_numpy(np.asarray(v, dtype=np.float32))
    model.load_state_dict(sd, strict=True)
    model.to(dev)

    micro = []
    with open(a.batch) as f:
        docs = [json.loads(l) for l in f if l.strip()]
    per = len(MICROBATCH_DOCS)
    n_targets = 0
    for m in range(MICROBATCHES):
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

    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() == 2],
                              "weight_decay": OPTIM["weight_decay"]},
                             {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}],
                            lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"], fused=True)
    secs, losses = [], []
    for _ in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for ids, lab, cos, sin, lengths in micro:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, lab, n_targets, cos, sin, lengths)
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(params, OPTIM["clip"])
        opt.step()
        torch.cuda.synchronize()
        secs.append(time.perf_counter() - t0)
        losses.append(float(total))
    print(json.dumps(dict(seconds=secs, losses=losses, torch=torch.__version__,
                          peak_memory=torch.cuda.max_memory_allocated())))
    return 0


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


def run_weft(a, mdir, batch):
    cmd = [a.weft, "grad", "--model", mdir, "--batch", batch, "--out",
           os.path.join(a.tmp, "weft_out.safetensors"), "device=cuda",
           f"train.steps={a.steps}", f"train.max_tokens_per_microbatch={TOKENS_PER_MICROBATCH}",
           f"optim.lr={OPTIM['lr']}", f"optim.min_lr={OPTIM['lr']}", "optim.warmup_steps=0",
           f"optim.beta1={OPTIM['betas'][0]}", f"optim.beta2={OPTIM['betas'][1]}",
           f"optim.eps={OPTIM['eps']}", f"optim.weight_decay={OPTIM['weight_decay']}",
           f"optim.clip_grad={OPTIM['clip']}"]
    print("$ " + " ".join(cmd), flush=True)
    env = dict(os.environ, WEFT_CUDA_PROFILE="1") if a.profile else None
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"weft failed:\n{r.stdout}")
    if a.profile:  # the backend's per-op table, printed when it shuts down
        lines = r.stdout.splitlines()
        start = next((i for i, l in enumerate(lines) if l.startswith("cuda profile")), len(lines))
        print("\n".join(lines[start:]))
    secs = [float(m.group(4)) for m in map(STEP_RE.match, r.stdout.splitlines()) if m]
    losses = [float(m.group(3)) for m in map(STEP_RE.match, r.stdout.splitlines()) if m]
    return secs, losses


def run_peer(a, mdir, batch):
    cmd = [sys.executable, os.path.abspath(__file__), "--peer", "--model-dir", mdir, "--batch", batch,
           "--steps", str(a.steps)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        print(f"torch peer failed:\n{r.stderr[-3000:]}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--weft", default=os.path.join(os.path.dirname(HERE), "build", "weft"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--model", choices=sorted(MODELS), default="1b")
    p.add_argument("--peak", type=float, help="peak dense bf16 FLOP/s (default: by GPU name)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "runs",
                                                 "gpu_train_throughput.json"))
    p.add_argument("--profile", action="store_true",
                   help="print weft's GPU time per op (WEFT_CUDA_PROFILE=1); skips PyTorch")
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--batch", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.peer:
        if not (a.model_dir and os.path.isdir(a.model_dir) and a.batch):
            p.error("--peer needs --model-dir DIR and --batch FILE")
        return peer_main(a)

    cfg = MODELS[a.model]
    name = gpu_name()
    peak = a.peak or peak_flops(name)
    a.tmp = tempfile.mkdtemp(prefix="weft_gpu_bench_")
    mdir, batch = os.path.join(a.tmp, "model"), os.path.join(a.tmp, "batch.jsonl")
    n_params = write_model(mdir, cfg)
    write_batch(batch, cfg["vocab_size"])
    flops = model_flops(cfg)
    tokens = MICROBATCHES * TOKENS_PER_MICROBATCH
    print(f"GPU: {name}; peak bf16 {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s")
    print(f"model {a.model}: {n_params / 1e9:.3f}e9 parameters; step: {tokens} tokens in "
          f"{MICROBATCHES} micro-batches of {TOKENS_PER_MICROBATCH}; {flops / 1e12:.1f} TFLOP/step")

    results = {}
    w_secs, w_losses = run_weft(a, mdir, batch)
    results["weft"] = dict(seconds=w_secs, losses=w_losses)
    peer = None if a.profile else run_peer(a, mdir, batch)
    if peer:
        results["torch"] = peer
    rows = []
    for who, r in results.items():
        s = statistics.median(r["seconds"][1:] or r["seconds"])
        mfu = flops / (s * peak) if peak else float("nan")
        rows.append((who, s, tokens / s, mfu))
        print(f"{who:>6}: step {s * 1e3:8.1f} ms  {tokens / s:10.0f} tokens/s  MFU {mfu * 100:5.1f}%"
              f"  losses {' '.join(f'{x:.4f}' for x in r['losses'])}")
    if len(rows) == 2:
        print(f"weft / torch tokens/s: {rows[0][2] / rows[1][2]:.2f}x")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(dict(gpu=name, peak=peak, model=a.model, params=n_params, tokens=tokens,
                       flops=flops, results=results), f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
