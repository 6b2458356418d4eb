"""Decode steps queued ahead of the host give the output of waiting for every step's tokens.

With rollout.async_scheduling (on by default, device=cuda) the engine launches decode step N+1
before it has read step N's tokens: N+1's rows take their token ids on the device from N's
draws, and the host appends N's tokens, checks stops and frees the blocks of finished samples
while N+1 runs. A sample that stopped at N has a row in N+1 computed in vain, and a prompt
waiting for its blocks is admitted a step later. For each case below the output file equals the
one with rollout.async_scheduling=false byte for byte (tokens, log-probs, texts), and the
statistics show steps queued ahead (a test whose steps never overlap proves nothing) and, where
samples stop at different steps, rows computed in vain. The cases keep every decode step within
8 rows and each sequence within 128 keys, where the CUDA kernels give a row the same bits whatever
else the batch holds (few_rows.cu; one split of the keys in paged.cu), so a wasted row or a
later admission cannot change the others' bits: every sample to max_tokens (at temperature 1,
and greedy), stop tokens ending samples one by one, a stop string (with a tokenizer), and
rollout.max_running below the samples (prompts admitted as samples stop). Last, a pool small
enough to preempt: queueing ahead then preempts at other steps (its steps wait instead where the
pool cannot hold every next row), and a recomputed prompt's rows (more than 8) run on other
kernels than the decode rows they replace, so the bits may differ from waiting's; there every
recorded log-prob must be the trainer's (`weft grad --logprobs` on prompt + completion) within
bf16 round-off, as in test_generated_logprobs_equal_trainer_logprobs, which a token placed at
the wrong position or taken from the wrong draw would break; and with rollout.batch_invariant,
where every row's bits are its own, the same preempting case byte for byte. Runs on the GPU where nvidia-smi
lists one, else on weft_emulated.
"""
import filecmp
import json
import os
import sys

import numpy as np

from reference import files, fixtures, qwen2, runner
from reference.generation import (completions_batch, generate_each_way, random_prompts,
                                  trainer_logprobs, write_prompts, write_tokenizer)

CFG = dict(qwen2.SMALL_CFG, vocab_size=320, hidden_size=128, num_attention_heads=2,
           num_key_value_heads=1)  # the vocabulary of write_tokenizer's tokenizer
LENGTHS = [3, 17, 40, 9]  # 4 prompts x 2 samples: 8 rows at most, 64 keys at most
SHORT = [2, 3, 1, 3, 2]   # for max_running: a prefill and the running samples within 8 rows
COMMON = ["device=cuda", "sampling.n=2", "sampling.max_tokens=24", "sampling.seed=3"]
NO_STOP = "sampling.stop_token_ids=[]"
STOPS = "[" + ",".join(str(t) for t in range(1, 9)) + "]"  # WEFT_MAX_STOP of them
CASES = {
    "steady": (LENGTHS, ["sampling.temperature=1", NO_STOP]),
    "greedy": (LENGTHS, ["sampling.temperature=0", NO_STOP]),
    # 8 of the 320 tokens stop a sample: samples finish one by one, each leaving a wasted row.
    "stop_tokens": (LENGTHS, ["sampling.temperature=1", f"sampling.stop_token_ids={STOPS}"]),
    "stop_string": (LENGTHS, ["sampling.temperature=1", "sampling.stop=[\"e\"]", NO_STOP]),
    "max_running": (SHORT, ["sampling.temperature=1", "rollout.max_running=4",
                            f"sampling.stop_token_ids={STOPS}"]),
    "preempting": (SHORT, ["sampling.temperature=1", "rollout.kv_cache_tokens=80",
                           f"sampling.stop_token_ids={STOPS}"]),
    "preempting_invariant": (SHORT, ["sampling.temperature=1", "rollout.kv_cache_tokens=80",
                                     f"sampling.stop_token_ids={STOPS}",
                                     "rollout.batch_invariant=true"]),
}
STOPPING = {"stop_tokens", "stop_string", "max_running"}
BY_TRAINER = {"preempting"}  # compared with the trainer's log-probs, not with waiting's bytes
MAX_DIFF, MEAN_DIFF = 0.1, 0.02  # test_generated_logprobs_equal_trainer_logprobs's bf16 bounds


def check_case(program, mdir, tmp, name, lengths, settings, failures):
    prompts = write_prompts(os.path.join(tmp, f"{name}_prompts.jsonl"),
                            random_prompts(lengths, CFG["vocab_size"], 3))
    outs, stats = generate_each_way(program, mdir, prompts, tmp, name,
                                    "rollout.async_scheduling", *COMMON, *settings)
    on, off = stats["true"], stats["false"]
    print(f"{name}: {on['forwards']} steps ({off['forwards']} waiting for each), "
          f"{on['tokens']:.0f} tokens, queued ahead {on['async']['steps']}, rows in vain "
          f"{on['async']['wasted_rows']}, graphs replayed {on['graphs']['replayed_steps']}, "
          f"preemptions {on['preemptions']:.0f} ({off['preemptions']:.0f} waiting)")
    if name in BY_TRAINER:
        compare_with_trainer(program, mdir, tmp, name, outs["true"], failures)
    elif not filecmp.cmp(outs["true"], outs["false"], shallow=False):
        failures.append(f"{name}: the output queued ahead differs from waiting for every step")
    if on["async"]["steps"] < on["forwards"] // 2:
        failures.append(f"{name}: only {on['async']['steps']} of {on['forwards']} steps were "
                        "queued ahead")
    if off["async"]["steps"] or off["async"]["wasted_rows"]:
        failures.append(f"{name}: rollout.async_scheduling=false still queued ahead: "
                        f"{off['async']}")
    if name in STOPPING and on["async"]["wasted_rows"] < 1:
        failures.append(f"{name}: no sample stopped before the others (no row in vain)")
    if name.startswith("preempting") and on["preemptions"] < 1:
        failures.append(f"{name}: the pool preempted nothing")
    if name not in BY_TRAINER and on["tokens"] != off["tokens"]:
        failures.append(f"{name}: {on['tokens']} tokens queued ahead, {off['tokens']} waiting")


def compare_with_trainer(program, mdir, tmp, name, out, failures):
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    batch = os.path.join(tmp, f"{name}_batch.jsonl")
    docs = completions_batch(rows, batch)
    scored, _ = runner.run_weft(program, fixtures.grad_args(mdir, batch, "--logprobs",
                                                            "device=cuda"))
    want = trainer_logprobs(docs, scored["logprobs"])
    got = [np.asarray(resp["logprobs"], dtype=np.float64) for _, resp in docs]
    diff = np.concatenate([np.abs(g - w) for g, w in zip(got, want)])
    print(f"  {name}: {len(docs)} samples, {diff.size} log-probs against the trainer's: max "
          f"|diff| {diff.max():.3g}, mean {diff.mean():.3g}")
    if diff.max() > MAX_DIFF or diff.mean() > MEAN_DIFF:
        failures.append(f"{name}: log-probs queued ahead differ from the trainer's by max "
                        f"{diff.max():.3g}, mean {diff.mean():.3g}")


def cases(_weft, program, _emulated, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, CFG, 5, std=0.1)
    write_tokenizer(mdir, CFG["vocab_size"])
    for name, (lengths, settings) in CASES.items():
        check_case(program, mdir, tmp, name, lengths, settings, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_cuda_test(cases, "weft_test_async_"))
