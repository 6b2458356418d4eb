"""A sharded model directory that does not hold together is one clear error before any compute.

A random Qwen2 is split into three shards with model.safetensors.index.json as save_pretrained
writes them; it loads (weft grad runs). Then each way the files can disagree is made in a copy:
a shard the index lists is missing; a shard holds a tensor the index maps to another shard; a
shard lacks a tensor the index maps to it; a shard holds a tensor the index does not list; the
index is not JSON, has no weight_map, or names a shard outside the directory; the directory has
neither model.safetensors nor an index (the error says what it holds). Each must stop both
`weft grad` and `weft train` with a non-zero exit and one "weft: error:" line naming the problem,
and write nothing (no --out file, no train.output_dir).
"""
import json
import os
import shutil
import subprocess
import sys

from reference import files
from reference.fixtures import grad_args, one_clear_error, run_test

CFG = dict(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
           num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
INDEX = "model.safetensors.index.json"


def shard_name(k, n=3):
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def write_sharded(mdir):
    """A random model in mdir as three shards and an index; returns {shard: {name: array}}."""
    _, params = files.make_model(mdir, CFG, seed=3)
    os.remove(os.path.join(mdir, "model.safetensors"))
    names = list(params)
    cut = [0, len(names) // 3, 2 * len(names) // 3, len(names)]
    shards = {shard_name(k + 1): {n: params[n] for n in names[cut[k]:cut[k + 1]]} for k in range(3)}
    for shard, tensors in shards.items():
        files.write_safetensors(os.path.join(mdir, shard), tensors)
    weight_map = {n: s for s, tensors in shards.items() for n in tensors}
    write_index(mdir, weight_map)
    return shards


def write_index(mdir, weight_map, text=None):
    total = 0  # weft does not check total_size; the value is only there as transformers writes it
    with open(os.path.join(mdir, INDEX), "w") as f:
        f.write(text if text is not None else
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def variants(good, shards, tmp):
    """(name, directory, strings the error must hold) for each broken copy of the model in good."""
    weight_map = {n: s for s, tensors in shards.items() for n in tensors}
    first = sorted(shards[shard_name(1)])[0]
    second = sorted(shards[shard_name(2)])[0]

    def copy(name, edit):
        d = os.path.join(tmp, name)
        shutil.copytree(good, d)
        edit(d)
        return d

    def drop_from_shard(d):
        kept = {n: a for n, a in shards[shard_name(2)].items() if n != second}
        files.write_safetensors(os.path.join(d, shard_name(2)), kept)

    yield ("missing shard", copy("missing", lambda d: os.remove(os.path.join(d, shard_name(2)))),
           [shard_name(2), "missing"])
    yield ("tensor the index maps elsewhere",
           copy("elsewhere", lambda d: write_index(d, dict(weight_map, **{first: shard_name(3)}))),
           [shard_name(1), first, "maps to", shard_name(3)])
    yield ("shard lacks a tensor the index maps to it", copy("lacks", drop_from_shard),
           [shard_name(2), second, "does not hold it"])
    yield ("tensor the index does not list",
           copy("unlisted", lambda d: write_index(d, {n: s for n, s in weight_map.items()
                                                      if n != first})),
           [shard_name(1), first, "does not list"])
    yield ("index is not JSON", copy("not_json", lambda d: write_index(d, None, "{\"weight_map\":")),
           [INDEX, "not valid JSON"])
    yield ("index without weight_map",
           copy("no_map", lambda d: write_index(d, None, '{"metadata": {"total_size": 1}}')),
           [INDEX, "weight_map"])
    yield ("index naming a shard outside the directory",
           copy("outside", lambda d: write_index(d, dict(weight_map, **{first: "../x.safetensors"}))),
           [INDEX, first, "file name in the model directory"])

    def pytorch_only(d):
        for name in os.listdir(d):
            if name.endswith(".safetensors") or name == INDEX:
                os.remove(os.path.join(d, name))
        open(os.path.join(d, "pytorch_model.bin"), "wb").close()
    yield ("directory without safetensors weights", copy("no_weights", pytorch_only),
           ["model.safetensors", INDEX, "pytorch_model.bin", "config.json"])


def cases(weft, tmp):
    failures = []
    good = os.path.join(tmp, "good")
    shards = write_sharded(good)
    bpath = os.path.join(tmp, "batch.jsonl")
    files.make_batch(bpath, [9, 7], [2, 0], CFG["vocab_size"], 1)
    data = os.path.join(tmp, "data.jsonl")
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"input_ids": [(i * 7 + j) % CFG["vocab_size"] for j in range(6)]}) + "\n")
    out = os.path.join(tmp, "out.safetensors")
    r = subprocess.run([weft, *grad_args(good, bpath), "--out", out], capture_output=True, text=True)
    print(f"intact sharded model (control): exit {r.returncode}")
    if r.returncode != 0 or not os.path.exists(out):
        failures.append(f"the intact sharded model did not load: {r.stderr.strip()}")
    if os.path.exists(out):
        os.remove(out)

    for name, d, must in variants(good, shards, tmp):
        failures.append(one_clear_error(f"{name} (grad)", [weft, *grad_args(d, bpath), "--out", out],
                                        must, lambda: os.path.exists(out)))
        run = os.path.join(tmp, "run_" + os.path.basename(d))
        failures.append(one_clear_error(
            f"{name} (train)", [weft, "train", f"model.path={d}", f"data.source={data}",
                                "train.steps=1", "train.global_batch_size=2",
                                f"train.output_dir={run}"],
            must, lambda: os.path.exists(run)))
    return [f for f in failures if f]


if __name__ == "__main__":
    sys.exit(run_test(cases, "weft_bad_shards_"))
