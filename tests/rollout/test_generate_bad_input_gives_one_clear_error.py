"""Bad input to `weft generate`: each case ends with one "weft: error:" line naming the input and
what to do, a non-zero exit, and no output file: a prompt longer than the model's context
(max_position_embeddings) or than the KV cache holds, an empty prompt (token ids or text), an
unknown sampling key, top_p outside (0, 1], n < 1, text prompts for a model directory without
tokenizer.json, a model directory without weights, rollout.speculative_tokens negative, above the
model's MTP depth or above 0 for a model without MTP modules, rollout.max_batch_tokens too
small for a token and its drafts (verified in one forward), a generation_config.json that is not
JSON or whose eos_token_id lies outside the vocabulary, chat messages in place of a prompt
(the error says how to render them), and an --out or --stats path that
cannot be written, refused before the model is even read (a model without weights, whose own
error would come first otherwise). The good inputs work: text prompts, and a prompts file with a
UTF-8 byte-order mark and CRLF line ends written into a directory that does not exist yet."""
import json
import os
import shutil
import subprocess
import sys

from reference import files, fixtures, qwen2
from reference.generation import random_prompts, write_prompts, write_tokenizer


def expect_error(weft, name, mdir, prompts, out, settings, must_contain, failures):
    cmd = [weft, "generate", "--model", mdir, "--prompts", prompts, "--out", out, *settings]
    problem = fixtures.one_clear_error(name, cmd, must_contain, lambda: os.path.exists(out))
    if problem:
        failures.append(problem)


