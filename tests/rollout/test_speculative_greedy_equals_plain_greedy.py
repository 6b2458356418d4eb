"""Speculative decoding with the model's own MTP modules changes no greedy token, and with
sampling its output is still a function of the seed alone.

The model: a small Qwen2 (vocabulary 32, one decoder layer, two MTP modules) trained here for 100
AdamW steps (`weft grad train.steps=100`, a few seconds) on documents of a noisy Markov chain (each
token's successor is a fixed one with probability 0.85 or 0.5, else another), so that its drafts
are often, but not always, the main model's choice. 24 prompts of 1 to 40 tokens drawn from the
same chain, 2 samples each, up to 24 new tokens, stop token: one that ends some of the greedy
completions early (chosen from a first greedy run), so that drafts run past a stop and past the
token limit.

  - Greedy (temperature 0) with rollout.speculative_tokens=1 and 2 gives byte-identical output
    files to greedy without speculation (tokens, log-probs, finish reasons), with all prompts in
    one continuous batch, prefills cut into chunks of 7 rows (rollout.max_batch_tokens=7), a KV
    pool of 80 positions (5 blocks; the longest sample needs 4) that forces preemptions, and on 2
    ranks under mpirun.
  - The statistics of greedy with one draft per step show the drafts doing work and both outcomes
    of the verification: acceptance at depth 1 at least 0.5, and some drafts rejected.
  - Temperature 1 with speculation (k = 1 and 2): the same seed gives byte-identical output under
    all of those batchings, and one sequence at a time (rollout.max_running=1).
  - The same on device=cuda with rollout.batch_invariant=true (k = 2; on the GPU where nvidia-smi
    lists two, else on weft_emulated): the MTP modules' drafting passes and the verifying
    forwards take the batch-invariant kernels too.
"""
import filecmp
import json
import os
import sys

import numpy as np

from reference import files, fixtures, qwen2, runner
from reference.generation import generate, write_prompts

V, DOC_LEN, N_DOCS, STEPS = 32, 32, 32, 100
CFG = dict(qwen2.SMALL_CFG, vocab_size=V, hidden_size=32, intermediate_size=64,
           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
           num_nextn_predict_layers=2)
PROMPT_LENGTHS = [12, 1, 40, 7, 30, 3, 19, 2, 36, 8, 25, 5, 16, 1, 33, 10, 4, 28, 14, 6, 22, 9,
                  38, 11]
COMMON = ["sampling.n=2", "sampling.max_tokens=24"]
# The longest sample is 40 + 24 = 64 positions: 4 blocks of 16; a 5-block pool holds it alone.
VARIANTS = [("prefill chunks of 7 rows", ["rollout.max_batch_tokens=7"], 1),
            ("a pool of 80 positions (preemptions)", ["rollout.kv_cache_tokens=80"], 1),
            ("2 ranks", [], 2)]
SAMPLED_ONLY = [("one sequence at a time", ["rollout.max_running=1"], 1)]
MIN_ACCEPTANCE = 0.5


def chain(rng, n):
    """n tokens of the Markov chain the model is trained on: token x is followed by FIRST[x] with
    probability 0.85 (x even) or 0.5 (x odd), else by SECOND[x] up to 0.93, else by any token."""
    order = np.random.default_rng(0)
    first, second = order.permutation(V), order.permutation(V)
    x = [int(rng.integers(V))]
    while len(x) < n:
        u, c = rng.random(), x[-1]
        x.append(int(first[c]) if u < (0.85 if c % 2 == 0 else 0.5) else
                 int(second[c]) if u < 0.93 else int(rng.integers(V)))
    return x


