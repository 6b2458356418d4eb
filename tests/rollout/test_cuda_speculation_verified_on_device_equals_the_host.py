"""Speculative decoding on the CUDA backend drafts and verifies on the device, and its outputs are
the host's verification's byte for byte, with a fraction of the bytes read back.

On a GPU the MTP drafts are drawn by the sample_tokens op and checked by verify_drafts against the
main forward's logits rows and the rows each draft was drawn from, which stay on the device (a
preempted sample's too, until it runs again); the host reads back tokens and log-probs only.
The host's rule (rollout/speculate.c: the logits rows downloaded, the processed distributions in
double, the residual walked token by token) is what the CPU's speculative tests check against
independent references (the chi-square test of the policy's distribution among them); here
WEFT_TEST_SKIP_DEVICE_VERIFICATION=0:0 makes the CUDA backend take it, and both runs must write
the same tokens, base log-probs and finish reasons, byte for byte; the processed log-probs agree
within PROCESSED_TOL (the device sums the kept weights in another order than the host: a last
bit of the float may differ).

A random Qwen2 with two MTP modules and a 32-token vocabulary (weights small enough that drafts
often pass), 6 prompts of 1 to 30 tokens, 2 samples each, 16 new tokens: temperature 1;
temperature 0.8 with top-k, top-p and min-p (the drafts' and the target's filters); greedy; and
temperature 1 with a pool of 96 positions in blocks of 8 (samples preempted with their drafts
waiting). Drafts must be both accepted and rejected, the small pool must preempt, and the host
waits per step must show which rule ran (the device's once a step, the host's once more per
draft depth), so that two runs of the same rule cannot pass for the comparison.
(test_cuda_decode_waits_for_the_gpu_once_per_step checks what the device's verification reads
back.) Runs on the GPU where nvidia-smi lists one, else on weft_emulated.
"""
import os
import sys

from reference import files, fixtures, qwen2
from reference.generation import generate, random_prompts, write_prompts

CFG = dict(qwen2.SMALL_CFG, vocab_size=32, hidden_size=64, num_attention_heads=2,
           num_key_value_heads=1, num_nextn_predict_layers=2)
LENGTHS = [3, 17, 9, 6, 30, 1]
COMMON = ["device=cuda", "sampling.seed=3", "sampling.n=2", "sampling.max_tokens=16",
          "sampling.stop_token_ids=[]", "rollout.speculative_tokens=2",
          "sampling.processed_logprobs=true"]
CASES = {
    "temperature 1": ["sampling.temperature=1"],
    "filters": ["sampling.temperature=0.8", "sampling.top_k=40", "sampling.top_p=0.9",
                "sampling.min_p=0.01"],
    "greedy": ["sampling.temperature=0"],
    "preemptions": ["sampling.temperature=1", "rollout.kv_cache_tokens=96",
                    "rollout.block_size=8"],
}
HOST = {"WEFT_TEST_SKIP_DEVICE_VERIFICATION": "0:0"}
PROCESSED_TOL = 1e-6


def differences(dev_rows, host_rows):
    """(responses whose tokens, base log-probs, text or finish reason differ; the largest
    difference of a processed log-prob)."""
    differ, worst = 0, 0.0
    for a, b in zip(dev_rows, host_rows, strict=True):
        for ra, rb in zip(a["responses"], b["responses"], strict=True):
            pa, pb = ra.pop("processed_logprobs"), rb.pop("processed_logprobs")
            differ += ra != rb
            if len(pa) == len(pb):
                worst = max([worst] + [abs(x - y) for x, y in zip(pa, pb)])
    return differ, worst


def check_case(program, mdir, prompts, tmp, name, failures):
    runs = {}
    for where, env in (("device", None), ("host", HOST)):
        out = os.path.join(tmp, f"{name.replace(' ', '_')}_{where}.jsonl")
        runs[where] = generate(program, mdir, prompts, out, *COMMON, *CASES[name], env=env)[:2]
    (dev_rows, dev), (host_rows, host) = runs["device"], runs["host"]
    counts = lambda st: {key: st["speculative"][key] for key in ("verify_steps", "drafted",
                                                                 "accepted")}
    spec, preempted = counts(dev), dev["preemptions"]
    differ, worst = differences(dev_rows, host_rows)
    waits = {where: st["host_waits"] / st["forwards"] for where, st in (("device", dev),
                                                                          ("host", host))}
    print(f"{name}: drafts offered {spec['drafted']}, accepted {spec['accepted']}; "
          f"{preempted:.0f} preemptions; {differ} responses differ; processed log-probs "
          f"max |diff| {worst:.3g}; host waits a step {waits['device']:.2f} on the device's "
          f"verification, {waits['host']:.2f} on the host's")
    # Which rule ran: the device's waits once a step, the host's once more per draft depth.
    if waits["device"] > 1.1 or waits["host"] < 1.5:
        failures.append(f"{name}: host waits a step {waits['device']:.2f} and {waits['host']:.2f}: "
                        f"the device's verification did not run, or the switch did not stop it")
    if differ or worst > PROCESSED_TOL:
        failures.append(f"{name}: the device's and the host's verification differ: {differ} "
                        f"responses, processed log-probs by up to {worst:.3g}")
    if spec != counts(host):
        failures.append(f"{name}: the draft statistics differ: {spec} vs {counts(host)}")
    if not 0 < spec["accepted"][0] < spec["drafted"][0]:
        failures.append(f"{name}: drafts were not both accepted and rejected: {spec}")
    if name == "preemptions" and preempted == 0:
        failures.append(f"{name}: the pool of 96 positions preempted nothing")


def cases(_weft, program, _emulated, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, CFG, 7, std=0.1)
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts(LENGTHS, CFG["vocab_size"], 4))
    for name in CASES:
        check_case(program, mdir, prompts, tmp, name, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_cuda_test(cases, "weft_test_device_verification_"))
