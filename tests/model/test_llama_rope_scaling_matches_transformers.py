"""weft grad's logits, loss and every parameter gradient on tiny random `LlamaForCausalLM`s with
scaled RoPE match transformers' own model.

Each model is made by transformers 4.45.2 (random init, then save_pretrained: its config.json and
model.safetensors), so the rope_scaling fields are read as transformers writes them. Two cases:
  - llama3 scaling (factor 8, low/high_freq_factor 1/4, original_max_position_embeddings 16: at
    head_dim 16 one frequency is blended and the lower ones divided by 8), untied embeddings;
  - yarn (factor 4, max_position_embeddings 64, spelled "type" as older configs do: the ramp covers
    the first dimensions, and cos and sin are scaled by 0.1 ln 4 + 1), tied embeddings,
    recomputation on and off.
The reference is transformers' forward (eager attention) in float64, one document at a time with
positions from 0, and the token-mean cross-entropy over the batch's targets; its gradients come
from autograd.

Tolerance: max|diff|/max|ref| <= 1e-5 per tensor (logits, loss, each gradient). transformers forms
cos and sin in float32 even in a float64 model, so the reference itself carries ~1e-7 error.
"""

import os
import sys

import numpy as np

from reference import fixtures, files

TOL = 1e-5
LENGTHS = [13, 1, 2, 9, 24, 5, 17]
PROMPTS = [4, 1, 1, 3, 6, 5, 2]
BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0,
            max_position_embeddings=64)
CASES = [
    ("llama3", dict(tie_word_embeddings=False,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=16)),
     ("false",)),
    ("yarn", dict(tie_word_embeddings=True, rope_scaling=dict(type="yarn", factor=4.0)),
     ("false", "true")),
]


def make_llama(mdir, over, seed):
    """A random LlamaForCausalLM written by save_pretrained into mdir; returns the model (float64)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(**BASE, **over, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # norms away from 1, so their gradients are exercised
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(mdir)
    return model.double().eval()


def reference(model, docs):
    """Loss, logits (T, V) and {name: gradient} of the batch's token-mean cross-entropy."""
    import torch
    model.zero_grad()
    n_targets = sum(sum(d["loss_mask"][1:]) for d in docs)
    total, logits = 0.0, []
    for d in docs:
        ids = torch.tensor([d["input_ids"]], dtype=torch.long)
        out = model(input_ids=ids).logits[0]  # (L, V)
        logits.append(out.detach().numpy())
        mask = torch.tensor(d["loss_mask"][1:], dtype=torch.float64)
        lp = torch.log_softmax(out[:-1], dim=-1)
        nll = -lp.gather(1, ids[0, 1:, None])[:, 0]
        loss = (nll * mask).sum() / n_targets
        loss.backward()
        total += float(loss)
    grads = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}
    return np.float64(total), np.concatenate(logits), grads


def cases(weft, tmp):
    failures = []
    for label, over, recomputes in CASES:
        mdir = os.path.join(tmp, label)
        model = make_llama(mdir, over, seed=len(label))
        bpath = os.path.join(mdir, "batch.jsonl")
        docs = files.make_batch(bpath, LENGTHS, PROMPTS, BASE["vocab_size"], seed=7)
        loss, logits, grads = reference(model, docs)
        print(f"[{label}] rope_scaling {over['rope_scaling']}, reference loss {loss:.10f}")
        for rc in recomputes:
            tag = f"{label}, recompute={rc}"
            print(f"--- {tag}")
            out, _ = fixtures.try_grad(weft, fixtures.grad_args(mdir, bpath, "--logits",
                                                                f"train.recompute={rc}"),
                                       tag, failures)
            if out is not None:
                bad = fixtures.compare_loss_and_grads(out, loss, grads, TOL, logits=logits)
                failures += [f"{tag}: {b}" for b in bad]
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_llama_rope_",
                               f"comparisons over tolerance {TOL:g} or failed"))
