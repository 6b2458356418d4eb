"""A config.json or checkpoint weft does not implement is refused, never trained as another model:
each case ends in one "weft: error:" line naming what is unsupported, a non-zero exit, and nothing
written (weft train's output directory is not even created), before any compute.

Refused: an unknown architecture (the error lists the supported ones), mixture-of-experts
configs (Qwen2-MoE, Mixtral, an expert count: "MoE is not supported"), rope_scaling types other
than default/linear/llama3/yarn and unknown rope_scaling keys, hidden_act other than silu,
mlp_bias, sliding-window attention, partial rotary, Llama's attention_bias (it also biases
o_proj), an architecture and model_type that disagree, and a checkpoint tensor the model does not
use. Accepted: what real Qwen2 configs carry (sliding_window with use_sliding_window false),
transformers' rotary inv_freq buffers, and an unused tensor listed in model.drop_tensors.
"""

import json
import os
import subprocess
import sys

import numpy as np

from reference import files, fixtures, qwen2

TINY = dict(qwen2.SMALL_CFG, num_hidden_layers=1, vocab_size=300)  # >= the byte tokenizer's 257
UNUSED = "model.layers.0.self_attn.q_norm.weight"


def model_dir(tmp, name, conf_over=(), drop_keys=(), extra_tensors=None):
    """A random Qwen2 in tmp/name whose config.json gets conf_over (and loses drop_keys) and
    whose safetensors gains extra_tensors."""
    mdir = os.path.join(tmp, name)
    cfg, params = files.make_model(mdir, TINY, seed=3)
    path = os.path.join(mdir, "config.json")
    with open(path) as f:
        conf = json.load(f)
    conf.update(dict(conf_over))
    for k in drop_keys:
        conf.pop(k, None)
    with open(path, "w") as f:
        json.dump(conf, f)
    if extra_tensors:
        files.write_safetensors(os.path.join(mdir, "model.safetensors"),
                                dict(params, **extra_tensors))
    return mdir


REFUSED = [
    # name, config.json changes, words the error must hold
    ("unknown architecture", dict(architectures=["GPT2LMHeadModel"], model_type="gpt2"),
     ["GPT2LMHeadModel", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM"]),
    ("Qwen2-MoE", dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
                       num_experts=8), ["MoE is not supported"]),
    ("Mixtral", dict(architectures=["MixtralForCausalLM"], model_type="mixtral",
                     num_local_experts=8), ["MoE is not supported"]),
    ("expert count", dict(num_experts=4), ["num_experts", "MoE is not supported"]),
    ("rope type dynamic", dict(rope_scaling=dict(rope_type="dynamic", factor=2.0)),
     ["rope_scaling", "dynamic", "llama3", "yarn"]),
    ("rope type longrope (as 'type')", dict(rope_scaling=dict(type="longrope", factor=2.0)),
     ["rope_scaling", "longrope"]),
    ("rope_scaling unknown key", dict(rope_scaling=dict(rope_type="linear", factor=2.0,
                                                        mrope_section=[2, 2])),
     ["rope_scaling.mrope_section"]),
    ("hidden_act gelu", dict(hidden_act="gelu"), ["hidden_act", "gelu", "silu"]),
    ("mlp_bias", dict(mlp_bias=True), ["mlp_bias"]),
    ("sliding window", dict(use_sliding_window=True, sliding_window=16), ["use_sliding_window"]),
    ("partial rotary", dict(partial_rotary_factor=0.5), ["partial_rotary_factor"]),
    ("Llama attention_bias", dict(architectures=["LlamaForCausalLM"], model_type="llama",
                                  attention_bias=True), ["attention_bias", "Llama"]),
    ("architecture vs model_type", dict(model_type="llama"), ["Qwen2ForCausalLM", "llama"]),
]


def cases(weft, tmp):
    failures = []
    batch = os.path.join(tmp, "batch.jsonl")
    files.make_batch(batch, [9, 5], [2, 1], 257, seed=1)  # ids the byte tokenizer knows (train)
    run = os.path.join(tmp, "run")

    def refused(name, mdir, words):
        # weft train: nothing written, not even the output directory.
        p = fixtures.one_clear_error(
            f"{name} (train)", [weft, "train", f"model.path={mdir}", f"data.source={batch}",
                                "train.steps=1", "train.global_batch_size=2",
                                f"train.output_dir={run}"],
            words, wrote=lambda: os.path.exists(run))
        # weft grad: no gradient file.
        out = os.path.join(tmp, "grads.safetensors")
        q = fixtures.one_clear_error(
            f"{name} (grad)", [weft, "grad", "--model", mdir, "--batch", batch, "--out", out],
            words, wrote=lambda: os.path.exists(out))
        failures.extend(x for x in (p, q) if x)

    for i, (name, over, words) in enumerate(REFUSED):
        refused(name, model_dir(tmp, f"refused{i}", over), words)
    rng = np.random.default_rng(0)
    head = np.ones(TINY["hidden_size"] // TINY["num_attention_heads"], np.float32)
    unused = model_dir(tmp, "unused", extra_tensors={UNUSED: head})
    refused("unused tensor", unused, [UNUSED, "model.drop_tensors"])

    # Accepted: the same tensor dropped on purpose, with a Qwen2 config's usual sliding-window
    # fields (off) and transformers' rotary buffer, which is weft's own RoPE table.
    inv_freq = rng.standard_normal(8).astype(np.float32)
    ok_dir = model_dir(tmp, "accepted", dict(sliding_window=32768, use_sliding_window=False,
                                             max_window_layers=1),
                       extra_tensors={UNUSED: head,
                                      "model.layers.0.self_attn.rotary_emb.inv_freq": inv_freq})
    for drop in (f"model.drop_tensors=[{UNUSED}]", f"model.drop_tensors={UNUSED},lm_head.bias"):
        r = subprocess.run([weft, "grad", "--model", ok_dir, "--batch", batch, "--out",
                            os.path.join(tmp, "ok.safetensors"), drop],
                           capture_output=True, text=True, timeout=120)
        print(f"accepted with {drop}: exit {r.returncode}")
        if r.returncode != 0:
            failures.append(f"{drop}: refused: {r.stderr.strip()}")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_refuses_", "refusals missing or unclear"))
