"""A sharded Hugging Face model goes through weft and back: transformers reads weft's checkpoint as
the model weft trained, and weft reads transformers' shards as the model transformers has.

1. A tiny random Qwen2ForCausalLM is written by transformers' save_pretrained in BF16, F16 and F32,
   each split into at least 3 shards (max_shard_size), beside a byte-level BPE tokenizer
   (tokenizer.json, tokenizer_config.json, special_tokens_map.json) whose end-of-text id is the
   config's bos/eos. For each dtype, `weft grad --logits` on a batch of two documents gives the
   logits transformers computes (fp32, each document alone) within 1e-5 (max |diff| / max |ref|).
2. weft fine-tunes the BF16 directory for 3 steps on text tokenized by its tokenizer.json and saves
   a checkpoint in shards of train.save_shard_mb (at least 3 shards, an index, no
   model.safetensors). AutoModelForCausalLM.from_pretrained(checkpoint) loads it with no "newly
   initialized" or unused-weight warning, its weights differ from the input's (training happened),
   and its logits are weft's (`weft grad --logits` on the checkpoint) within 1e-5.
   AutoTokenizer.from_pretrained(checkpoint) tokenizes as the input tokenizer does, and
   generation_config.json was copied.
3. The checkpoint's config.json equals the input's in every field but torch_dtype (bfloat16 ->
   float32, what the weights are now saved as).
"""
import json
import logging
import os
import subprocess
import sys

import numpy as np

from reference import files
from reference.compare import compare
from reference.fixtures import grad_args, run_test, try_grad

TOL = 1e-5
CFG = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
           rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
           initializer_range=0.1)
SHARD = "40KB"      # transformers' shards of the input (a layer's MLP is 40 KB in F32)
SAVE_SHARD_MB = 0.05  # weft's: about 50 KB
EOT = "<|endoftext|>"
TEXTS = ["the quick brown fox jumps over the lazy dog", "sharded checkpoints load everywhere",
         "weft writes what transformers reads", "a tokenizer travels with its model",
         "numbers 12345 and symbols !?", "every shard the index lists is there",
         "config fields stay as they were", "three steps of fine-tuning"]


def write_tokenizer(tdir):
    """A byte-level BPE tokenizer trained on TEXTS, saved as transformers saves one; its EOT id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT, bos_token=EOT)
    fast.save_pretrained(tdir)
    return tok.token_to_id(EOT)


def write_models(tmp):
    """The tokenizer and the random model in BF16, F16 and F32 directories; returns {dtype: dir}."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    tdir = os.path.join(tmp, "tokenizer")
    eot = write_tokenizer(tdir)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**CFG, bos_token_id=eot, eos_token_id=eot)).eval()
    dirs = {}
    for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)):
        d = dirs[name] = os.path.join(tmp, name)
        model.to(dtype).save_pretrained(d, max_shard_size=SHARD, safe_serialization=True)
        for f in os.listdir(tdir):
            with open(os.path.join(tdir, f), "rb") as src, open(os.path.join(d, f), "wb") as dst:
                dst.write(src.read())
    return dirs


def shard_count(d):
    """(shards the index lists, whether a model.safetensors is there)."""
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    return len(set(index["weight_map"].values())), os.path.exists(os.path.join(d, "model.safetensors"))


