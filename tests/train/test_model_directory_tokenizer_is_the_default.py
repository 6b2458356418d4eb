"""A Hugging Face model directory's own tokenizer is the default, and `weft grad` reads data as
`weft train` does (issue 23, items 1 and 4).

On a random Qwen2 whose directory holds a BPE tokenizer.json (made by `tokenizers`) and a
tokenizer_config.json naming "<|im_end|>" as its end of text (config.json says <|endoftext|>):
- `weft grad --batch` on text and prompt/response rows tokenizes them with that tokenizer and
  closes each document with <|im_end|>: per-token log-probs equal transformers' on the same
  tokens (1e-5), and the token count is the tokenizer's plus one per document (trained on bytes,
  it was 5-8x more);
- `weft grad` without --batch takes data.source's first global batch as training would draw it,
  says which lines formed it (stats "lines"), and its loss is transformers' on those lines;
- `weft train model.path=DIR` names the tokenizer and where its end of text came from and trains
  on the same token count;
- the end of text comes from generation_config.json, then config.json, when tokenizer_config.json
  does not name one;
- a model directory without tokenizer.json and text data is one clear error naming
  data.tokenizer; data.tokenizer=bytes trains on UTF-8 bytes when asked."""
import json, os, shutil, subprocess

import numpy as np
import torch

from reference import fixtures, runner
from reference.generation import write_tokenizer

CFG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
           tie_word_embeddings=False)
ROWS = [{"text": "the quick brown fox jumps over the lazy dog"},
        {"prompt": "2 + 3 = ", "response": "5"},
        {"text": "to be or not to be"},
        {"prompt": "a stitch in ", "response": "time saves nine"},
        {"text": "7 * 6 = 42, the question"},
        {"prompt": "the lazy ", "response": "dog jumps"}]


