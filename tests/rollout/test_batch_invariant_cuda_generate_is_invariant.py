"""With rollout.batch_invariant=true, device=cuda generation gives byte-identical output files
whatever the engine's batching, as the CPU always does (test_generate_is_invariant): all prompts
at once; one sequence at a time (rollout.max_running=1); prefills cut into chunks of 7 rows; a KV
cache small enough to preempt and recompute sequences (which find their blocks in the prefix
cache and compute the rest against the pool); prefix caching off; and 2 and 4 ranks. In that
mode every product runs skinny.cu's kernel for any row count (here from 1 decode row to prefills
of over 300 rows, several blocks of 64), no norm folds into a few-row product, and every row's
attention reads the pool with its keys split at a fixed 256 (the 300-token prompt's rows span two
splits), so a row's bits depend on the row alone. The statistics must say the mode was on. So
with MTP speculation, whose drafts are drawn, fed and verified on the device (a model with two
MTP modules, 2 drafts a step): one sequence at a time, with preemptions (drafts waiting in their
device rows while the sample recomputes) and on 2 ranks, byte-identical to all at once. For
contrast, the default kernels' output one sequence at a time is compared with all at once and the
result printed (it may differ: that is what the mode is for; not a failure). Last, a model whose
products the mode cannot take (hidden size 80: not a multiple of 32) gets one clear error and no
output file. Runs on the GPU where nvidia-smi lists one (the rank counts past the GPUs it lists
are then left out: a rank needs a GPU of its own), else on weft_emulated.
"""
import filecmp
import os
import sys

from reference import files, fixtures, qwen2
from reference.generation import check_batchings, generate, random_prompts, write_prompts

LENGTHS = [12, 1, 300, 7, 30, 3, 19, 45]
SAMPLING = ["device=cuda", "sampling.temperature=0.8", "sampling.top_k=20", "sampling.n=2",
            "sampling.max_tokens=12", "sampling.seed=3", "sampling.stop_token_ids=[44]"]
INVARIANT = "rollout.batch_invariant=true"
# The longest sample is 300 + 12 = 312 positions: 20 blocks of 16; a 24-block pool holds it
# alone, and nothing else beside it.
VARIANTS = [("one sequence at a time", ["rollout.max_running=1"], 1),
            ("prefill chunks of 7 rows", ["rollout.max_batch_tokens=7"], 1),
            ("a pool of 384 positions (preemptions)", ["rollout.kv_cache_tokens=384"], 1),
            ("prefix caching off", ["rollout.prefix_caching=false"], 1),
            ("2 ranks", [], 2), ("4 ranks", [], 4)]
CFG = dict(qwen2.SMALL_CFG, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
MTP_CFG = dict(qwen2.SMALL_CFG, vocab_size=32, hidden_size=64, num_attention_heads=2,
               num_key_value_heads=1, num_nextn_predict_layers=2)  # drafts often pass
SPECULATION = ["device=cuda", "sampling.temperature=1", "sampling.n=2", "sampling.max_tokens=16",
               "sampling.seed=3", "sampling.stop_token_ids=[]", "rollout.speculative_tokens=2"]
SPECULATION_VARIANTS = [("speculating, one sequence at a time", ["rollout.max_running=1"], 1),
                        ("speculating, a pool of 96 positions (preemptions)",
                         ["rollout.kv_cache_tokens=96"], 1),
                        ("speculating, 2 ranks", [], 2)]


def check_variants(program, emulated, mdir, prompts, tmp, failures):
    ref = os.path.join(tmp, "all.jsonl")
    rows, stats, _ = generate(program, mdir, prompts, ref, *SAMPLING, INVARIANT)
    tokens = sum(len(r["token_ids"]) for row in rows for r in row["responses"])
    print(f"all at once: {tokens} tokens, {stats['forwards']} forwards, batch_invariant "
          f"{stats['batch_invariant']}")
    if stats["batch_invariant"] is not True:
        failures.append(f"the statistics say batch_invariant {stats['batch_invariant']}")
    gpus = fixtures.gpus_listed()
    variants = [v for v in VARIANTS if emulated or v[2] <= gpus]
    for name, _, _ in (v for v in VARIANTS if v not in variants):
        print(f"{name}: left out ({gpus} GPU(s) listed)")
    check_batchings(program, mdir, prompts, ref, variants, tmp, failures, *SAMPLING, INVARIANT)


def check_speculation(program, emulated, tmp, failures):
    mdir = os.path.join(tmp, "model_mtp")
    files.make_model(mdir, MTP_CFG, 7, std=0.1)
    prompts = write_prompts(os.path.join(tmp, "prompts_mtp.jsonl"),
                            random_prompts([3, 17, 9, 6, 30, 1], MTP_CFG["vocab_size"], 4))
    ref = os.path.join(tmp, "speculating_all.jsonl")
    _, stats, _ = generate(program, mdir, prompts, ref, *SPECULATION, INVARIANT)
    spec = stats["speculative"]
    print(f"speculating, all at once: drafts offered {spec['drafted']}, accepted "
          f"{spec['accepted']}")
    if not 0 < spec["accepted"][0] < spec["drafted"][0]:
        failures.append(f"speculating: drafts were not both accepted and rejected: {spec}")
    variants = [v for v in SPECULATION_VARIANTS if emulated or v[2] <= fixtures.gpus_listed()]
    check_batchings(program, mdir, prompts, ref, variants, tmp, failures, *SPECULATION,
                    INVARIANT)


def show_default_kernels(program, mdir, prompts, tmp):
    outs = []
    for name, settings in (("all", []), ("one", ["rollout.max_running=1"])):
        outs.append(os.path.join(tmp, f"default_{name}.jsonl"))
        _, st, _ = generate(program, mdir, prompts, outs[-1], *SAMPLING, *settings)
    same = filecmp.cmp(*outs, shallow=False)
    print(f"without the mode (batch_invariant {st['batch_invariant']}): one sequence at a time "
          f"{'is byte-identical to' if same else 'differs from'} all at once")


def check_refusal(program, tmp, failures):
    mdir = os.path.join(tmp, "model80")
    files.make_model(mdir, dict(CFG, hidden_size=80, num_attention_heads=2), 9, std=0.1)
    prompts = write_prompts(os.path.join(tmp, "p80.jsonl"), [[1, 2, 3]])
    out = os.path.join(tmp, "out80.jsonl")
    _, _, r = generate(program, mdir, prompts, out, *SAMPLING, INVARIANT, check=False)
    said = (r.stdout + r.stderr).strip()
    print(f"hidden size 80: exit {r.returncode}: {said.splitlines()[-1] if said else ''}")
    if r.returncode == 0 or "rollout.batch_invariant" not in said or "32" not in said:
        failures.append(f"hidden size 80 with the mode: exit {r.returncode}, said: {said}")
    if os.path.exists(out):
        failures.append("hidden size 80 with the mode: an output file was written")


def cases(_weft, program, emulated, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, CFG, 8, std=0.1)
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts(LENGTHS, CFG["vocab_size"], 4))
    check_variants(program, emulated, mdir, prompts, tmp, failures)
    check_speculation(program, emulated, tmp, failures)
    show_default_kernels(program, mdir, prompts, tmp)
    check_refusal(program, tmp, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_cuda_test(cases, "weft_test_batch_invariant_"))