def trained_model(weft, tmp):
    """A random MTP model trained on the chain: the model directory."""
    init, mdir = os.path.join(tmp, "init"), os.path.join(tmp, "model")
    files.make_model(init, CFG, 1, std=0.1)
    rng = np.random.default_rng(1)
    batch = os.path.join(tmp, "train.jsonl")
    with open(batch, "w") as f:
        for _ in range(N_DOCS):
            f.write(json.dumps({"input_ids": chain(rng, DOC_LEN)}) + "\n")
    out, stats = runner.run_weft(weft, fixtures.grad_args(
        init, batch, f"train.steps={STEPS}", "optim.lr=0.02", "optim.warmup_steps=10"))
    last = stats["steps"][-1]
    print(f"trained {STEPS} steps on {N_DOCS} chain documents: loss {stats['steps'][0]['loss']:.3f}"
          f" -> {last['loss']:.3f}, top-1 accuracy {last['accuracy']:.3f}, MTP "
          f"{[round(a, 3) for a in last['mtp_accuracy']]}")
    os.makedirs(mdir)
    os.replace(os.path.join(init, "config.json"), os.path.join(mdir, "config.json"))
    files.write_safetensors(os.path.join(mdir, "model.safetensors"),
                            {k[len("param."):]: v for k, v in out.items()
                             if k.startswith("param.")})
    return mdir


def first_difference(want_path, got_path):
    """Where two output files first differ: prompt, sample and token position, with both values."""
    with open(want_path) as f:
        want = [json.loads(line) for line in f]
    with open(got_path) as f:
        got = [json.loads(line) for line in f]
    if len(want) != len(got):
        return f"{len(got)} rows, not {len(want)}"
    for i, (a, b) in enumerate(zip(want, got)):
        for j, (ra, rb) in enumerate(zip(a["responses"], b["responses"])):
            for key in ("token_ids", "logprobs"):
                x, y = ra[key], rb[key]
                k = next((k for k in range(max(len(x), len(y)))
                          if k >= len(x) or k >= len(y) or x[k] != y[k]), None)
                if k is not None:
                    return (f"prompt {i} sample {j}: {key}[{k}] {y[k] if k < len(y) else 'end'}, "
                            f"not {x[k] if k < len(x) else 'end'} ({len(y)} tokens, not {len(x)})")
            if ra != rb:
                return f"prompt {i} sample {j}: {rb} differs from {ra}"
        if len(a["responses"]) != len(b["responses"]):
            return f"prompt {i}: {len(b['responses'])} samples, not {len(a['responses'])}"
    return "bytes only"


def same_as(ref, out, name, st, failures):
    same = filecmp.cmp(ref, out, shallow=False)
    spec = st.get("speculative") or {}
    print(f"  {name}: {'byte-identical' if same else 'DIFFERS'}; {st['peak_batch']} sequences "
          f"at most in a forward, acceptance "
          f"{[round(a, 3) for a in spec.get('acceptance', [])]}, {st['preemptions']:.0f} "
          f"preemptions, KV blocks peak {st['kv']['peak_used']}")
    if not same:
        failures.append(f"{name}: output differs: {first_difference(ref, out)}")
    if "preemptions" in name and st["preemptions"] < 1:
        failures.append(f"{name}: the small pool forced no preemption")