def make_model_dir(mdir):
    """Model files, tokenizer.json with <|im_end|> added, tokenizer_config.json naming it as the
    end of text and config.json naming <|endoftext|>. Returns (tokenizer, eos id, config eos id)."""
    os.makedirs(mdir)
    tok = write_tokenizer(mdir, vocab_size=300)
    tok.add_special_tokens(["<|im_end|>"])
    tok.save(os.path.join(mdir, "tokenizer.json"))
    eos, other = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(3)
    config = Qwen2Config(**CFG, vocab_size=tok.get_vocab_size() + 5, eos_token_id=other,
                         initializer_range=0.2, attn_implementation="eager")
    Qwen2ForCausalLM(config).float().save_pretrained(mdir, safe_serialization=True)
    with open(os.path.join(mdir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return tok, eos, other


def documents(tok, eos, rows):
    """(tokens, target mask) of each row as training reads it."""
    docs = []
    for r in rows:
        if "text" in r:
            ids = tok.encode(r["text"]).ids + [eos]
            mask = [0] + [1] * (len(ids) - 1)
        else:
            p, resp = tok.encode(r["prompt"]).ids, tok.encode(r["response"]).ids
            ids = p + resp + [eos]
            mask = [0] * len(p) + [1] * (len(resp) + 1)
        docs.append((ids, mask))
    return docs


def reference_logprobs(mdir, docs):
    """transformers' log p(token t | tokens before it) at every position (0 at t = 0), per doc."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(mdir, torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids, _ in docs:
            x = torch.tensor([ids])
            logp = torch.log_softmax(model(x).logits[0].double(), -1)
            lp = [0.0] + [logp[t - 1, ids[t]].item() for t in range(1, len(ids))]
            out.append(np.array(lp))
    return out


def mean_loss(docs, lps):
    num = sum(-(lp * np.array(m)).sum() for (_, m), lp in zip(docs, lps))
    return num / sum(sum(m) for _, m in docs)


def run(weft, *args):
    return subprocess.run([weft, *args], capture_output=True, text=True, timeout=300)


def body(weft, tmp):
    failures = []
    mdir, data = os.path.join(tmp, "model"), os.path.join(tmp, "sft.jsonl")
    tok, eos, config_eos = make_model_dir(mdir)
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS)
    docs = documents(tok, eos, ROWS)
    lps = reference_logprobs(mdir, docs)
    n_tokens = sum(len(ids) for ids, _ in docs)

    # weft grad --batch: the model's tokenizer and end of text, transformers' log-probs.
    t, s = runner.run_weft(weft, ["grad", "--model", mdir, "--batch", data, "--logprobs"])
    if s["tokens"] != n_tokens:
        failures.append(f"grad --batch: {s['tokens']} tokens, the tokenizer gives {n_tokens}")
    else:
        want = np.concatenate([lp * np.array(m) for (_, m), lp in zip(docs, lps)])
        err = np.abs(t["logprobs"] - want).max()
        print(f"grad --batch: {n_tokens} tokens, log-probs vs transformers max abs err {err:.2e}")
        if err > 1e-5:
            failures.append(f"grad --batch: log-probs differ from transformers' by {err:.2e}")
    if s["lines"] != list(range(1, len(ROWS) + 1)):
        failures.append(f"grad --batch: lines {s['lines']}")

    # weft grad without --batch: data.source's first global batch, its lines named.
    t, s = runner.run_weft(weft, ["grad", "--model", mdir, f"data.source={data}",
                                  "train.global_batch_size=3"])
    lines = s["lines"]
    if len(set(lines)) != 3 or not all(1 <= l <= len(ROWS) for l in lines):
        failures.append(f"grad from data.source: lines {lines}")
    else:
        pick = [l - 1 for l in lines]
        want = mean_loss([docs[i] for i in pick], [lps[i] for i in pick])
        print(f"grad from data.source: lines {lines}, loss {s['loss']:.8f} vs transformers "
              f"{want:.8f}")
        if abs(s["loss"] - want) > 1e-5 * abs(want):
            failures.append(f"grad from data.source: loss {s['loss']} vs {want}")

    # weft train names its tokenizer and trains on the tokenizer's tokens.
    out = os.path.join(tmp, "run")
    r = run(weft, "train", f"model.path={mdir}", f"data.source={data}", "train.steps=1",
            f"train.global_batch_size={len(ROWS)}", f"train.output_dir={out}")
    line = next((l for l in r.stdout.splitlines() if l.startswith("tokenizer:")), "")
    print("train:", line)
    if r.returncode or f"{mdir}/tokenizer.json" not in line or \
            f"id {eos} (from tokenizer_config.json)" not in line:
        failures.append(f"train: tokenizer line {line!r}: {r.stderr}")
    else:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            tokens = json.loads(f.readline())["tokens"]
        if tokens != n_tokens:
            failures.append(f"train: {tokens} tokens in step 1, the tokenizer gives {n_tokens}")

    # The end of text from generation_config.json, then config.json.
    os.remove(os.path.join(mdir, "tokenizer_config.json"))
    with open(os.path.join(mdir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [eos, config_eos]}, f)
    for source, want in (("generation_config.json", eos), ("config.json", config_eos)):
        r = run(weft, "train", f"model.path={mdir}", f"data.source={data}", "train.steps=1",
                "train.global_batch_size=2", f"train.output_dir={out}2")
        line = next((l for l in r.stdout.splitlines() if l.startswith("tokenizer:")), "")
        print("train:", line)
        if f"id {want} (from {source})" not in line:
            failures.append(f"end of text from {source}: {line!r} {r.stderr}")
        if source == "generation_config.json":
            os.remove(os.path.join(mdir, source))

    # No tokenizer.json: text is one clear error; bytes only when asked.
    os.remove(os.path.join(mdir, "tokenizer.json"))
    bare = os.path.join(tmp, "bare_run")
    r = run(weft, "train", f"model.path={mdir}", f"data.source={data}", "train.steps=1",
            "train.global_batch_size=2", f"train.output_dir={bare}")
    errors = [l for l in r.stderr.splitlines() if "error" in l]
    print("no tokenizer.json:", errors[:1])
    if r.returncode == 0 or len(errors) != 1 or "data.tokenizer" not in errors[0] or \
            os.path.exists(bare):
        failures.append(f"no tokenizer.json: exit {r.returncode}, {r.stderr!r}")
    r = run(weft, "train", f"model.path={mdir}", f"data.source={data}", "data.tokenizer=bytes",
            "train.steps=1", "train.global_batch_size=6", f"train.output_dir={bare}")
    n_bytes = sum(len((x.get("text") or x["prompt"] + x["response"]).encode()) + 1 for x in ROWS)
    if r.returncode:
        failures.append(f"data.tokenizer=bytes: {r.stderr}")
    else:
        with open(os.path.join(bare, "metrics.jsonl")) as f:
            tokens = json.loads(f.readline())["tokens"]
        print(f"data.tokenizer=bytes: {tokens} tokens ({n_bytes} bytes + ends)")
        if tokens != n_bytes:
            failures.append(f"data.tokenizer=bytes: {tokens} tokens, expected {n_bytes}")
    return failures


if __name__ == "__main__":
    raise SystemExit(fixtures.run_test(body, "weft_model_tokenizer_"))
