"""A decode step on the CUDA backend makes the host wait for the GPU a fixed number of times,
never once per layer: the few waits a step needs are what sets its pace at small batches once
its kernels replay from a graph (issue 18's "no per-step host overhead").

`weft generate --stats` reports `host_waits` (the backend's count: downloads, synchronizations,
frees) and `forwards`. Each case runs twice, to 4 and to 12 new tokens with no stop token (so
every sample runs to the limit); the extra waits over the extra forwards are the waits per step:
- tokens drawn on the device (greedy, a temperature alone, or with top-k, top-p and min-p; with
  graphs, without them, without async scheduling, and with n = 3 samples of each prompt):
  exactly 1, the step's tokens read back;
- MTP speculation with 2 drafts, drawn and verified on the device: exactly 1 as well, the
  verification's emitted tokens (the drafts, the logits rows they were drawn from and the
  hidden-state rows a module starts from stay on the device; the next module and the verifying
  forward read the drafts there).
`host_bytes_read` must say the same of what the waits read: with a vocabulary of 4096, a decode
step reads back less than one row of logits (8 KiB), tokens and log-probs only, speculating or
not. Every case also runs on a model of 1 and of 3 layers: the counts must be the same, so no
wait hides in a layer (under speculation, whose accepted drafts and so steps differ between the
two models, each must wait once a step). Runs on the GPU where nvidia-smi lists one, else on
weft_emulated.
"""
import os
import sys

from reference import files, fixtures, qwen2
from reference.generation import generate, random_prompts, write_prompts

CFG = dict(qwen2.SMALL_CFG, vocab_size=4096, hidden_size=128, num_attention_heads=2,
           num_key_value_heads=1)
ROW_BYTES = 2 * CFG["vocab_size"]  # one bf16 row of logits
LENGTHS = [3, 17, 9, 6]
COMMON = ["device=cuda", "sampling.seed=5", "sampling.stop_token_ids=[]"]
SHORT, LONG = 4, 12
# name: (settings, whether the model has MTP modules)
CASES = {
    "greedy": (["sampling.temperature=0"], False),
    "temperature, n=3": (["sampling.temperature=1", "sampling.n=3"], False),
    "no graphs": (["sampling.temperature=1", "rollout.cuda_graphs=false"], False),
    "no async scheduling": (["sampling.temperature=1", "rollout.async_scheduling=false"], False),
    "top-k, top-p and min-p": (["sampling.temperature=1", "sampling.top_k=20",
                                "sampling.top_p=0.9", "sampling.min_p=0.01"], False),
    "speculative, 2 drafts": (["sampling.temperature=1", "rollout.speculative_tokens=2"], True),
}


def waits(program, mdir, prompts, tmp, settings):
    """(host waits, forwards, bytes read back) at SHORT and at LONG new tokens."""
    got = []
    for n in (SHORT, LONG):
        out = os.path.join(tmp, f"out_{n}.jsonl")
        _, st, _ = generate(program, mdir, prompts, out, *COMMON, *settings,
                            f"sampling.max_tokens={n}")
        got.append((st["host_waits"], st["forwards"], st["host_bytes_read"]))
    return got


def check_case(program, models, prompts, tmp, name, failures):
    settings, mtp = CASES[name]
    counts = {layers: waits(program, models[layers, mtp], prompts, tmp, settings)
              for layers in (1, 3)}
    for layers, ((w0, f0, b0), (w1, f1, b1)) in counts.items():
        per_step = (w1 - w0) / (f1 - f0) if f1 > f0 else float("inf")
        bytes_per_step = (b1 - b0) / (f1 - f0) if f1 > f0 else float("inf")
        model = f"{name}, {layers} layer{'s' if layers > 1 else ''}"
        print(f"{model}: {w0} waits over {f0} forwards at {SHORT} tokens, {w1} over {f1} at "
              f"{LONG}: {per_step:.2f} a step, {bytes_per_step:.0f} bytes read "
              f"back a step (a row of logits: {ROW_BYTES})")
        if per_step != 1:
            failures.append(f"{model}: {per_step:.2f} host waits a decode step, not 1")
        if bytes_per_step >= ROW_BYTES:
            failures.append(f"{model}: a decode step reads back {bytes_per_step:.0f} bytes, "
                            f"a row of logits or more")
    if not mtp and [c[:2] for c in counts[3]] != [c[:2] for c in counts[1]]:
        failures.append(f"{name}: the waits depend on the model's depth: 1 layer {counts[1]}, "
                        f"3 layers {counts[3]}")


def cases(_weft, program, _emulated, tmp):
    failures = []
    models = {}
    for layers in (1, 3):
        for mtp in (False, True):
            mdir = os.path.join(tmp, f"model_{layers}{'_mtp' if mtp else ''}")
            cfg = dict(CFG, num_hidden_layers=layers, **({"num_nextn_predict_layers": 2} if mtp
                                                         else {}))
            files.make_model(mdir, cfg, 7, std=0.1)
            models[layers, mtp] = mdir
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts(LENGTHS, CFG["vocab_size"], 4))
    for name in CASES:
        check_case(program, models, prompts, tmp, name, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_cuda_test(cases, "weft_test_decode_waits_"))
