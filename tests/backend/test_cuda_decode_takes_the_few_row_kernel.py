"""A decode step's products of up to 8 rows run on weft's few-row kernel (few_rows.cu), those of
9 to 64 rows on its skinny one (skinny.cu), and WEFT_CUDA_FEW_ROWS=0 sends exactly those to
cuBLASLt instead.

test_cuda_ops_match_cpu checks the kernel's values and that each row is the same bits alone; this
checks that decoding reaches it at all (a covers() that refused every call would leave that test
passing on cuBLASLt). `weft generate` of one prompt, the CUDA profile's JSON read back
(WEFT_CUDA_PROFILE=<file>.json): every decode forward's projections and output head, 4 per layer
(q, k and v are one product; gate and up another, which with its SwiGLU is one "swiglu_product (few
rows)" launch) and 1, and the prefill's output head (on its one last row) are few-row calls, the
prefill's 20-row projections are not: they are skinny.cu's tensor-core calls ("matmul (skinny)", 9
to 64 rows; the gate|up one with its SwiGLU, "swiglu_product (skinny)"); with the switch off there
are neither, and the products are the same number of cuBLASLt calls. The decode forwards' other
fused launches are checked too, so none falls back to the separate ops unseen: the q|k|v biases
come in the few-row launch, and the prefill's in the skinny one (no "bias_add" at all), and each
layer's split also stores the keys and values; the prefill, whose sequence is new, splits and then
runs "kv_store". Runs on weft_emulated (the CUDA backend on the CPU); skipped when built without
the CUDA toolkit. The decode forwards' RMSNorms before the q|k|v and gate|up products are folded
into them, and the q|k|v product stores its rows as split_store would ("matmul (few rows, normed,
stored)", "swiglu_product (few rows, normed)"), and so is a decode forward's final norm into its
output head, whose rows are every row in order ("matmul (few rows, normed)", and no row gather):
"rmsnorm_forward" runs only for the prefill's layers and its final norm, no "split_store" runs, and
`WEFT_CUDA_FOLD_NORM=0`, which keeps every norm its own launch (and the split and store one of
their own, "split_store"), writes the same output file byte for byte (the kernel tests check the
folded products' bits against the norm, the product and split_store). Last,
`WEFT_CUDA_GEMM_SPLIT_K=1` must split exactly the products whose tiles leave SMs idle and whose K
allows it (split_k_cases).
"""
import filecmp
import json
import os
import subprocess
import sys

from reference import files, fixtures, qwen2
from reference.generation import random_prompts, write_prompts

CFG = dict(qwen2.SMALL_CFG, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
PROJECTIONS = 4  # q|k|v, o, gate|up (each one product: blocks.c), down
NORMED = ("matmul (few rows, normed, stored)", "swiglu_product (few rows, normed)")
HEAD_NORMED = "matmul (few rows, normed)"  # a decode forward's final norm and output head
FEW = ("matmul (few rows)", "swiglu_product (few rows)", HEAD_NORMED) + NORMED
SKINNY = ("matmul (skinny)", "swiglu_product (skinny)")


def generate(emulated, mdir, prompts, tmp, name, few_rows, split_k=False, fold_norm=True):
    """The profile's calls {op: calls} and the run's statistics (its output: tmp/name.jsonl)."""
    prof, out = os.path.join(tmp, f"{name}.json"), os.path.join(tmp, f"{name}.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS="1", WEFT_CUDA_PROFILE=prof,
               WEFT_CUDA_FEW_ROWS="1" if few_rows else "0",
               WEFT_CUDA_GEMM_SPLIT_K="1" if split_k else "0",
               WEFT_CUDA_FOLD_NORM="1" if fold_norm else "0")
    cmd = [emulated, "generate", "--model", mdir, "--prompts", prompts, "--out", out,
           "--stats", out + ".stats.json", "device=cuda", "sampling.max_tokens=6",
           "sampling.stop_token_ids=[]"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    with open(prof) as f:
        ops = {o["op"]: o["calls"] for o in json.load(f)["ops"]}
    with open(out + ".stats.json") as f:
        return ops, json.load(f)


def products(ops):
    """Calls that multiply: matmuls, and the gate|up products with their SwiGLU."""
    return sum(n for op, n in ops.items() if op.startswith(("matmul", "swiglu_product")))


def cases(emulated, tmp):
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, CFG, 5, std=0.05)
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts([20], CFG["vocab_size"], 4))  # a prefill of 20 rows
    on, stats = generate(emulated, mdir, prompts, tmp, "on", True)
    off, _ = generate(emulated, mdir, prompts, tmp, "off", False)
    decode_forwards = stats["forwards"] - 1
    per_forward = PROJECTIONS * CFG["num_hidden_layers"] + 1
    few = sum(on.get(op, 0) for op in FEW)
    fused = on.get(FEW[1], 0) + on.get(NORMED[1], 0)
    layers = CFG["num_hidden_layers"]
    print(f"default: {on}; WEFT_CUDA_FEW_ROWS=0: {off}; {decode_forwards} decode forwards of "
          f"{per_forward} products")
    failures = []
    if few != decode_forwards * per_forward + 1:
        failures.append(f"{few} few-row products, not the decode forwards' "
                        f"{decode_forwards * per_forward} and the prefill's output head")
    if fused != decode_forwards * layers:
        failures.append(f"{fused} gate|up products with their SwiGLU in one launch, not one a "
                        "layer of every decode forward")
    skinny = sum(on.get(op, 0) for op in SKINNY)
    if skinny != PROJECTIONS * layers or on.get(SKINNY[1], 0) != layers:
        failures.append(f"{skinny} skinny products, not the prefill's {PROJECTIONS * layers} "
                        "projections of 20 rows, one a layer with its SwiGLU")
    if any(op in off for op in FEW + SKINNY):
        failures.append("WEFT_CUDA_FEW_ROWS=0 still ran the few-row or skinny kernel")
    if products(on) != products(off):
        failures.append(f"{products(on)} products by default, {products(off)} without "
                        "the few-row kernel")
    # kv_store: one forward's worth (the prefill's) and no more: the decode forwards' q|k|v
    # products stored their keys and values (split_store without the fold: fold_norm_cases).
    for op, n in (("bias_add", 0), ("kv_store", layers), ("split_store", 0)):
        if on.get(op, 0) != n:
            failures.append(f"{on.get(op, 0)} {op} launches, expected {n}")
    failures += fold_norm_cases(emulated, tmp, mdir, prompts, on, stats)
    failures += split_k_cases(emulated, tmp, prompts)
    return failures