def cases(weft, tmp):
    failures = []
    cfg = dict(qwen2.SMALL_CFG, vocab_size=320, max_position_embeddings=64)
    text_model, bare, no_weights, mtp = (os.path.join(tmp, d)
                                         for d in ("text", "bare", "empty", "mtp"))
    files.make_model(text_model, cfg, 1, std=0.1)
    tok = write_tokenizer(text_model)
    files.make_model(bare, cfg, 1, std=0.1)
    files.make_model(no_weights, cfg, 1, std=0.1)
    os.remove(os.path.join(no_weights, "model.safetensors"))
    files.make_model(mtp, dict(cfg, num_nextn_predict_layers=2), 1, std=0.1)
    out = os.path.join(tmp, "out.jsonl")
    ok = write_prompts(os.path.join(tmp, "ok.jsonl"), random_prompts([5, 9], 320, 1))
    long_prompt = write_prompts(os.path.join(tmp, "long.jsonl"), random_prompts([5, 70], 320, 2))
    pool = write_prompts(os.path.join(tmp, "pool.jsonl"), random_prompts([5, 40], 320, 3))
    empty_ids = write_prompts(os.path.join(tmp, "empty_ids.jsonl"), [[3, 4], []])
    empty_text = write_prompts(os.path.join(tmp, "empty_text.jsonl"), ["hello", ""])
    text = write_prompts(os.path.join(tmp, "text.jsonl"), ["the quick brown fox"])
    chat = os.path.join(tmp, "chat.jsonl")
    with open(chat, "w") as f:
        f.write(json.dumps({"prompt": [{"role": "user", "content": "hi"}]}) + "\n")
    bad_generation, far_end = os.path.join(tmp, "bad_generation"), os.path.join(tmp, "far_end")
    for mdir, content in [(bad_generation, "{eos_token_id: 3"), (far_end, '{"eos_token_id": [3, 320]}')]:
        shutil.copytree(bare, mdir)
        with open(os.path.join(mdir, "generation_config.json"), "w") as f:
            f.write(content)
    cases = [
        ("prompt longer than the context", bare, long_prompt, [], [f"{long_prompt}:2", "70 tokens", "max_position_embeddings"]),
        ("prompt longer than the KV cache", bare, pool, ["rollout.kv_cache_tokens=32"], [f"{pool}:2", "rollout.kv_cache_tokens"]),
        ("empty token-id prompt", bare, empty_ids, [], [f"{empty_ids}:2", "empty"]),
        ("empty text prompt", text_model, empty_text, [], [f"{empty_text}:2", "empty"]),
        ("unknown sampling key", bare, ok, ["sampling.temprature=0.5"], ['"sampling.temprature"', '"sampling.temperature"']),
        ("top_p of 0", bare, ok, ["sampling.top_p=0"], ["sampling.top_p", "(0, 1]"]),
        ("top_p over 1", bare, ok, ["sampling.top_p=1.5"], ["sampling.top_p", "(0, 1]"]),
        ("n of 0", bare, ok, ["sampling.n=0"], ["sampling.n"]),
        ("text prompt without tokenizer.json", bare, text, [], [f"{text}:1", "tokenizer.json", "input_ids"]),
        ("model directory without weights", no_weights, ok, [], [no_weights, "model.safetensors"]),
        ("speculative_tokens above the MTP depth", mtp, ok, ["rollout.speculative_tokens=3"],
         ["rollout.speculative_tokens", mtp, "at most 2"]),
        ("speculative_tokens without MTP modules", bare, ok, ["rollout.speculative_tokens=1"],
         ["rollout.speculative_tokens", bare, "no MTP modules"]),
        ("negative speculative_tokens", mtp, ok, ["rollout.speculative_tokens=-1"],
         ["rollout.speculative_tokens", "-1"]),
        ("max_batch_tokens below a token and its drafts", mtp, ok,
         ["rollout.speculative_tokens=2", "rollout.max_batch_tokens=2"], ["rollout.max_batch_tokens"]),
        ("chat messages as the prompt", text_model, chat, [], [f"{chat}:1", "apply_chat_template"]),
        ("generation_config.json not JSON", bad_generation, ok, [],
         [os.path.join(bad_generation, "generation_config.json"), "not a JSON object"]),
        ("end-of-text id outside the vocabulary", far_end, ok, [],
         [os.path.join(far_end, "generation_config.json"), "eos_token_id", "320", "[0, 320)"]),
    ]
    for name, mdir, prompts, settings, want in cases:
        expect_error(weft, name, mdir, prompts, out, settings, want, failures)
    under_a_file = os.path.join(ok, "out.jsonl")  # ok is a file: no directory can be made there
    for name, extra, want in [
            ("output under a file", ["--out", under_a_file], [under_a_file, "the output", "Not a directory"]),
            ("statistics into a directory", ["--out", out, "--stats", tmp], [tmp, "the statistics", "a directory"])]:
        cmd = [weft, "generate", "--model", no_weights, "--prompts", ok, *extra]
        problem = fixtures.one_clear_error(name, cmd, want, lambda: os.path.exists(out))
        if problem:
            failures.append(problem)
    bom = os.path.join(tmp, "bom.jsonl")
    with open(ok) as f:
        rows = f.read().splitlines()
    with open(bom, "wb") as f:
        f.write(b"\xef\xbb\xbf" + "\r\n".join(rows).encode() + b"\r\n")
    fresh = os.path.join(tmp, "new", "dir", "out.jsonl")
    r = subprocess.run([weft, "generate", "--model", bare, "--prompts", bom, "--out", fresh,
                        "sampling.max_tokens=4"], capture_output=True, text=True, timeout=120)
    got = [json.loads(l)["id"] for l in open(fresh)] if r.returncode == 0 else []
    print(f"byte-order mark, CRLF, a new directory: exit {r.returncode}, rows {got}")
    if got != [0, 1]:
        failures.append(f"a prompts file with a byte-order mark and CRLF into a new directory: "
                        f"exit {r.returncode}, rows {got}; stderr {r.stderr}")
    # And the good inputs work, text prompts included.
    # The completion's text is what `tokenizers` decodes from its ids (invalid UTF-8 replaced).
    r = subprocess.run([weft, "generate", "--model", text_model, "--prompts", text, "--out", out,
                        "sampling.max_tokens=8", "sampling.n=4"], capture_output=True, text=True,
                       timeout=120)
    row = json.loads(open(out).readline()) if r.returncode == 0 else {}
    responses = row.get("responses", [])
    texts = [(x.get("text"), tok.decode(x["token_ids"], skip_special_tokens=False)) for x in responses]
    print(f"text prompt with tokenizer.json: exit {r.returncode}, texts {[t for t, _ in texts]!r}")
    if r.returncode != 0 or len(texts) != 4 or any(got != want for got, want in texts):
        failures.append(f"a text prompt with the model's tokenizer: texts (weft, tokenizers) {texts}; "
                        f"stderr {r.stderr}")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_generate_bad_input_", "checks failed"))
