"""`weft generate` survives sampling an id that no token has: a model's vocabulary is often
padded past its tokenizer's (Qwen2.5: 152064 rows for 151665 tokens), and at temperature 1 those
rows can be drawn. Such an id is kept in token_ids and decodes to nothing in text, as in Hugging
Face's decode (vLLM's detokenizer does the same); weft ended the whole run with an error instead.

A Qwen2 of 400 rows over a 320-token tokenizer, its output projection zero so that every id is
equally likely (a fifth of them past the tokenizer): 4 samples of 16 tokens of a text prompt must
draw some padded ids, finish, and give `tokenizers`' decode of their ids as text.
"""
import json
import os
import sys

import numpy as np

from reference import files, fixtures, qwen2
from reference.generation import generate, write_prompts, write_tokenizer

VOCAB = 400


def cases(weft, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    cfg, params = files.make_model(mdir, dict(qwen2.SMALL_CFG, vocab_size=VOCAB), 1, std=0.1)
    params["lm_head.weight"] = np.zeros_like(params["lm_head.weight"])
    files.write_safetensors(os.path.join(mdir, "model.safetensors"), params)
    tok = write_tokenizer(mdir)
    known = tok.get_vocab_size()
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"), ["the quick brown fox"])
    rows, _, r = generate(weft, mdir, prompts, os.path.join(tmp, "out.jsonl"), "sampling.n=4",
                          "sampling.max_tokens=16", "sampling.stop_token_ids=[]", check=False)
    if rows is None:
        return [f"weft generate failed: {r.stderr.strip()}"]
    responses = rows[0]["responses"]
    padded = sum(t >= known for x in responses for t in x["token_ids"])
    wrong = [i for i, x in enumerate(responses)
             if x["text"] != tok.decode(x["token_ids"], skip_special_tokens=False)]
    print(f"{padded} of {sum(len(x['token_ids']) for x in responses)} sampled ids past the "
          f"tokenizer's {known}; {len(wrong)} texts differ from tokenizers' decode")
    if padded == 0:
        failures.append("no id past the tokenizer was sampled: the test checks nothing")
    if wrong:
        failures.append(f"texts differ from tokenizers' decode: {[responses[i] for i in wrong]}")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_padded_ids_", "checks failed"))