class Captured(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def load_transformers(d):
    """AutoModelForCausalLM.from_pretrained(d) in fp32 and the warnings transformers logged."""
    import torch
    import transformers
    handler = Captured()
    logger = transformers.utils.logging.get_logger("transformers")
    logger.addHandler(handler)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    finally:
        logger.removeHandler(handler)
    return model.eval(), handler.messages


def transformers_logits(model, docs):
    """Each document's logits alone, rows concatenated in batch order (as weft packs them)."""
    import torch
    with torch.no_grad():
        return np.concatenate([model(torch.tensor([d])).logits[0].numpy() for d in docs])


def weft_logits(weft, d, bpath, tag, failures):
    out, _ = try_grad(weft, grad_args(d, bpath, "--logits"), tag, failures)
    return None if out is None else out["logits"]


def check_logits(tag, got, ref, failures):
    if got is None:
        return
    diff = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    print(f"  {tag}: max |weft - transformers| / max |transformers| = {diff:.2e}")
    if not compare(tag, got, ref, TOL):
        failures.append(f"{tag}: logits differ by {diff:.2e} (relative) > {TOL}")


def read_docs(bpath):
    with open(bpath) as f:
        return [json.loads(line)["input_ids"] for line in f]


def check_loads_transformers_shards(weft, dirs, bpath, failures):
    docs = read_docs(bpath)
    for name, d in dirs.items():
        n, single = shard_count(d)
        print(f"{name}: transformers wrote {n} shards")
        if n < 3 or single:
            failures.append(f"{name}: transformers wrote {n} shards (single file: {single}); need >= 3")
        model, _ = load_transformers(d)
        check_logits(f"weft on transformers' {name} shards", weft_logits(weft, d, bpath, name, failures),
                     transformers_logits(model, docs), failures)


def fine_tune(weft, src, tmp, failures):
    """3 steps of weft train on src, saved in shards; returns the checkpoint directory or None."""
    data = os.path.join(tmp, "sft.jsonl")
    with open(data, "w") as f:
        for t in TEXTS:
            f.write(json.dumps({"text": t}) + "\n")
    run = os.path.join(tmp, "run")
    cmd = [weft, "train", f"model.path={src}", f"data.source={data}",
           f"data.tokenizer={os.path.join(src, 'tokenizer.json')}", "train.steps=3",
           "train.global_batch_size=4", "train.save_every=0", f"train.save_shard_mb={SAVE_SHARD_MB}",
           f"train.output_dir={run}", "optim.lr=0.01", "optim.warmup_steps=0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        failures.append(f"weft train failed: {r.stderr.strip()}")
        return None
    return os.path.join(run, "checkpoints", "step_00000003")


def check_checkpoint(weft, src, ckpt, bpath, failures):
    from transformers import AutoTokenizer
    n, single = shard_count(ckpt)
    print(f"weft's checkpoint: {n} shards, files: {sorted(os.listdir(ckpt))}")
    if n < 3 or single:
        failures.append(f"checkpoint has {n} shards (single file: {single}); need >= 3")
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if not os.path.exists(os.path.join(ckpt, f)):
            failures.append(f"checkpoint lacks {f}")
    model, warnings = load_transformers(ckpt)
    bad = [w for w in warnings if "newly initialized" in w or "not used" in w or "not initialized" in w]
    if bad:
        failures.append(f"from_pretrained(checkpoint) warned: {bad}")
    before, _ = load_transformers(src)
    moved = max(float((a - b).abs().max()) for a, b in zip(model.state_dict().values(),
                                                           before.state_dict().values()))
    print(f"  largest weight change from the input: {moved:.3e}")
    if moved == 0:
        failures.append("the checkpoint's weights equal the input's: nothing was trained")
    check_logits("weft's checkpoint in transformers",
                 weft_logits(weft, ckpt, bpath, "checkpoint", failures),
                 transformers_logits(model, read_docs(bpath)), failures)
    mine, theirs = AutoTokenizer.from_pretrained(ckpt), AutoTokenizer.from_pretrained(src)
    for t in TEXTS:
        if mine(t)["input_ids"] != theirs(t)["input_ids"]:
            failures.append(f"AutoTokenizer(checkpoint) tokenizes {t!r} differently")


def check_config(src, ckpt, failures):
    with open(os.path.join(src, "config.json")) as f:
        before = json.load(f)
    with open(os.path.join(ckpt, "config.json")) as f:
        after = json.load(f)
    changed = {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
               if before.get(k) != after.get(k) or (k in before) != (k in after)}
    print(f"config.json fields changed by training: {changed}")
    if changed != {"torch_dtype": ("bfloat16", "float32")}:
        failures.append(f"config.json differs from the input's in more than torch_dtype: {changed}")


def cases(weft, tmp):
    failures = []
    dirs = write_models(tmp)
    bpath = os.path.join(tmp, "batch.jsonl")
    files.make_batch(bpath, [23, 14], [0, 0], CFG["vocab_size"], 7)
    check_loads_transformers_shards(weft, dirs, bpath, failures)
    ckpt = fine_tune(weft, dirs["bf16"], tmp, failures)
    if ckpt:
        check_checkpoint(weft, dirs["bf16"], ckpt, bpath, failures)
        check_config(dirs["bf16"], ckpt, failures)
    return failures


if __name__ == "__main__":
    sys.exit(run_test(cases, "weft_sharded_round_trip_"))
