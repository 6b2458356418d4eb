"""The n samples of a prompt hold its KV-cache blocks once.

8 samples of one 500-token prompt, 8 new tokens each, blocks of 16 positions: the prompt fills 31
blocks and part of a 32nd. The job's statistics show the prompt's blocks shared by the samples
(peak shared >= 31: every full block), the samples copying only the partly filled last block
(7 copies on write: the last sample to write into it finds it its own), and a peak far below 8
separate copies of the prompt: at most 32 + 2 blocks of its own per sample (its copy of the last
block and one to grow into).
"""
import os
import sys

from reference import files, fixtures, qwen2
from reference.generation import generate, random_prompts, write_prompts

N, PROMPT, NEW, BLOCK = 8, 500, 8, 16


def cases(weft, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, qwen2.SMALL_CFG, 2, std=0.1)
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts([PROMPT], qwen2.SMALL_CFG["vocab_size"], 1))
    rows, stats, _ = generate(weft, mdir, prompts, os.path.join(tmp, "out.jsonl"),
                              f"sampling.n={N}", f"sampling.max_tokens={NEW}",
                              f"rollout.block_size={BLOCK}")
    kv = stats["kv"]
    full, prompt_blocks = PROMPT // BLOCK, (PROMPT + BLOCK - 1) // BLOCK
    unshared = N * ((PROMPT + NEW + BLOCK - 1) // BLOCK)
    print(f"{N} samples of a {PROMPT}-token prompt: KV blocks peak {kv['peak_used']} (without "
          f"sharing {unshared}), peak shared {kv['peak_shared']}, copies on write {kv['copies']}")
    if len(rows[0]["responses"]) != N or any(len(r["token_ids"]) != NEW for r in rows[0]["responses"]):
        failures.append("the samples are not all there with their tokens")
    if kv["peak_shared"] < full:
        failures.append(f"only {kv['peak_shared']} blocks were ever shared, not the prompt's {full}")
    if kv["copies"] != N - 1:
        failures.append(f"{kv['copies']} copies on write, not one per sample but the last ({N - 1})")
    if kv["peak_used"] > prompt_blocks + 2 * N:
        failures.append(f"peak {kv['peak_used']} blocks: the prompt is held more than once")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_generate_sharing_", "checks failed"))
