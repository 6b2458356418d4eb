#!/usr/bin/python3
"""Training throughput of weft against a PyTorch peer, on the same model and the same batch.

    /usr/bin/python3 bench/train_throughput.py --weft build/weft [--threads 2] [--steps 6]

For two Qwen2-style decoders (about 4M and 28M parameters; GQA, q/k/v biases, the larger with
tied embeddings) and one packed global batch of 10 variable-length documents (4096 tokens, prompt
tokens masked out of the loss), this measures training tokens/s of a full step (forward, backward,
global-norm clip, AdamW; token-mean loss over the packed batch) for:

  weft           `weft grad ... train.steps=K`, the seconds of its `step s/K` lines;
                 OMP_NUM_THREADS=threads.
  torch          an eager float32 PyTorch implementation of the same model (nn.Linear layers,
                 per-document causal attention by baddbmm + softmax + bmm on the packed batch,
                 RMSNorm, RoPE rotate-half, SwiGLU, cross_entropy with ignore_index summed / N,
                 torch.optim.AdamW(foreach) with decay on 2-D weights only, clip_grad_norm_),
                 initialised from the same safetensors, torch.set_num_threads(threads), run in a
                 subprocess with the BLAS Debian ships for it (libblas.so.3 -> OpenBLAS, pthread
                 variant, its own core-type detection; on some AVX-512 Xeons that is "Prescott").
  torch SKX      the same with OPENBLAS_CORETYPE=SKYLAKEX, the fix weft applies to itself at
                 start-up (DESIGN.md section 9), so weft does not win by BLAS kernels alone.
                 On CPUs without AVX-512 (where those kernels cannot run) this peer is left out
                 and the next one keeps OpenBLAS's own core type ("torch omp").
  torch SKX+omp  the same plus LD_LIBRARY_PATH pointing at the OpenBLAS variant weft links
                 (Debian's openblas-openmp), so BLAS and PyTorch share one OpenMP thread pool as
                 they do in weft: the strongest peer this machine offers. Left out when weft's
                 BLAS cannot be found that way.

The first step of each run is a warm-up; the median of the others is reported. The step-1 losses
of weft and each peer are printed side by side: they are the same model on the same batch and must
agree to about 1e-4 relative (the script exits with status 1 when they do not, since the timings
would then compare different work). Timings are never pass/fail (DESIGN.md section 10): the table
reports the ratios weft/peer measured in this run.
"""

import argparse
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))

MODELS = [
    ("small", dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                   rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=True)),
    ("medium", dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                    num_attention_heads=8, num_key_value_heads=4, rope_theta=10000.0,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=True)),
]

# One packed global batch: 10 documents, 4096 tokens, mixed lengths, prompts masked out of the loss
# (two documents have no prompt). Token ids are drawn below the smaller vocabulary so the same file
# serves both models.
DOC_LENGTHS = [1024, 700, 512, 431, 384, 300, 256, 200, 161, 128]
PROMPT_LENGTHS = [64, 100, 0, 31, 128, 20, 56, 0, 41, 8]
BATCH_VOCAB = 2048

OPTIM = dict(lr=1e-3, min_lr=0.0, warmup_steps=0, beta1=0.9, beta2=0.95, eps=1e-8,
             weight_decay=0.1, clip_grad=1.0)
INIT_STD = 0.02

STEP_RE = re.compile(r"^step (\d+)/(\d+): loss ([-+0-9.eEnaif]+), grad norm ([-+0-9.eEnaif]+), "
                     r"lr ([-+0-9.eE]+), ([0-9.eE+-]+) s, ([0-9.eE+-]+) tokens/s", re.M)


# ------------------------------------------------------------------------------------------------
# The PyTorch peer (runs in its own process: --peer)
# ------------------------------------------------------------------------------------------------

