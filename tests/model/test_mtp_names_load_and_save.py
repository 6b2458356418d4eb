"""MTP checkpoints named as MiMo and DeepSeek-V3 name them load as the same model and are written
back under the names they came with.

A random Qwen2 with two MTP modules (vocab 300, hidden 64, 2 layers) is written three ways:
  - weft's names: model.mtp_layers.K.{enorm, hnorm, eh_proj, <decoder layer>, final_layernorm};
  - MiMo's (MiMoForCausalLM, as XiaomiMiMo's modeling file and vLLM's mimo_mtp.py read them):
    model.mtp_layers.K.{token_layernorm, hidden_layernorm, input_proj, <decoder layer>,
    final_layernorm}, input_proj reading [hidden; embedding], so its column halves are swapped;
  - DeepSeek-V3's: model.layers.{L+K}.{enorm, hnorm, eh_proj, <decoder layer>, shared_head.norm},
    with the per-module copies of the shared embedding and head (embed_tokens,
    shared_head.head) that DeepSeek-V3's checkpoints hold.
For each, weft grad's loss, MTP losses, logits and every gradient, under the file's names (the
MiMo input_proj gradient's halves swapped accordingly), match the float64 PyTorch reference
within 1e-5 (max|diff|/max|ref|), and no gradient appears under another name. One weft train step
then writes a checkpoint whose model.safetensors holds exactly the input's tensor names and whose
config.json keeps the architecture. A DeepSeek copy that differs from the shared tensor is one
clear error (weft cannot train separate copies).
"""

import glob
import json
import os
import subprocess
import sys

import numpy as np

from reference import files, fixtures, qwen2

TOL = 1e-5
CFG = dict(qwen2.SMALL_CFG, vocab_size=300, num_nextn_predict_layers=2)
LENGTHS, PROMPTS = [13, 1, 2, 9, 3, 24, 5, 17], [4, 1, 1, 3, 1, 6, 5, 2]
L, C = CFG["num_hidden_layers"], CFG["hidden_size"]
OWN = {"mimo": {"enorm.weight": "token_layernorm.weight", "hnorm.weight": "hidden_layernorm.weight",
                "eh_proj.weight": "input_proj.weight"},
       "deepseek": {"final_layernorm.weight": "shared_head.norm.weight"}}


def rename(scheme, name):
    """A weft tensor name under the scheme."""
    if not name.startswith("model.mtp_layers."):
        return name
    k, suffix = name.split(".", 3)[2:]
    suffix = OWN[scheme].get(suffix, suffix)
    return (f"model.layers.{L + int(k)}.{suffix}" if scheme == "deepseek"
            else f"model.mtp_layers.{k}.{suffix}")


def convert(scheme, tensors):
    """{name: array} under the scheme; MiMo's input_proj has the halves swapped."""
    out = {}
    for name, a in tensors.items():
        if scheme == "mimo" and name.endswith("eh_proj.weight"):
            a = np.concatenate([a[:, C:], a[:, :C]], axis=1)
        out[rename(scheme, name)] = a
    return out


def write_scheme(tmp, scheme, params, batch_docs_path, copies_differ=False):
    mdir = os.path.join(tmp, scheme + ("_bad" if copies_differ else ""))
    cfg = dict(CFG, model_type="mimo") if scheme == "mimo" else CFG
    files.make_model(mdir, cfg, seed=1)  # config.json (the weights are replaced below)
    tensors = convert(scheme, params)
    if scheme == "deepseek":
        for k in range(CFG["num_nextn_predict_layers"]):
            tensors[f"model.layers.{L + k}.embed_tokens.weight"] = params["model.embed_tokens.weight"]
            head = params["lm_head.weight"] + (0.5 if copies_differ else 0.0)
            tensors[f"model.layers.{L + k}.shared_head.head.weight"] = head
    files.write_safetensors(os.path.join(mdir, "model.safetensors"), tensors)
    return mdir, tensors


def saved_names(weft, mdir, batch, tmp, failures, scheme):
    """One weft train step from mdir; checks the checkpoint's tensor names and architecture."""
    run = os.path.join(tmp, f"run_{scheme}")
    args = [weft, "train", f"model.path={mdir}", f"data.source={batch}", "train.steps=1",
            f"train.global_batch_size={len(LENGTHS)}", f"train.output_dir={run}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    saved = sorted(glob.glob(os.path.join(run, "checkpoints", "*", "model.safetensors")))
    if r.returncode != 0 or not saved:
        failures.append(f"{scheme}: weft train failed or saved nothing: {r.stderr.strip()}")
        return
    got = set(files.read_safetensors(saved[-1]))
    want = set(files.read_safetensors(os.path.join(mdir, "model.safetensors")))
    with open(os.path.join(os.path.dirname(saved[-1]), "config.json")) as f:
        arch = json.load(f)["architectures"]
    with open(os.path.join(mdir, "config.json")) as f:
        arch_in = json.load(f)["architectures"]
    print(f"[{scheme}] saved {len(got)} tensors, input {len(want)}; missing "
          f"{sorted(want - got)[:3]}, extra {sorted(got - want)[:3]}; architectures {arch}")
    if got != want:
        failures.append(f"{scheme}: saved names differ from the input's")
    if arch != arch_in:
        failures.append(f"{scheme}: architectures {arch} written for input {arch_in}")


def cases(weft, tmp):
    failures = []
    base = os.path.join(tmp, "weft_names")
    cfg, params, bpath, docs = fixtures.model_and_batch(base, CFG, 61, LENGTHS, PROMPTS, 161)
    loss, logits, grads, mtp = qwen2.reference_grad(params, cfg, docs, with_mtp=True)
    # weft train without a tokenizer.json reads ids of its byte tokenizer (257)
    train_batch = os.path.join(tmp, "train.jsonl")
    files.make_batch(train_batch, LENGTHS, PROMPTS, 257, seed=2)
    for scheme in ("mimo", "deepseek"):
        mdir, tensors = write_scheme(tmp, scheme, params, bpath)
        print(f"--- {scheme}: {sorted(n for n in tensors if 'mtp' in n or f'layers.{L}' in n)[:4]} ...")
        out, _ = fixtures.try_grad(weft, fixtures.grad_args(mdir, bpath, "--logits"), scheme,
                                   failures)
        if out is not None:
            bad = fixtures.compare_loss_and_grads(out, np.float64(loss), convert(scheme, grads),
                                                  TOL, logits=logits, mtp_losses=mtp)
            failures += [f"{scheme}: {b}" for b in bad]
        saved_names(weft, mdir, train_batch, tmp, failures, scheme)
    bad_dir, _ = write_scheme(tmp, "deepseek", params, bpath, copies_differ=True)
    problem = fixtures.one_clear_error(
        "DeepSeek head copy differs", [weft, "grad", "--model", bad_dir, "--batch", bpath,
                                       "--out", os.path.join(tmp, "g.safetensors")],
        [f"model.layers.{L}.shared_head.head.weight", "differs", "lm_head.weight"],
        wrote=lambda: os.path.exists(os.path.join(tmp, "g.safetensors")))
    if problem:
        failures.append(problem)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_mtp_names_",
                               f"comparisons over tolerance {TOL:g} or failed"))