def fold_norm_cases(emulated, tmp, mdir, prompts, on, stats):
    """The decode forwards' two norms a layer and final norm folded into their products; without
    the fold the same output, every norm its own launch."""
    layers, forwards = CFG["num_hidden_layers"], stats["forwards"]
    apart, _ = generate(emulated, mdir, prompts, tmp, "apart", True, fold_norm=False)
    failures = []
    for op in NORMED:
        if on.get(op, 0) != (forwards - 1) * layers:
            failures.append(f"{on.get(op, 0)} {op} launches, not one a layer of every decode "
                            "forward")
    if on.get(HEAD_NORMED, 0) != forwards - 1:
        failures.append(f"{on.get(HEAD_NORMED, 0)} {HEAD_NORMED} launches, not one an output head "
                        "of every decode forward")
    for op in NORMED + (HEAD_NORMED,):
        if op in apart:
            failures.append(f"WEFT_CUDA_FOLD_NORM=0 still ran {op}")
    if apart.get("split_store", 0) != (forwards - 1) * layers:
        failures.append(f"WEFT_CUDA_FOLD_NORM=0: {apart.get('split_store', 0)} split_store "
                        "launches, not one a layer of every decode forward")
    for ops, want, how in ((on, 2 * layers + 1, "folded"),
                           (apart, 2 * layers * forwards + forwards, "WEFT_CUDA_FOLD_NORM=0")):
        if ops.get("rmsnorm_forward", 0) != want:
            failures.append(f"{how}: {ops.get('rmsnorm_forward', 0)} rmsnorm_forward launches, "
                            f"expected {want}")
    if not filecmp.cmp(os.path.join(tmp, "on.jsonl"), os.path.join(tmp, "apart.jsonl"),
                       shallow=False):
        failures.append("the output with the norms folded differs from WEFT_CUDA_FOLD_NORM=0's")
    return failures


def split_k_cases(emulated, tmp, prompts):
    """WEFT_CUDA_GEMM_SPLIT_K=1 (with every product on cuBLASLt): the down projections, whose K
    (512) allows two parts of 256 and whose single 128 x 128 tile leaves the emulated GPU's 132
    SMs idle, run split ("matmul (split K)"), one a layer of every forward; nothing else does, and
    without the switch none."""
    mdir = os.path.join(tmp, "wide_model")
    cfg = dict(CFG, intermediate_size=512)
    files.make_model(mdir, cfg, 5, std=0.05)
    on, stats = generate(emulated, mdir, prompts, tmp, "split_on", False, split_k=True)
    off, _ = generate(emulated, mdir, prompts, tmp, "split_off", False)
    want = stats["forwards"] * cfg["num_hidden_layers"]
    print(f"WEFT_CUDA_GEMM_SPLIT_K=1: {on}")
    failures = []
    if on.get("matmul (split K)", 0) != want:
        failures.append(f"{on.get('matmul (split K)', 0)} products split K, not the {want} down "
                        "projections")
    if "matmul (split K)" in off or products(on) != products(off):
        failures.append("without WEFT_CUDA_GEMM_SPLIT_K the products differ or split K")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_emulated_cuda_test(cases, "weft_test_cuda_few_rows_"))
