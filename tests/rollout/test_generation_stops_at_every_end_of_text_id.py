"""`weft generate` stops where `transformers` generate stops: at any end-of-text id the model
directory lists, not only the first.

Instruct models end a turn with an id that is often only in a list: Llama 3.1 lists
[128001, 128008, 128009] in config.json and generation_config.json and ends turns with the last;
Qwen2.5-Instruct's generation_config.json adds <|endoftext|> to config.json's <|im_end|>. An engine
that stops at the first id alone generates past the end of every answer, up to max_tokens.

A Llama written by `transformers` (random weights) and 6 prompts: greedy with
`sampling.stop_token_ids=[]` gives each prompt's free-running tokens; the end-of-text list is
then [an id no prompt generates, the id prompt 0 generates 3rd, the id prompt 1 generates 6th],
so that a first-id-only engine never stops. With that list
- in generation_config.json (config.json naming only its first id),
- in config.json (no generation_config.json),
every sample must end at its first listed id with finish_reason "stop" (the rest at max_tokens
with "length"), and `transformers`' greedy generate of the same directory (which reads
generation_config.json) must give the same tokens. `sampling.stop_token_ids=[...]` still decides
alone when given.
"""
import json
import os
import sys

from reference import fixtures
from reference.generation import generate, random_prompts, write_prompts

NEW_TOKENS = 16
CFG = dict(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
           rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
           initializer_range=0.1)


def write_model(mdir):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(**CFG, attn_implementation="eager")).float().eval()
    model.save_pretrained(mdir, safe_serialization=True)


def set_end_ids(mdir, config_ids, generation_ids):
    """config.json's eos_token_id, and generation_config.json's (None: no such file)."""
    path = os.path.join(mdir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["eos_token_id"] = config_ids
    with open(path, "w") as f:
        json.dump(cfg, f)
    gen = os.path.join(mdir, "generation_config.json")
    if generation_ids is None:
        if os.path.exists(gen):
            os.remove(gen)
    else:
        with open(gen, "w") as f:
            json.dump({"eos_token_id": generation_ids, "pad_token_id": generation_ids[0]}, f)


def expected(free, ids):
    """Each sample's tokens up to and including its first id of `ids`, and its finish reason."""
    out = []
    for toks in free:
        k = next((i for i, t in enumerate(toks) if t in ids), None)
        out.append((toks, "length") if k is None else (toks[:k + 1], "stop"))
    return out


def transformers_greedy(mdir, prompts):
    import torch
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(mdir, torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    got = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS)[0, len(p):].tolist()
            k = next((i for i, t in enumerate(seq) if t in eos), None)
            got.append(seq if k is None else seq[:k + 1])  # drop the padding after the end
    return got


def cases(weft, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    write_model(mdir)
    prompts = random_prompts([4, 9, 17, 25, 33, 40], CFG["vocab_size"], 11)
    path = write_prompts(os.path.join(tmp, "prompts.jsonl"), prompts)
    out = os.path.join(tmp, "out.jsonl")
    greedy = ["sampling.temperature=0", f"sampling.max_tokens={NEW_TOKENS}"]

    rows, _, _ = generate(weft, mdir, path, out, *greedy, "sampling.stop_token_ids=[]")
    free = [r["responses"][0]["token_ids"] for r in rows]
    seen = {t for toks in free for t in toks}
    never = next(t for t in range(CFG["vocab_size"]) if t not in seen)
    ids = [never, free[0][2], free[1][5]]
    want = expected(free, set(ids))
    stops = sum(reason == "stop" for _, reason in want)
    print(f"end-of-text ids {ids}: {stops} of {len(prompts)} samples end at one")
    if stops < 2:
        failures.append(f"the test's ids {ids} end only {stops} samples")

    for name, config_ids, generation_ids in [
            ("generation_config.json lists them", never, ids),
            ("config.json lists them", ids, None)]:
        set_end_ids(mdir, config_ids, generation_ids)
        rows, _, _ = generate(weft, mdir, path, out, *greedy)
        got = [(r["responses"][0]["token_ids"], r["responses"][0]["finish_reason"]) for r in rows]
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
        theirs = transformers_greedy(mdir, prompts)
        differ = [i for i, (g, t) in enumerate(zip(got, theirs)) if g[0] != t]
        print(f"{name}: {len(bad)} samples end elsewhere than at their first listed id; "
              f"{len(differ)} differ from transformers' generate")
        if bad:
            failures.append(f"{name}: samples {bad} end elsewhere: {[got[i] for i in bad]}, "
                            f"expected {[want[i] for i in bad]}")
        if differ:
            failures.append(f"{name}: samples {differ} differ from transformers': "
                            f"{[(got[i][0], theirs[i]) for i in differ]}")

    rows, _, _ = generate(weft, mdir, path, out, *greedy, f"sampling.stop_token_ids=[{never}]")
    lengths = [len(r["responses"][0]["token_ids"]) for r in rows]
    print(f"sampling.stop_token_ids=[{never}] given: lengths {lengths}")
    if lengths != [NEW_TOKENS] * len(prompts):
        failures.append(f"sampling.stop_token_ids did not decide alone: lengths {lengths}")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_end_ids_", "checks failed"))
