"""weft grad's logits, loss and every parameter gradient on a random Qwen3 match a float64
PyTorch Qwen3.

transformers 4.45.2 (the version installed here; newer ones need torch >= 2) has no
Qwen3ForCausalLM, so the reference is built independently: tests/reference/qwen2.py with Qwen3's
attention as transformers' Qwen3Attention computes it (q_norm / k_norm: RMSNorm over each head's
head_dim values of q and k, after the projections and before RoPE; no q/k/v biases; head_dim
given explicitly), and this test writes the Qwen3 config.json (architectures
["Qwen3ForCausalLM"], model_type "qwen3") and model.safetensors itself.

Model: vocab 97, hidden 64, 4 heads of head_dim 32 (not hidden / heads = 16), 2 kv heads,
intermediate 160, 2 layers; tied and untied embeddings; recomputation off and on. The batch
packs 7 documents with masked prompt prefixes.

Tolerance: max|diff|/max|ref| <= 1e-5 per tensor (logits, loss, each gradient, the q_norm and
k_norm weights' included).
"""

import sys

from reference import fixtures, qwen2
from model.test_model_matches_pytorch import check_case

TOL = 1e-5
QWEN3 = dict(qwen2.SMALL_CFG, model_type="qwen3", head_dim=32, attention_bias=False)


def cases(weft, tmp):
    failures = []
    for tied in (False, True):
        failures += check_case(weft, tmp, f"qwen3 tied={tied}",
                               dict(QWEN3, tie_word_embeddings=tied), seed=21 + tied,
                               batch_kw={}, recomputes=("false", "true"))
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_qwen3_",
                               f"comparisons over tolerance {TOL:g} or failed"))