def cases(weft, tmp):
    failures = []
    # OpenMP threads that sleep while they wait: speculation runs many small forwards, and two
    # threads spinning at each barrier of a tiny model on a busy 2-core machine (ctest -j 2) made
    # this test up to 10 times slower. Results do not depend on it.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    mdir = trained_model(weft, tmp)
    rng = np.random.default_rng(2)
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            [chain(rng, n) for n in PROMPT_LENGTHS])
    # A stop token that ends some greedy completions, not all: the most common token that is
    # absent from at least a third of them and never first.
    rows, _, _ = generate(weft, mdir, prompts, os.path.join(tmp, "nostop.jsonl"), *COMMON,
                          "sampling.temperature=0", "sampling.stop_token_ids=[]")
    completions = [r["responses"][0]["token_ids"] for r in rows]
    candidates = [t for t in range(V) if all(c[0] != t for c in completions)
                  and sum(t in c for c in completions) <= 2 * len(completions) // 3]
    stop = max(candidates, key=lambda t: sum(t in c for c in completions)) if candidates else None
    common = [*COMMON, f"sampling.stop_token_ids=[{'' if stop is None else stop}]"]

    greedy = [*common, "sampling.temperature=0"]
    ref = os.path.join(tmp, "greedy.jsonl")
    rows, _, _ = generate(weft, mdir, prompts, ref, *greedy)
    tokens = sum(len(r["token_ids"]) for row in rows for r in row["responses"])
    stops = sum(r["finish_reason"] == "stop" for row in rows for r in row["responses"])
    print(f"greedy without speculation: {tokens} tokens, {stops} of {2 * len(rows)} samples "
          f"stopped at token {stop}")
    for k in (1, 2):
        print(f"greedy, rollout.speculative_tokens={k}, against greedy without:")
        for v, (name, settings, ranks) in enumerate([("all at once", [], 1)] + VARIANTS):
            out = os.path.join(tmp, f"greedy_k{k}_{v}.jsonl")
            _, st, _ = generate(weft, mdir, prompts, out, *greedy,
                                f"rollout.speculative_tokens={k}", *settings, ranks=ranks)
            same_as(ref, out, f"greedy k={k}, {name}", st, failures)
            if name != "all at once":
                continue
            spec = st["speculative"]
            print(f"  statistics: {json.dumps(spec)}")
            if spec["tokens"] != k or len(spec["drafted"]) != k:
                failures.append(f"greedy k={k}: statistics report {spec['tokens']} draft tokens, "
                                f"{len(spec['drafted'])} depths")
            if k == 1:
                if spec["acceptance"][0] < MIN_ACCEPTANCE:
                    failures.append(f"greedy k=1: acceptance {spec['acceptance'][0]:.3f} < "
                                    f"{MIN_ACCEPTANCE}: the drafts do little work")
                if spec["accepted"][0] >= spec["drafted"][0]:
                    failures.append("greedy k=1: no draft was rejected: the rejection path "
                                    "never ran")

    for k in (1, 2):
        sampled = [*common, "sampling.temperature=1", "sampling.seed=7",
                   f"rollout.speculative_tokens={k}"]
        ref_k = os.path.join(tmp, f"sampled_k{k}.jsonl")
        _, st, _ = generate(weft, mdir, prompts, ref_k, *sampled)
        spec = st["speculative"]
        print(f"temperature 1, rollout.speculative_tokens={k}, all at once: acceptance "
              f"{[round(a, 3) for a in spec['acceptance']]}; against it:")
        for v, (name, settings, ranks) in enumerate(VARIANTS + SAMPLED_ONLY):
            out = os.path.join(tmp, f"sampled_k{k}_{v}.jsonl")
            _, st, _ = generate(weft, mdir, prompts, out, *sampled, *settings, ranks=ranks)
            same_as(ref_k, out, f"temperature 1 k={k}, {name}", st, failures)
    check_invariant_cuda(weft, mdir, prompts, tmp, common, failures)
    return failures


def check_invariant_cuda(weft, mdir, prompts, tmp, common, failures):
    program, emulated = fixtures.cuda_weft(weft, 2)
    if program is None:
        print("device=cuda, batch-invariant: no GPU and no weft_emulated: skipped")
        return
    sampled = [*common, "sampling.temperature=1", "sampling.seed=7", "device=cuda",
               "rollout.speculative_tokens=2", "rollout.batch_invariant=true"]
    ref = os.path.join(tmp, "invariant_cuda.jsonl")
    _, st, _ = generate(program, mdir, prompts, ref, *sampled)
    print(f"device=cuda ({'emulated' if emulated else 'GPU'}), batch-invariant, temperature 1 "
          f"k=2, all at once: acceptance "
          f"{[round(a, 3) for a in st['speculative']['acceptance']]}; against it:")
    for v, (name, settings, ranks) in enumerate(VARIANTS + SAMPLED_ONLY):
        out = os.path.join(tmp, f"invariant_cuda_{v}.jsonl")
        _, st, _ = generate(program, mdir, prompts, out, *sampled, *settings, ranks=ranks)
        same_as(ref, out, f"device=cuda batch-invariant k=2, {name}", st, failures)


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_speculative_greedy_", "checks failed"))
