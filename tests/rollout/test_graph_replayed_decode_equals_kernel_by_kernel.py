"""Decode steps replayed from recorded CUDA graphs give the output of launching every kernel.

With device=cuda the rollout engine records a decode step's forward and draws as a CUDA graph
(rollout.cuda_graphs, on by default) and replays it for every later step of the same shape: one
launch instead of hundreds. A replay must be the same computation: for each case below the output
file with graphs equals the one with rollout.cuda_graphs=false byte for byte (tokens, log-probs,
texts), and the statistics show graphs recorded and replayed (a test that never replays proves
nothing). The cases: a steady batch (every sample runs to max_tokens, sampled at temperature 1),
greedy decoding, a shrinking batch (stop tokens end samples one by one; decode batches are padded
to 1, 2, 4, 8 or a multiple of 8 rows, so they replay across sizes: padding rows store no keys and
their tokens are dropped) and a ragged one (rollout.max_running below the samples, a pool small
enough to preempt) whose batches change shape from step to step; then two whose tokens are drawn
on the host from the downloaded logits: top-p, and MTP speculative decoding (the forward that
verifies each sequence's last token and two drafts is replayed; the drafting passes are not). Runs on the GPU where nvidia-smi lists
one, else on weft_emulated (the CUDA backend on the CPU, with its own stream capture: work recorded
with the arguments it was launched with, run when the graph is launched).
"""
import filecmp
import os
import sys

from reference import files, fixtures, qwen2
from reference.generation import generate_each_way, random_prompts, write_prompts

CFG = dict(qwen2.SMALL_CFG, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
LENGTHS = [3, 17, 40, 9, 25, 60]  # crossing KV blocks of 16, and block-table widths 4 to 8
COMMON = ["device=cuda", "sampling.n=2", "sampling.max_tokens=24", "sampling.seed=3"]
NO_STOP = "sampling.stop_token_ids=[]"
CASES = {
    "steady": ["sampling.temperature=1", NO_STOP],
    "greedy": ["sampling.temperature=0", NO_STOP],
    # Six of the 97 tokens stop a sample: the batch shrinks as samples finish, one by one.
    "shrinking": ["sampling.temperature=1", "sampling.stop_token_ids=[1,2,3,4,5,6]"],
    "ragged": ["sampling.temperature=1", "rollout.max_running=5", "rollout.kv_cache_tokens=160",
               NO_STOP],
    # Drawn on the host from the downloaded logits: top-p, and speculation's verification (the
    # model with two MTP modules; the drafts are not graphed, the verifying forward is).
    "top_p": ["sampling.temperature=1", "sampling.top_p=0.9", NO_STOP],
    "speculative": ["sampling.temperature=1", "rollout.speculative_tokens=2", NO_STOP],
}
MTP_CASES = {"speculative"}


def check_case(program, mdir, prompts, tmp, name, settings, failures):
    outs, stats = generate_each_way(program, mdir, prompts, tmp, name, "rollout.cuda_graphs",
                                    *COMMON, *settings)
    g, off = stats["true"]["graphs"], stats["false"]["graphs"]
    st = stats["true"]
    print(f"{name}: {st['forwards']} steps, {st['tokens']:.0f} tokens, graphs recorded "
          f"{g['recorded']}, steps replayed {g['replayed_steps']}; {st['preemptions']:.0f} "
          "preemptions")
    if not filecmp.cmp(outs["true"], outs["false"], shallow=False):
        failures.append(f"{name}: the output with graphs differs from launching every kernel")
    if g["replayed_steps"] <= g["recorded"] or g["recorded"] < 1:
        failures.append(f"{name}: no graph was replayed after its recording: {g}")
    if off["recorded"] or off["replayed_steps"]:
        failures.append(f"{name}: rollout.cuda_graphs=false still used graphs: {off}")
    if name == "ragged" and st["preemptions"] < 1:
        failures.append(f"{name}: the pool preempted nothing")
    if name == "shrinking" and st["tokens"] >= 12 * 24:
        failures.append(f"{name}: no sample stopped early")


def cases(_weft, program, _emulated, tmp):
    failures = []
    mdir, mtp = os.path.join(tmp, "model"), os.path.join(tmp, "mtp_model")
    files.make_model(mdir, CFG, 5, std=0.1)
    files.make_model(mtp, dict(CFG, num_nextn_predict_layers=2), 6, std=0.1)
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts(LENGTHS, CFG["vocab_size"], 3))
    for name, settings in CASES.items():
        check_case(program, mtp if name in MTP_CASES else mdir, prompts, tmp, name, settings,
                   failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_cuda_test(cases, "weft_test_graphs_"))
