"""Text is encoded with the special tokens the tokenizer's post_processor puts around it, as
transformers and vLLM encode it (encode(text), add_special_tokens=True): Llama 3 puts
<|begin_of_text|> first, and a Llama model fed text without it sees an input unlike all it was
trained on.

A Llama written by `transformers` (random weights) whose directory holds a byte-level BPE
tokenizer.json with Llama 3's post_processor (a Sequence of ByteLevel and a TemplateProcessing
"<|begin_of_text|> $A") and a tokenizer_config.json naming <|eot_id|> its end of text:
- `weft grad --batch --logprobs` on text and prompt/response rows trains on <|begin_of_text|>,
  the text's tokens and <|eot_id|>: the token count is that, and the per-token log-probs equal
  transformers' on those ids (1e-5); a text already starting with <|begin_of_text|> (a rendered
  chat template) gets it once;
- greedy `weft generate` of text prompts picks the tokens transformers' greedy generate picks
  from tokenizer(prompt)'s ids, <|begin_of_text|> included (and not those it picks without).
"""
import json
import os

import numpy as np
import torch

from reference import fixtures, runner
from reference.generation import generate, write_tokenizer

BOT, EOT_ID = "<|begin_of_text|>", "<|eot_id|>"
CFG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
           tie_word_embeddings=False, initializer_range=0.1)
ROWS = [{"text": "the quick brown fox jumps over the lazy dog"},
        {"prompt": "2 + 3 = ", "response": "5"},
        {"text": BOT + "to be or not to be"},
        {"prompt": "a stitch in ", "response": "time saves nine"}]
PROMPTS = ["the quick brown", "2 + 3 =", "to be or not", "a stitch"]
NEW_TOKENS = 8


def make_model_dir(mdir):
    """Returns the `tokenizers` Tokenizer, the <|begin_of_text|> id and the end-of-text id."""
    from tokenizers import processors
    from transformers import LlamaConfig, LlamaForCausalLM
    os.makedirs(mdir)
    tok = write_tokenizer(mdir, vocab_size=300)
    tok.add_special_tokens([BOT, EOT_ID])
    bot, eot = tok.token_to_id(BOT), tok.token_to_id(EOT_ID)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOT} $A", pair=f"{BOT} $A {BOT} $B:1",
                                      special_tokens=[(BOT, bot)])])
    tok.save(os.path.join(mdir, "tokenizer.json"))
    with open(os.path.join(mdir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOT, "eos_token": EOT_ID,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    torch.manual_seed(5)
    config = LlamaConfig(**CFG, vocab_size=tok.get_vocab_size(), bos_token_id=bot,
                         eos_token_id=eot, attn_implementation="eager")
    LlamaForCausalLM(config).float().save_pretrained(mdir, safe_serialization=True)
    return tok, bot, eot


def documents(tok, bot, eot):
    """(ids, target mask) of each row as transformers' tokenizer gives it, closed by eot."""
    docs = []
    for r in ROWS:
        if "text" in r:
            ids = tok.encode(r["text"], add_special_tokens=False).ids
            ids = (ids if ids[:1] == [bot] else [bot] + ids) + [eot]
            docs.append((ids, [0] + [1] * (len(ids) - 1)))
        else:
            p = tok.encode(r["prompt"]).ids  # with <|begin_of_text|>
            resp = tok.encode(r["response"], add_special_tokens=False).ids
            docs.append((p + resp + [eot], [0] * len(p) + [1] * (len(resp) + 1)))
    return docs


def reference_logprobs(model, docs):
    out = []
    with torch.no_grad():
        for ids, mask in docs:
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
            lp = [0.0] + [logp[t - 1, ids[t]].item() for t in range(1, len(ids))]
            out.append(np.array(lp) * np.array(mask))
    return np.concatenate(out)


def greedy(model, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
    return out[0, len(ids):].tolist()


def body(weft, tmp):
    from transformers import LlamaForCausalLM
    failures = []
    mdir, data = os.path.join(tmp, "model"), os.path.join(tmp, "sft.jsonl")
    tok, bot, eot = make_model_dir(mdir)
    model = LlamaForCausalLM.from_pretrained(mdir, torch_dtype=torch.float32).eval()
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS)

    docs = documents(tok, bot, eot)
    n_tokens = sum(len(ids) for ids, _ in docs)
    t, s = runner.run_weft(weft, ["grad", "--model", mdir, "--batch", data, "--logprobs"])
    if s["tokens"] != n_tokens:
        failures.append(f"grad --batch: {s['tokens']} tokens; with one {BOT} a document "
                        f"{n_tokens}")
    else:
        err = np.abs(t["logprobs"] - reference_logprobs(model, docs)).max()
        print(f"grad --batch: {n_tokens} tokens ({len(docs)} with {BOT} once), log-probs vs "
              f"transformers max abs err {err:.2e}")
        if err > 1e-5:
            failures.append(f"grad --batch: log-probs differ from transformers' by {err:.2e}")

    prompts = os.path.join(tmp, "prompts.jsonl")
    with open(prompts, "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    rows, _, _ = generate(weft, mdir, prompts, os.path.join(tmp, "out.jsonl"),
                          "sampling.temperature=0", f"sampling.max_tokens={NEW_TOKENS}",
                          "sampling.stop_token_ids=[]")
    mine = [r["responses"][0]["token_ids"] for r in rows]
    with_bot = [greedy(model, tok.encode(p).ids) for p in PROMPTS]
    without = [greedy(model, tok.encode(p, add_special_tokens=False).ids) for p in PROMPTS]
    same = sum(a == b for a, b in zip(mine, with_bot))
    as_without = sum(a == b for a, b in zip(mine, without))
    print(f"generate: {same} of {len(PROMPTS)} greedy completions equal transformers' from "
          f"tokenizer(prompt) ({as_without} equal those without {BOT})")
    if same != len(PROMPTS):
        failures.append(f"generate: weft {mine}, transformers from tokenizer(prompt) {with_bot}")
    if with_bot == without:
        failures.append(f"the test cannot tell: {BOT} changes no completion")
    return failures


if __name__ == "__main__":
    raise SystemExit(fixtures.run_test(body, "weft_test_special_tokens_"))
