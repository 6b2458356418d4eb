"""Causal varlen attention on the GPU: weft's kernels against PyTorch's SDPA on the same shape and
GPU, in the same run, forward and forward + backward.

    make && python3 bench/gpu_attention.py [--build build] [--iters 20] [--heads 32 --kv-heads 4
        --head-dim 64] [--docs 2048 1024 512 512] [--out runs/gpu_attention.json]

The default shape is one micro-batch of the 1B throughput benchmark (bench/gpu_train_throughput.py):
4096 packed tokens in documents of 2048, 1024, 512 and 512, 32 query heads on 4 kv heads, head_dim
64. weft runs build/bench_attention (its tensor-core kernels; WEFT_CUDA_ATTENTION=simt for the
fp32 ones). PyTorch runs F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) per
document on bf16 tensors, as the throughput benchmark's peer does; its flash or cuDNN kernels are
the bar. Times are CUDA-synchronized wall clock over --iters calls after warm-up. TFLOP/s counts
the model's attention FLOPs: 4 x heads x head_dim x sum L(L+1)/2 forward, twice that backward.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def torch_times(a):
    import torch
    import torch.nn.functional as F
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape):
        return (torch.rand(*shape, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)

    docs = [(rand(1, a.heads, L, a.head_dim).requires_grad_(),
             rand(1, a.kv_heads, L, a.head_dim).requires_grad_(),
             rand(1, a.kv_heads, L, a.head_dim).requires_grad_(),
             rand(1, a.heads, L, a.head_dim)) for L in a.docs]

    def run(backward):
        for q, k, v, dout in docs:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            if backward:
                out.backward(dout)

    ms = []
    for backward in (False, True):
        for _ in range(3):
            run(backward)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            run(backward)
        torch.cuda.synchronize()
        ms.append(1e3 * (time.perf_counter() - t0) / a.iters)
    return dict(forward_ms=ms[0], forward_backward_ms=ms[1], torch=torch.__version__)


def weft_times(a):
    exe = os.path.join(a.build, "bench_attention")
    cmd = [exe, str(a.heads), str(a.kv_heads), str(a.head_dim), *map(str, a.docs),
           "--iters", str(a.iters)]
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_attention failed:\n{r.stdout}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--docs", type=int, nargs="+", default=[2048, 1024, 512, 512])
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "runs",
                                                 "gpu_attention.json"))
    a = p.parse_args()
    pairs = sum(L * (L + 1) // 2 for L in a.docs)
    fwd_flops = 4 * a.heads * a.head_dim * pairs
    results = dict(weft=weft_times(a), torch=torch_times(a))
    print(f"shape: {sum(a.docs)} tokens in documents {a.docs}, {a.heads}/{a.kv_heads} heads, "
          f"head_dim {a.head_dim}")
    for who, r in results.items():
        f, fb = r["forward_ms"], r["forward_backward_ms"]
        print(f"{who:>6}: forward {f:8.3f} ms ({fwd_flops / f / 1e9:6.1f} TFLOP/s)   "
              f"forward+backward {fb:8.3f} ms ({3 * fwd_flops / fb / 1e9:6.1f} TFLOP/s)")
    w, t = results["weft"], results["torch"]
    print(f"weft / torch speed: forward {t['forward_ms'] / w['forward_ms']:.2f}x, "
          f"forward+backward {t['forward_backward_ms'] / w['forward_backward_ms']:.2f}x")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(dict(docs=a.docs, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
                       forward_flops=fwd_flops, results=results), f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