def peer_main(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from reference import files, qwen2

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    V, h, I = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    H, KV, nl = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    hd, eps, tied = h // H, cfg["rms_norm_eps"], cfg["tie_word_embeddings"]

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(h, H * hd, bias=cfg["attention_bias"])
            self.k_proj = nn.Linear(h, KV * hd, bias=cfg["attention_bias"])
            self.v_proj = nn.Linear(h, KV * hd, bias=cfg["attention_bias"])
            self.o_proj = nn.Linear(H * hd, h, bias=False)

        def forward(self, x, cos, sin, lengths, masks):
            T = x.shape[0]
            q = self.q_proj(x).view(T, H, hd)
            k = self.k_proj(x).view(T, KV, hd)
            v = self.v_proj(x).view(T, KV, hd)
            q = (q * cos + rotate_half(q) * sin) * (1.0 / math.sqrt(hd))
            k = k * cos + rotate_half(k) * sin
            # (heads, T, hd) once for the whole packed batch; GQA by repeating the KV heads.
            q = q.transpose(0, 1)
            k = k.repeat_interleave(H // KV, dim=1).transpose(0, 1)
            v = v.repeat_interleave(H // KV, dim=1).transpose(0, 1)
            # One causal attention per document (split, not slicing: the backward of split is
            # one cat, that of each slice a zero-filled copy of the whole tensor).
            outs = []
            for qd, kd, vd, mask in zip(q.split(lengths, 1), k.split(lengths, 1),
                                        v.split(lengths, 1), masks):
                sc = torch.baddbmm(mask, qd, kd.transpose(1, 2))
                outs.append(torch.bmm(torch.softmax(sc, dim=-1), vd))
            o = torch.cat(outs, dim=1).transpose(0, 1).reshape(T, H * hd)
            return self.o_proj(o)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(h, I, bias=False)
            self.up_proj = nn.Linear(h, I, bias=False)
            self.down_proj = nn.Linear(I, h, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(h)
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm(h)
            self.mlp = MLP()

        def forward(self, x, cos, sin, lengths, masks):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, lengths, masks)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, h)
            self.layers = nn.ModuleList(Layer() for _ in range(nl))
            self.norm = RMSNorm(h)

    class Qwen2(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()
            self.lm_head = nn.Linear(h, V, bias=False)
            if tied:
                self.lm_head.weight = self.model.embed_tokens.weight

        def forward(self, ids, labels, n_targets, cos, sin, lengths, masks):
            x = self.model.embed_tokens(ids)
            for layer in self.model.layers:
                x = layer(x, cos, sin, lengths, masks)
            logits = self.lm_head(self.model.norm(x))
            return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / n_targets

    model = Qwen2()
    st = files.read_safetensors(os.path.join(a.model, "model.safetensors"))
    sd = {k: torch.from_numpy(v) for k, v in st.items()}
    if tied:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=True)
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once

    # The packed batch: ids, targets (-100 where no loss), positions within each document.
    ids, labels, pos, bounds = [], [], [], []
    with open(a.batch) as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            t = d["input_ids"]
            m = d.get("loss_mask", [1] * len(t))
            s = len(ids)
            ids += t
            labels += [t[i + 1] if m[i + 1] else -100 for i in range(len(t) - 1)] + [-100]
            pos += range(len(t))
            bounds.append((s, len(ids)))
    T = len(ids)
    ids = torch.tensor(ids, dtype=torch.long)
    labels = torch.tensor(labels, dtype=torch.long)
    n_targets = int((labels != -100).sum())
    inv_freq = cfg["rope_theta"] ** (-(torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.tensor(pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat((ang.cos(), ang.cos()), -1).float()[:, None, :]
    sin = torch.cat((ang.sin(), ang.sin()), -1).float()[:, None, :]
    Lmax = max(e - s for s, e in bounds)
    causal = torch.full((Lmax, Lmax), float("-inf")).triu(1)
    lengths = [e - s for s, e in bounds]
    masks = [causal[:L, :L] for L in lengths]

    params = list(model.parameters())
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPTIM["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPTIM["lr"], betas=(OPTIM["beta1"], OPTIM["beta2"]),
                            eps=OPTIM["eps"], foreach=True)
    steps, losses, norms, secs = a.steps, [], [], []
    for s in range(1, steps + 1):
        t0 = time.perf_counter()
        lr = qwen2.lr_at(s, steps, OPTIM["lr"], OPTIM["min_lr"], OPTIM["warmup_steps"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss = model(ids, labels, n_targets, cos, sin, lengths, masks)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, OPTIM["clip_grad"])
        opt.step()
        losses.append(float(loss))
        norms.append(float(norm))
        secs.append(time.perf_counter() - t0)

    core = None
    try:
        import ctypes
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode()
    except Exception:
        pass
    blas = "?"
    try:
        with open("/proc/self/maps") as f:
            libs = {l.split()[-1] for l in f if "blas" in l}
        blas = ",".join(sorted({os.path.basename(os.path.dirname(os.path.realpath(x)))
                                for x in libs if "openblas" in x})) or ",".join(sorted(libs))
    except OSError:
        pass
    print(json.dumps(dict(params=n_params, tokens=T, targets=n_targets, losses=losses,
                          grad_norms=norms, seconds=secs, threads=torch.get_num_threads(),
                          openblas_core=core, blas=blas)))
    return 0


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------

def cpu_busy_seconds():
    """Seconds of CPU time spent by the whole machine (all processes), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
    except (OSError, ValueError, IndexError):
        return None


def run_measured(cmd, env):
    """Runs cmd; returns (CompletedProcess, wall seconds, cores' worth of CPU that other
    processes used meanwhile: a warning sign for timings on a shared machine)."""
    b0, r0, t0 = cpu_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.time() - t0
    b1, r1 = cpu_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    other = None
    if b0 is not None and b1 is not None and wall > 0:
        own = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        other = max(0.0, (b1 - b0) - own) / wall
    return r, wall, other


def base_env(threads):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    env.pop("OPENBLAS_CORETYPE", None)
    # OpenMP's default wait policy, whatever the caller's: with OMP_WAIT_POLICY=passive (which
    # the test suite sets for busy machines) every parallel region of a batch-1 decode step waits
    # for its threads to wake, and weft generate measured 5x slower here.
    env.pop("OMP_WAIT_POLICY", None)
    return env


def run_weft(weft, model_dir, batch, out, threads, steps):
    cmd = [weft, "grad", "--model", model_dir, "--batch", batch, "--out", out,
           f"train.steps={steps}"] + [f"optim.{k}={v}" for k, v in OPTIM.items()]
    r, wall, other = run_measured(cmd, base_env(threads))
    if r.returncode != 0:
        sys.exit(f"weft failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    rows = [m.groups() for m in STEP_RE.finditer(r.stdout)]
    if len(rows) != steps:
        sys.exit(f"expected {steps} step lines from weft, got {len(rows)}:\n{r.stdout}")
    m = re.search(r"grad: \d+ documents, (\d+) tokens, (\d+) targets", r.stdout)
    return dict(losses=[float(x[2]) for x in rows], grad_norms=[float(x[3]) for x in rows],
                seconds=[float(x[5]) for x in rows], tokens=int(m.group(1)) if m else None,
                targets=int(m.group(2)) if m else None, wall=wall, other=other)


def run_peer(model_dir, batch, threads, steps, extra_env):
    env = base_env(threads)
    env.update(extra_env)
    cmd = [sys.executable, os.path.abspath(__file__), "--peer", "--model", model_dir, "--batch",
           batch, "--threads", str(threads), "--steps", str(steps)]
    r, wall, other = run_measured(cmd, env)
    if r.returncode != 0:
        sys.exit(f"PyTorch peer failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["wall"], res["other"] = wall, other
    return res


def weft_blas_dir(weft):
    """The directory of the OpenBLAS that weft links (Debian: .../openblas-openmp), when it also
    holds a libblas.so.3 that PyTorch can be pointed at with LD_LIBRARY_PATH; else None."""
    try:
        out = subprocess.run(["ldd", weft], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True).stdout
    except OSError:
        return None
    m = re.search(r"libopenblas\.so\.0 => (\S+)", out)
    if not m:
        return None
    d = os.path.dirname(m.group(1))
    return d if os.path.exists(os.path.join(d, "libblas.so.3")) else None


def steady(seconds):
    """Median step time without the first (warm-up) step."""
    rest = seconds[1:] if len(seconds) > 1 else seconds
    return statistics.median(rest)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(REPO, "build", "weft"), help="the weft binary")
    ap.add_argument("--threads", type=int, default=2, help="threads for every implementation")
    ap.add_argument("--steps", type=int, default=6, help="steps per run, the first a warm-up")
    ap.add_argument("--models", default="small,medium", help="comma-separated: small,medium")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        return peer_main(a)
    if a.steps < 2:
        ap.error("--steps must be at least 2 (the first step is a warm-up)")

    from reference import files, qwen2

    weft = os.path.abspath(a.weft)
    if not os.access(weft, os.X_OK):
        sys.exit(f"{weft}: not an executable; build it with `make` or pass --weft PATH")
    want = a.models.split(",")
    unknown = [w for w in want if w not in dict(MODELS)]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {[n for n, _ in MODELS]}")

    # The peers: PyTorch as Debian ships it (libblas.so.3 -> OpenBLAS, pthread variant), with the
    # core-type fix weft applies to itself, and with that fix plus the OpenMP variant of OpenBLAS
    # that weft links (one OpenMP thread pool for BLAS and PyTorch's own kernels instead of two
    # pools of threads that compete for the cores).
    # Without AVX-512 the SkylakeX kernels would not run (SIGILL), and OpenBLAS's own choice
    # there (Haswell) is the fastest it has: those peers keep it.
    skx = has_avx512()
    core = {"OPENBLAS_CORETYPE": "SKYLAKEX"} if skx else {}
    peers = [("torch", "as shipped", {})]
    if skx:
        peers.append(("torch SKX", "OPENBLAS_CORETYPE=SKYLAKEX", dict(core)))
    omp_dir = weft_blas_dir(weft)
    if omp_dir:
        ld = omp_dir + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH")
                        else "")
        peers.append(("torch SKX+omp" if skx else "torch omp",
                      f"{'SKYLAKEX and ' if skx else ''}LD_LIBRARY_PATH={omp_dir} (weft's BLAS)",
                      {**core, "LD_LIBRARY_PATH": ld}))

    print(f"weft {weft}; {a.threads} thread(s); {a.steps} steps per run, step 1 discarded, "
          f"median of the rest; fp32 on CPU")
    rows, ok, worst_other = [], True, 0.0
    with tempfile.TemporaryDirectory(prefix="weft_bench_") as tmp:
        batch = os.path.join(tmp, "batch.jsonl")
        docs = files.make_batch(batch, DOC_LENGTHS, PROMPT_LENGTHS, BATCH_VOCAB, seed=1234)
        T, N = sum(DOC_LENGTHS), qwen2.count_targets(docs)
        print(f"batch: {len(docs)} documents, {T} tokens, {N} loss targets, lengths "
              f"{DOC_LENGTHS}")
        for name, cfg in MODELS:
            if name not in want:
                continue
            mdir = os.path.join(tmp, name)
            cfg, params = files.make_model(mdir, cfg, seed=7, std=INIT_STD)
            n_params = sum(int(v.size) for v in params.values())
            print(f"\n{name}: {n_params:,} parameters (hidden {cfg['hidden_size']}, "
                  f"{cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} heads / "
                  f"{cfg['num_key_value_heads']} kv, intermediate {cfg['intermediate_size']}, "
                  f"vocab {cfg['vocab_size']}, tied {cfg['tie_word_embeddings']})", flush=True)
            runs = [("weft", run_weft(weft, mdir, batch,
                                      os.path.join(tmp, name + ".out.safetensors"),
                                      a.threads, a.steps))]
            for label, _, env in peers:
                runs.append((label, run_peer(mdir, batch, a.threads, a.steps, env)))
            w = runs[0][1]
            for label, r in runs:
                blas = "" if label == "weft" else f" [{r['blas']}, {r['openblas_core']}]"
                print(f"  {label + blas:44s} step s: "
                      + " ".join(f"{s:.3f}" for s in r["seconds"])
                      + f"  (process {r['wall']:.1f} s" + ("" if r["other"] is None else
                                                       f", others {r['other']:.2f} cores") + ")")
            for label, p in runs[1:]:
                if p["params"] != n_params or p["tokens"] != T or p["targets"] != N or (
                        w["tokens"] is not None and (w["tokens"] != T or w["targets"] != N)):
                    print(f"  MISMATCH in counts: {label} {p['params']} params {p['tokens']} "
                          f"tokens {p['targets']} targets; weft {w['tokens']} tokens "
                          f"{w['targets']} targets")
                    ok = False
                rel1 = abs(w["losses"][0] - p["losses"][0]) / abs(p["losses"][0])
                relk = max(abs(x - y) / abs(y) for x, y in zip(w["losses"], p["losses"]))
                good = rel1 <= 1e-4
                ok &= good
                print(f"  step-1 loss: weft {w['losses'][0]:.6f}, {label} {p['losses'][0]:.6f}, "
                      f"rel diff {rel1:.1e} {'ok' if good else 'MISMATCH'}; worst over the "
                      f"{a.steps} steps {relk:.1e} (last {p['losses'][-1]:.6f})")
            busy = max([r["other"] for _, r in runs if r["other"] is not None], default=None)
            if busy is not None:
                worst_other = max(worst_other, busy)
            rows.append((name, n_params, T, [T / steady(r["seconds"]) for _, r in runs], busy))

    labels = ["weft"] + [p[0] for p in peers]
    print(f"\ntraining throughput, tokens/s (fp32 CPU, {a.threads} thread(s); forward + backward "
          f"+ clip + AdamW over one packed batch; median of steps 2..{a.steps})")
    ratios = ["weft/" + l for l in labels[1:]]
    wt = [max(7, len(l)) for l in labels]
    wr = [max(7, len(l)) for l in ratios]
    hdr = (f"{'model':7s} {'params':>11s} {'tokens':>6s}"
           + "".join(f" {l:>{w}s}" for l, w in zip(labels, wt))
           + "".join(f"  {l:>{w}s}" for l, w in zip(ratios, wr)) + "  others")
    print(hdr)
    print("-" * len(hdr))
    for name, n, T, tps, busy in rows:
        print(f"{name:7s} {n:11,d} {T:6d}" + "".join(f" {x:{w}.0f}" for x, w in zip(tps, wt))
              + "".join(f"  {tps[0] / x:{w}.2f}" for x, w in zip(tps[1:], wr))
              + ("       ?" if busy is None else f"  {busy:6.2f}"))
    print("  others: the most cores that other processes used during one of the row's runs")
    for label, what, _ in peers:
        print(f"  {label}: PyTorch {torch_version()}, {what}")
    if worst_other > 0.25:
        print(f"note: other processes used up to {worst_other:.2f} cores during these runs "
              f"(of {os.cpu_count()}); the timings are noisy, and multi-threaded ones suffer most")
    if not ok:
        print("\nthe implementations disagree on the loss: the timings compare different work",
              file=sys.stderr)
        return 1
    return 0


def has_avx512():
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512f" in f.read()
    except OSError:
        return False


def torch_version():
    try:
        import torch
        return torch.__version__
    except ImportError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
