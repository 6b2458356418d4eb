"""The log-prob `weft generate` records for each sampled token is the one the trainer computes.

A random Qwen2 (GQA, biases, head_dim 64: BLAS would take other kernels for one decoded row than
for a training tile), 8 prompts of 1 to 300 tokens (across KV-cache blocks of 16), 3 samples each
at temperature 1 with top-p 0.9, up to 20 new tokens: every recorded log-prob equals
`weft grad --logprobs` on prompt + completion (the completion the targets) bit for bit on the CPU,
with KV-cache blocks of 16 (the default), 32 and 12 positions (the CPU reads a block's transposed
keys in place when its size is a multiple of 16, else repacks them first).
With device=cuda (the GPU where one is listed, else weft_emulated: the CUDA kernels run on the
CPU) generation and scoring both run in bf16 and differ only by its round-off: the max and mean
absolute difference are printed and must stay under MAX_DIFF and MEAN_DIFF.
On CUDA the engine draws the tokens on the device, with top-p and again without it (the
sample_tokens op, which the CUDA profile must list; under speculation, which draws the drafts
with it, the verify_drafts op too, and only then; new prompts' attention must run as
attention_forward, the cached rows' as paged_attention) and reads back tokens and log-probs
instead of the logits rows;
it draws at the host's uniform numbers, so most first tokens equal the CPU's at the same seed
(bf16 round-off moves a few across a boundary; numbers drawn wrongly, or a wrong nucleus, would
leave about 1 in 20 alike).
The same with MTP speculative decoding (rollout.speculative_tokens=2) on the model with two MTP
modules and the prompts but the longest: every token, whether an accepted draft, one drawn after a
rejection or a bonus token, has the trainer's log-prob (the statistics show drafts both accepted
and rejected).
"""
import json
import os
import sys

import numpy as np

from reference import files, fixtures, qwen2, runner
from reference.generation import (completions_batch, generate, random_prompts, trainer_logprobs,
                                  write_prompts)

