#!/usr/bin/env python3
"""Instructions a thread issues per key tile in the Hopper attention kernels' main loops, from
their SASS: what can be measured about their speed without a GPU.

Each warp scheduler issues one instruction per cycle, and between the tensor-core products the
kernels' work (the mask, the softmax, the conversions, the descriptors) is instructions, so a
consumer warp's instructions per tile bound a tile's time from below. The count is of the loop's
fast path: where the loop branches on a warp vote (the mask, skipped where every row sees the
whole tile), the shorter arm is counted. Compiles src/backend/cuda/attention_hopper*.cu for sm_90a
with nvcc and reads the code with cuobjdump (CUDA's, or PyPI's nvidia-cuda-cuobjdump).

    python3 scripts/attention_tile_instructions.py [--ref GIT_REV] [--json FILE]

With --ref the same is done for the sources at that revision, and the ratio printed.
"""
import argparse, collections, glob, json, os, re, shutil, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["attention_hopper.cu", "attention_hopper_backward.cu"]
KERNELS = {"forward_kernel": "forward", "dq_kernel": "dQ", "dkdv_kernel": "dK/dV"}


def tool(name, hints):
    for path in [shutil.which(name)] + hints:
        if path and os.path.exists(path):
            return path
    for site in sys.path:  # PyPI's nvidia-cuda-cuobjdump
        found = glob.glob(os.path.join(site, "nvidia", "cu*", "bin", name))
        if found:
            return found[0]
    sys.exit(f"error: {name} not found: install the CUDA toolkit"
             + (" or `pip install nvidia-cuda-cuobjdump`" if name == "cuobjdump" else ""))


def sass_of(src_dir, source, nvcc, cuobjdump, work):
    obj = os.path.join(work, source + ".o")
    subprocess.run([nvcc, "-std=c++17", "-O3", "--generate-code=arch=compute_90a,code=sm_90a",
                    "-I", os.path.join(src_dir, "src"), "-c",
                    os.path.join(src_dir, "src", "backend", "cuda", source), "-o", obj],
                   check=True, capture_output=True)
    return subprocess.run([cuobjdump, "-sass", obj], check=True, capture_output=True,
                          text=True).stdout


def fast_path(ins):
    """(instructions, opcode counts) of the fast path of the longest loop holding wgmma."""
    at = {address: i for i, (address, _) in enumerate(ins)}
    best = None
    for i, (address, text) in enumerate(ins):
        m = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= address or int(m.group(1), 16) not in at:
            continue
        body = range(at[int(m.group(1), 16)], i + 1)
        if not any("HGMMA" in ins[k][1] for k in body):
            continue
        if best is None or len(body) > len(best):
            best = body
    if best is None:
        return None
    skip = set()
    for k in best:  # a vote, then a branch on it: the two arms of `if (any) .. else ..`
        if "VOTE.ANY" not in ins[k][1] or k + 1 >= len(ins):
            continue
        m = re.search(r"@!?P\d BRA 0x([0-9a-f]+)", ins[k + 1][1])
        if not m or int(m.group(1), 16) not in at:
            continue
        x = at[int(m.group(1), 16)]
        u = re.match(r"BRA 0x([0-9a-f]+)$", ins[x - 1][1])
        if u and int(u.group(1), 16) > ins[x][0] and int(u.group(1), 16) in at:
            arms = set(range(k + 2, x)), set(range(x, at[int(u.group(1), 16)]))
            skip |= max(arms, key=len)
        else:
            skip |= set(range(k + 2, x))
    kept = [ins[k][1] for k in best if k not in skip]
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                              for t in kept)
    return len(kept), ops


def count(src_dir, nvcc, cuobjdump):
    rows = {}
    with tempfile.TemporaryDirectory() as work:
        for source in SOURCES:
            sass = sass_of(src_dir, source, nvcc, cuobjdump, work)
            for part in re.split(r"\n\s*Function : ", sass)[1:]:
                name = part.split("\n", 1)[0]
                kernel = next((k for k in KERNELS if k + "ILi" in name), None)
                if not kernel:
                    continue
                d = re.search(r"ILi(\d+)E", name).group(1)
                ins = [(int(m.group(1), 16), m.group(2).strip())
                       for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", part)]
                found = fast_path(ins)
                if found:
                    rows[f"{KERNELS[kernel]} d{d}"] = {"instructions": found[0],
                                                       "ops": dict(found[1].most_common(8))}
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", help="a git revision to compare with")
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args()
    nvcc = tool("nvcc", ["/usr/local/cuda/bin/nvcc"])
    cuobjdump = tool("cuobjdump", ["/usr/local/cuda/bin/cuobjdump"])
    now = count(ROOT, nvcc, cuobjdump)
    before = None
    if args.ref:
        with tempfile.TemporaryDirectory() as old:
            archive = subprocess.run(["git", "-C", ROOT, "archive", args.ref, "src"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
            before = count(old, nvcc, cuobjdump)
    print(f"{'kernel':<12} {'now':>6}" + (f" {args.ref[:10]:>10} {'ratio':>6}" if before else "")
          + "   most issued (now)")
    for name, row in sorted(now.items()):
        line = f"{name:<12} {row['instructions']:>6}"
        if before and name in before:
            old = before[name]["instructions"]
            line += f" {old:>10} {old / row['instructions']:>5.2f}x"
        print(line + "   " + ", ".join(f"{k} {v}" for k, v in row["ops"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"now": now, "ref": args.ref, "before": before}, f, indent=1)


if __name__ == "__main__":
    main()
