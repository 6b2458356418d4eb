"""`weft generate` holds the weights, the KV pool and activations, and no gradient buffer.

A trainer keeps an fp32 gradient for every parameter; generation alone never makes one, so that
memory (twice the bf16 weights on a GPU) goes to the KV pool instead. The job's statistics
(`--stats`, "memory") show gradients of 0 bytes and parameters of exactly the checkpoint's
elements in fp32 (the CPU backend's parameter type).
"""
import os
import sys

from reference import files, fixtures, qwen2
from reference.generation import generate, random_prompts, write_prompts


def cases(weft, tmp):
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, qwen2.SMALL_CFG, 3, std=0.1)
    elements = sum(t.size for t in files.read_safetensors(
        os.path.join(mdir, "model.safetensors")).values())
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts([12, 30], qwen2.SMALL_CFG["vocab_size"], 4))
    _, stats, _ = generate(weft, mdir, prompts, os.path.join(tmp, "out.jsonl"),
                           "sampling.max_tokens=4")
    mem = stats["memory"]
    print(f"generate memory: parameters {mem['parameters']} bytes ({elements} elements in the "
          f"checkpoint), gradients {mem['gradients']}, peak activations "
          f"{mem['peak_activations']}, KV pool {stats['kv']['pool_bytes']}")
    failures = []
    if mem["gradients"] != 0:
        failures.append(f"generation holds {mem['gradients']} bytes of gradients")
    if mem["parameters"] != 4 * elements:
        failures.append(f"parameters take {mem['parameters']} bytes, not 4 x {elements}")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_generate_memory_", "checks failed"))