LENGTHS = [1, 5, 16, 17, 33, 70, 9, 300]
CFG = dict(qwen2.SMALL_CFG, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
SETTINGS = ["sampling.temperature=1", "sampling.top_p=0.9", "sampling.n=3",
            "sampling.max_tokens=20", "sampling.seed=11"]
UNFILTERED = [s for s in SETTINGS if not s.startswith("sampling.top_p")]  # drawn on the device
MAX_DIFF, MEAN_DIFF = 0.1, 0.02  # bf16 logits: 2^-9 relative on logits of a few units
SPECULATIVE = 2  # draft tokens per step on the MTP model
SPECULATIVE_LENGTHS = LENGTHS[:-1]  # the 300-token prompt's emulated MTP backward takes long


def check_kernels(tag, profile, speculative, failures):
    """The CUDA profile's ops (its JSON file): new prompts take the training attention
    (attention_forward), the cached rows the paged kernel; tokens (and drafts) are drawn on the
    device, and drafts verified there exactly when there are drafts."""
    with open(profile) as f:
        ops = {o["op"].split()[0] for o in json.load(f)["ops"]}
    want = {"attention_forward": True, "paged_attention": True, "sample_tokens": True,
            "verify_drafts": speculative}
    for op, expected in want.items():
        if (op in ops) != expected:
            failures.append(f"{tag}: the CUDA profile {'lacks' if expected else 'has'} {op}")


def compare(weft, mdir, tmp, device, failures, speculative=0, settings=SETTINGS,
            first_tokens=None, block_size=16):
    tag = f"device={device}" + (f", speculative_tokens={speculative}" if speculative else "")
    tag += ", no top-p" if settings is UNFILTERED else ""
    tag += f", block_size={block_size}" if block_size != 16 else ""
    name = f"{device}_{speculative}_{len(settings)}_{block_size}"
    lengths = SPECULATIVE_LENGTHS if speculative else LENGTHS
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts(lengths, CFG["vocab_size"], 3))
    dev = [f"device={device}"]
    profile = os.path.join(tmp, f"profile_{name}.json")
    env = {"WEFT_CUDA_PROFILE": profile} if device == "cuda" else {}
    rows, stats, _ = generate(weft, mdir, prompts, os.path.join(tmp, f"out_{name}.jsonl"),
                              *settings, *dev, f"rollout.speculative_tokens={speculative}",
                              f"rollout.block_size={block_size}", env=env)
    if env:
        check_kernels(tag, profile, bool(speculative), failures)
    if speculative:
        spec = stats["speculative"]
        print(f"{tag}: drafts offered {spec['drafted']}, accepted {spec['accepted']}")
        if not 0 < spec["accepted"][0] < spec["drafted"][0]:
            failures.append(f"{tag}: drafts were not both accepted and rejected: {spec}")
    docs = completions_batch(rows, os.path.join(tmp, f"batch_{name}.jsonl"))
    out, _ = runner.run_weft(weft, fixtures.grad_args(mdir, os.path.join(tmp, f"batch_{name}.jsonl"),
                                                     "--logprobs", *dev))
    want = trainer_logprobs(docs, out["logprobs"])
    got = [np.asarray(resp["logprobs"], dtype=np.float32) for _, resp in docs]
    tokens = sum(len(g) for g in got)
    diff = np.concatenate([np.abs(g.astype(np.float64) - w) for g, w in zip(got, want)])
    bits = sum(int(np.sum(g.view(np.uint32) != w.view(np.uint32))) for g, w in zip(got, want))
    print(f"{tag}: {len(docs)} samples, {tokens} tokens; log-probs differing in any bit: {bits}; "
          f"max |diff| {diff.max():.3g}, mean {diff.mean():.3g}")
    if first_tokens is not None:
        first_tokens.append([resp["token_ids"][0] for _, resp in docs])
    if tokens < len(docs):
        failures.append(f"{tag}: some samples generated nothing")
    if device == "cpu" and bits:
        failures.append(f"{tag}: {bits} of {tokens} log-probs differ from the trainer's")
    if device == "cuda" and (diff.max() > MAX_DIFF or diff.mean() > MEAN_DIFF):
        failures.append(f"{tag}: log-probs differ from the trainer's by max {diff.max():.3g}, "
                        f"mean {diff.mean():.3g}")


def cases(weft, tmp):
    failures = []
    # OpenMP threads that sleep while they wait: speculation runs many small forwards, and two
    # threads spinning at each barrier of a tiny model on a busy 2-core machine (ctest -j 2) made
    # this test up to 10 times slower. Results do not depend on it.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, CFG, 5, std=0.1)
    mtp = os.path.join(tmp, "mtp_model")
    files.make_model(mtp, dict(CFG, num_nextn_predict_layers=SPECULATIVE), 6, std=0.1)
    first = {"top-p": [], "no top-p": []}  # each sample's first token, on the CPU, on CUDA
    compare(weft, mdir, tmp, "cpu", failures, first_tokens=first["top-p"])
    for block_size in (32, 12):
        compare(weft, mdir, tmp, "cpu", failures, block_size=block_size)
    compare(weft, mtp, tmp, "cpu", failures, SPECULATIVE)
    program, emulated = fixtures.cuda_weft(weft, 1)
    if program:
        print(f"device=cuda on {'weft_emulated' if emulated else 'the GPU'}")
        compare(program, mdir, tmp, "cuda", failures, first_tokens=first["top-p"])
        compare(weft, mdir, tmp, "cpu", failures, settings=UNFILTERED,
                first_tokens=first["no top-p"])
        compare(program, mdir, tmp, "cuda", failures, settings=UNFILTERED,
                first_tokens=first["no top-p"])
        for name, tokens in first.items():
            alike = np.mean(np.equal(*tokens))
            print(f"{name}: first tokens alike on the CPU and drawn on the device: {alike:.0%}")
            if alike < 0.75:
                failures.append(f"device draws, {name}: only {alike:.0%} of first tokens equal "
                                "the CPU's")
        compare(program, mtp, tmp, "cuda", failures, SPECULATIVE)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_generate_logprobs_", "checks failed"))
