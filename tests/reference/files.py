"""File I/O of weft's Python tests: safetensors, a random model directory and batch JSONL files.

  - read_safetensors / write_safetensors: safetensors parsed and written by hand (numpy arrays;
    BF16 is decoded to float32, writing is always F32).
  - make_model: config.json and model.safetensors of a random Qwen2 (or Qwen3, with model_type
    "qwen3"; shapes from qwen2.param_shapes) in a directory.
  - make_batch: a JSONL batch of random documents with masked prompts, as weft reads it, and the
    documents as the reference sees them.
"""

import json
import os
import struct

import numpy as np

from reference.qwen2 import full_cfg, param_shapes

# --------------------------------------------------------------------------------------------
# (a) safetensors
# --------------------------------------------------------------------------------------------

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_safetensors(path):
    """Returns {name: numpy array}. Decodes BF16 to float32. Checks the header's consistency."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file ({len(data)})")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info["dtype"], [int(s) for s in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        if not (0 <= begin <= end <= len(body)):
            raise ValueError(f"{path}: {name}: data_offsets {begin},{end} outside the data "
                             f"({len(body)} bytes)")
        count = int(np.prod(shape)) if shape else 1
        raw = body[begin:end]
        if dtype == "BF16":
            if len(raw) != 2 * count:
                raise ValueError(f"{path}: {name}: {len(raw)} bytes for {count} BF16 values")
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            if dtype not in _ST_DTYPES:
                raise ValueError(f"{path}: {name}: unsupported dtype {dtype}")
            dt = np.dtype(_ST_DTYPES[dtype]).newbyteorder("<")
            if len(raw) != dt.itemsize * count:
                raise ValueError(f"{path}: {name}: {len(raw)} bytes for {count} {dtype} values")
            arr = np.frombuffer(raw, dtype=dt).astype(_ST_DTYPES[dtype])
        out[name] = arr.reshape(tuple(shape)).copy()
    return out


def write_safetensors(path, tensors):
    """Writes {name: array} as F32 safetensors (names sorted, header padded to 8 bytes)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.array(tensors[name], dtype="<f4", order="C")  # keeps 0-d shape ()
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# --------------------------------------------------------------------------------------------
# (b) model directory
# --------------------------------------------------------------------------------------------

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "llama": "LlamaForCausalLM", "mimo": "MiMoForCausalLM"}


def make_model(dir, cfg, seed, std=0.2):
    """Writes config.json and model.safetensors (F32) with random weights into dir.

    Matrices ~ N(0, std^2), norm weights 1 + 0.1 N(0,1), biases 0.1 N(0,1). Returns
    (full cfg, {name: float32 numpy array}); the arrays are exactly what the file holds."""
    cfg = full_cfg(cfg)
    os.makedirs(dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.1 * rng.standard_normal(shape)
        else:
            a = std * rng.standard_normal(shape)
        params[name] = a.astype(np.float32)
    conf = dict(cfg)
    conf.setdefault("model_type", "qwen2")
    conf["architectures"] = [ARCHITECTURES[conf["model_type"]]]
    conf["hidden_act"] = "silu"
    conf["torch_dtype"] = "float32"
    with open(os.path.join(dir, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    write_safetensors(os.path.join(dir, "model.safetensors"), params)
    return cfg, params


# --------------------------------------------------------------------------------------------
# (c) batch files
# --------------------------------------------------------------------------------------------

def make_batch(path, lengths, prompt_lens, vocab, seed, no_mask=(), mask0_one=()):
    """Writes a JSONL batch, one document per line, and returns the documents as
    [{"input_ids": [...], "loss_mask": [...]}] with the effective mask (what the reference uses).

    Document i has lengths[i] random tokens; loss_mask is 0 on its first prompt_lens[i] tokens and
    1 after. Documents whose index is in no_mask are written without a loss_mask (every token but
    the first is then a target); those in mask0_one get loss_mask[0] = 1 in the file (which must
    be ignored: token 0 is never a target)."""
    rng = np.random.default_rng(seed)
    docs = []
    with open(path, "w") as f:
        for i, (L, P) in enumerate(zip(lengths, prompt_lens)):
            ids = [int(x) for x in rng.integers(0, vocab, size=L)]
            mask = [0 if t < P else 1 for t in range(L)]
            line = {"input_ids": ids}
            if i in no_mask:
                mask = [0] + [1] * (L - 1)
            else:
                written = list(mask)
                if i in mask0_one and L > 0:
                    written[0] = 1
                line["loss_mask"] = written
            mask[0] = 0
            f.write(json.dumps(line) + "\n")
            docs.append({"input_ids": ids, "loss_mask": mask})
    return docs
