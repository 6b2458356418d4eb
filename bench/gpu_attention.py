"""Causal varlen attention on the GPU: weft's kernels against PyTorch's SDPA (flash and cuDNN
backends) on the same shapes and GPU, in the same run, forward and forward + backward.

    make && python3 bench/gpu_attention.py [--build build] [--iters 20] [--heads 32 --kv-heads 4]
        [--head-dim 64 128] [--docs 2048 1024 512 512] [--out runs/gpu_attention.json]

Shapes: every document set at every head_dim. By default the sets are one micro-batch of the 1B
throughput benchmark (bench/gpu_train_throughput.py: 4096 packed tokens in documents of 2048,
1024, 512 and 512) and single documents of 4096, 8192, 16384 and 32768 tokens, at head_dim 64
and 128 (ten shapes), 32 query heads on 4 kv heads; --docs gives one set instead, --head-dim
other head dims.

weft runs build/bench_attention once per kernel family (WEFT_CUDA_ATTENTION): "weft hopper" (on
compute capability 9.x; weft's default there) the forward and backward on TMA and wgmma
(src/backend/cuda/attention_hopper*.cu), dQ in a kernel of its own that recomputes S and dP;
"weft hopper-ordered" the same with dQ summed in the dK/dV kernel in a fixed order
(WEFT_CUDA_ATTENTION_DQ=ordered); "weft hopper-192" the same as hopper with the forward's and the
dQ kernel's blocks 192 query rows at head_dim 64 (three consumer warpgroups,
WEFT_CUDA_ATTENTION_ROWS=192; run at head_dim 64 only); "weft mma" the mma.sync kernels (the default below 9.x);
--families picks others (simt: fp32). PyTorch runs F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) per document
on bf16 tensors, as the throughput benchmark's peer does, once restricted to each backend with
torch.nn.attention.sdpa_kernel: flash (SDPBackend.FLASH_ATTENTION) and cuDNN
(SDPBackend.CUDNN_ATTENTION). A backend that rejects enable_gqa is run on keys and values
expanded to the query heads beforehand (noted "kv expanded"); one that cannot run the shape at
all is reported unavailable with the reason, and weft is compared with the others. The ratio
printed per shape is weft's speed over the strongest peer's (the fastest, forward and forward +
backward taken separately).

Times are CUDA-synchronized wall clock over --iters calls after 3 warm-up calls. TFLOP/s counts
the model's attention FLOPs: 4 x heads x head_dim x sum L(L+1)/2 forward, twice that backward.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
DOC_SETS = ([2048, 1024, 512, 512], [4096], [8192], [16384], [32768])
HEAD_DIMS = (64, 128)
PEERS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}  # name: SDPBackend member
# The environment of a family that is not simply WEFT_CUDA_ATTENTION=<family>.
FAMILY_ENV = {"hopper-ordered": dict(WEFT_CUDA_ATTENTION="hopper", WEFT_CUDA_ATTENTION_DQ="ordered"),
              "hopper-192": dict(WEFT_CUDA_ATTENTION="hopper", WEFT_CUDA_ATTENTION_ROWS="192")}
# The head dims a family differs from weft's default at (others: all).
FAMILY_HEAD_DIMS = {"hopper-192": (64,)}


def time_ms(run, iters):
    """Milliseconds per call of run(backward) for backward False and True, after 3 warm-ups."""
    import torch
    ms = []
    for backward in (False, True):
        for _ in range(3):
            run(backward)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            run(backward)
        torch.cuda.synchronize()
        ms.append(1e3 * (time.perf_counter() - t0) / iters)
    return ms


def torch_inputs(a, docs, head_dim, expand):
    """Per document (q, k, v, dout), bf16 in [-1, 1); k and v on the query heads if expand."""
    import torch
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(heads, L):
        x = (torch.rand(1, heads, L, head_dim, device=dev, generator=gen) * 2 - 1)
        return x.to(torch.bfloat16)

    kv = a.heads if expand else a.kv_heads
    return [(rand(a.heads, L).requires_grad_(), rand(kv, L).requires_grad_(),
             rand(kv, L).requires_grad_(), rand(a.heads, L)) for L in docs]


def torch_times(a, docs, head_dim, peer):
    """The SDPA backend `peer` on the shape: times, or {"unavailable": reason}."""
    import torch
    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:  # torch before 2.3
        return dict(unavailable=f"torch {torch.__version__} has no sdpa_kernel ({e})")
    reason = None
    for expand in (False, True):
        inputs = torch_inputs(a, docs, head_dim, expand)

        def run(backward):
            for q, k, v, dout in inputs:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                     enable_gqa=not expand)
                if backward:
                    out.backward(dout)

        with warnings.catch_warnings(record=True) as caught, \
                sdpa_kernel(getattr(SDPBackend, PEERS[peer])):
            warnings.simplefilter("always")
            try:
                f, fb = time_ms(run, a.iters)
                return dict(forward_ms=f, forward_backward_ms=fb, torch=torch.__version__,
                            kv="expanded" if expand else "gqa")
            except RuntimeError as e:  # the backend cannot run this shape ("No available kernel")
                why = [str(w.message).splitlines()[0] for w in caught]
                reason = "; ".join([str(e).splitlines()[0]] + why)[:400]
        del inputs
        torch.cuda.empty_cache()
    return dict(unavailable=reason)


def weft_times(a, docs, head_dim, family):
    if head_dim not in FAMILY_HEAD_DIMS.get(family, (head_dim,)):
        return dict(unavailable=f"{family} differs from hopper only at head_dim "
                    + " and ".join(map(str, FAMILY_HEAD_DIMS[family])))
    exe = os.path.join(a.build, "bench_attention")
    cmd = [exe, str(a.heads), str(a.kv_heads), str(head_dim), *map(str, docs),
           "--iters", str(a.iters)]
    extra = FAMILY_ENV.get(family, dict(WEFT_CUDA_ATTENTION=family))
    print("$ " + " ".join(f"{k}={v}" for k, v in extra.items()) + " " + " ".join(cmd), flush=True)
    env = dict(os.environ, **extra)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        print(f"bench_attention failed:\n{r.stdout[-3000:]}")
        lines = r.stdout.strip().splitlines() or ["no output"]
        return dict(unavailable=f"bench_attention failed: {lines[-1][:300]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def default_families():
    import torch
    major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0
    return ["hopper", "hopper-ordered", "hopper-192"] if major == 9 else ["mma"]


def weft_name(family):
    """A family's row label: weft's default is hopper on sm_90a and mma elsewhere, so neither is
    plain "weft"."""
    return f"weft {family}"


def print_rows(results, fwd_flops):
    for who, r in results.items():
        if "unavailable" in r:
            print(f"  {who:>21}: unavailable: {r['unavailable']}")  # compared with the others
            continue
        f, fb = r["forward_ms"], r["forward_backward_ms"]
        note = "  (kv expanded)" if r.get("kv") == "expanded" else ""
        print(f"  {who:>21}: forward {f:8.3f} ms ({fwd_flops / f / 1e9:6.1f} TFLOP/s)   "
              f"forward+backward {fb:8.3f} ms ({3 * fwd_flops / fb / 1e9:6.1f} TFLOP/s){note}")


def over_strongest_peer(results, mine):
    """The speed of weft's family `mine` over the strongest peer's, forward and forward +
    backward: (ratio, peer name) each, or None where it or every peer is unavailable."""
    w = results[mine]
    peers = {k: r for k, r in results.items() if k in PEERS and "unavailable" not in r}
    ratios = {}
    for key in ("forward_ms", "forward_backward_ms"):
        if "unavailable" in w or not peers:
            ratios[key] = None
            continue
        best = min(peers, key=lambda k: peers[k][key])
        ratios[key] = (peers[best][key] / w[key], best)
    if all(ratios.values()):
        (rf, pf), (rb, pb) = ratios["forward_ms"], ratios["forward_backward_ms"]
        print(f"  {mine} / strongest peer speed: forward {rf:.2f}x ({pf}), "
              f"forward+backward {rb:.2f}x ({pb})")
    else:
        print(f"  {mine} / strongest peer speed: - ({mine} or every peer unavailable)")
    return {k: v and dict(ratio=v[0], peer=v[1]) for k, v in ratios.items()}


def print_family_ratios(shapes, families):
    """After every shape's table, one line per family after the first (weft's default): its
    forward and forward + backward speed over the default's at each shape, the figures that
    decide whether it should become the default (hopper-ordered: WEFT_CUDA_ATTENTION_DQ's,
    hopper-192: WEFT_CUDA_ATTENTION_ROWS's; both in src/backend/cuda/switches.c)."""
    base = weft_name(families[0])
    for family in families[1:]:
        cells = []
        for shape in shapes:
            mine, theirs = shape["results"][weft_name(family)], shape["results"][base]
            label = f"{','.join(map(str, shape['docs']))} d{shape['head_dim']}"
            if "unavailable" in mine or "unavailable" in theirs:
                continue
            f = theirs["forward_ms"] / mine["forward_ms"]
            fb = theirs["forward_backward_ms"] / mine["forward_backward_ms"]
            cells.append(f"{label} {f:.2f}x / {fb:.2f}x")
        print(f"\nforward / forward+backward speed, {weft_name(family)} / {base}: "
              + ("; ".join(cells) or "-"))


def run_shape(a, docs, head_dim):
    pairs = sum(L * (L + 1) // 2 for L in docs)
    fwd_flops = 4 * a.heads * head_dim * pairs
    print(f"\nshape: {sum(docs)} tokens in documents {docs}, {a.heads}/{a.kv_heads} heads, "
          f"head_dim {head_dim}", flush=True)
    results = {weft_name(f): weft_times(a, docs, head_dim, f) for f in a.families}
    for peer in PEERS:
        results[peer] = torch_times(a, docs, head_dim, peer)
    print_rows(results, fwd_flops)
    over = {weft_name(f): over_strongest_peer(results, weft_name(f)) for f in a.families}
    return dict(docs=docs, head_dim=head_dim, forward_flops=fwd_flops, results=results,
                weft_over_strongest=over)


def main():
    p = argparse.ArgumentParser(description="weft's attention kernels vs PyTorch SDPA (flash, "
                                "cuDNN) on one GPU (see the module docstring)")
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, nargs="+", default=list(HEAD_DIMS),
                   help="head dims to run every document set at (default: 64 128)")
    p.add_argument("--docs", type=int, nargs="+",
                   help="one set of packed document lengths (default: 2048 1024 512 512, then "
                        "single documents of 4096, 8192, 16384 and 32768)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "runs",
                                                 "gpu_attention.json"))
    p.add_argument("--families", help="weft's kernel families, comma-separated (default: hopper, "
                   "hopper-ordered and hopper-192 on compute capability 9.x, else mma)")
    a = p.parse_args()
    a.families = a.families.split(",") if a.families else default_families()
    doc_sets = [a.docs] if a.docs else [list(s) for s in DOC_SETS]
    shapes = [run_shape(a, docs, d) for d in a.head_dim for docs in doc_sets]
    print_family_ratios(shapes, a.families)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(dict(heads=a.heads, kv_heads=a.kv_heads, iters=a.iters, shapes=shapes), f,
                  indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
