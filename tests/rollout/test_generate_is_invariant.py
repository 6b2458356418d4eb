"""The same seed gives byte-identical output files whatever the engine's batching: all prompts at
once; one sequence at a time (rollout.max_running=1); prefills cut into chunks of 7 rows
(rollout.max_batch_tokens=7); a KV cache just large enough for the longest sample, so that
sequences are preempted and recomputed (the statistics count the preemptions); and on 2 and 4
ranks, each generating its share of the prompts. Sampling: temperature 0.8, top-k 20, 2 samples
per prompt, 10 prompts of 1 to 45 tokens, up to 16 new tokens, stop token 44; a model with
head_dim 64 (where BLAS would pick other kernels for fewer rows).
"""
import os
import sys

from reference import files, fixtures, qwen2
from reference.generation import check_batchings, generate, random_prompts, write_prompts

LENGTHS = [12, 1, 45, 7, 30, 3, 19, 2, 40, 8]
SAMPLING = ["sampling.temperature=0.8", "sampling.top_k=20", "sampling.n=2",
            "sampling.max_tokens=16", "sampling.seed=3", "sampling.stop_token_ids=[44]"]
# The longest sample is 45 + 16 = 61 positions: 4 blocks of 16; a 5-block pool holds it alone.
VARIANTS = [("one sequence at a time", ["rollout.max_running=1"], 1),
            ("prefill chunks of 7 rows", ["rollout.max_batch_tokens=7"], 1),
            ("a pool of 80 positions (preemptions)", ["rollout.kv_cache_tokens=80"], 1),
            ("2 ranks", [], 2), ("4 ranks", [], 4)]
CFG = dict(qwen2.SMALL_CFG, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)


def cases(weft, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, CFG, 8, std=0.1)
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts(LENGTHS, CFG["vocab_size"], 4))
    ref = os.path.join(tmp, "all.jsonl")
    rows, stats, _ = generate(weft, mdir, prompts, ref, *SAMPLING)
    tokens = sum(len(r["token_ids"]) for row in rows for r in row["responses"])
    stops = sum(r["finish_reason"] == "stop" for row in rows for r in row["responses"])
    print(f"all at once: {tokens} tokens, {stops} samples stopped at token 44")
    check_batchings(weft, mdir, prompts, ref, VARIANTS, tmp, failures, *SAMPLING)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_generate_invariant_", "checks failed"))
