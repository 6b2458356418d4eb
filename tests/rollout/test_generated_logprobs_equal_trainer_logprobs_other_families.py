"""The KV-cache forward of the other families is the trainer's: `weft generate`'s recorded
log-probs equal `weft grad --logprobs` on prompt + completion bit for bit on the CPU, as
test_generated_logprobs_equal_trainer_logprobs checks for Qwen2, for
  - a Qwen3 (q_norm / k_norm per head before RoPE, head_dim 32 != hidden / heads): the cached keys
    are the normed, rotated ones;
  - a Llama with llama3 rope scaling (original_max_position_embeddings 16, so positions past 16
    of the 300-token prompt use the scaled table in both paths).
Same prompts (1 to 300 tokens, across KV-cache blocks) and sampling (3 samples, top-p 0.9, 20 new
tokens).
"""
import os
import sys

from reference import files, fixtures
from rollout.test_generated_logprobs_equal_trainer_logprobs import CFG, compare

FAMILIES = [
    ("qwen3", dict(CFG, model_type="qwen3", head_dim=32, attention_bias=False)),
    ("llama3 rope", dict(CFG, model_type="llama", attention_bias=False,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=16))),
]


def cases(weft, tmp):
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    failures = []
    for i, (label, cfg) in enumerate(FAMILIES):
        mdir = os.path.join(tmp, f"model{i}")
        files.make_model(mdir, cfg, 50 + i, std=0.1)
        print(f"--- {label}")
        sub = os.path.join(tmp, f"run{i}")
        os.makedirs(sub)
        compare(weft, mdir, sub, "cpu", failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_logprobs_families_",
                               "log-prob mismatches or failures"))
