"""Prefix caching computes a shared prefix once and changes no bit of the output.

Ten prompts on the CPU, blocks of 16 positions: seven start with the same 100 tokens (6 full
blocks, then their own tokens), one repeats one of those seven exactly, one holds the shared
prefix's blocks in another order (its first block shared, its second the prefix's third: keys
depend on the position, so only a lookup that follows the whole prefix may find it), and one
shares nothing. `weft generate` with rollout.prefix_caching on and off, 2 samples each at
temperature 1, on a plain model and on one with two MTP modules drafting 2 tokens a step (whose
keys at a position read the next 2 tokens: a block is found only with those tokens too, so the
reordered prompt finds nothing there):
- the output files are byte-identical (so are the outputs with a pool small enough to preempt,
  where recomputed samples find their own blocks, and with a smaller pool and prefills in chunks
  of 24 rows, where sequences are preempted part-way through their prompts: a block is found
  again only once all its positions were computed);
- with caching on, the positions found in the cache are exactly what each prompt shares with the
  prompts before it in full blocks (the first prompt computes the prefix, the other six wait for
  it and find its 96 positions, the repeat finds all its full blocks, the reordered one its first
  block on the plain model), never its last position (whose row gives the first token);
- the forwards computed exactly that many positions fewer.
Last, prompts made of blocks drawn at random from three (check_random_prefixes), with and
without drafts: caching on equals caching off byte for byte under preemptions and chunking.
"""
import filecmp
import os
import random
import sys

import numpy as np

from reference import files, fixtures, qwen2
from reference.generation import generate, write_prompts

BLOCK, SHARED, NEW = 16, 100, 12
SUFFIXES = [40, 1, 17, 30, 60, 5, 9]  # the seven prompts' own tokens after the shared prefix
REPEATED = 4                          # the prompt repeated exactly


def prompt_set(vocab):
    rng = np.random.default_rng(11)
    prefix = [int(x) for x in rng.integers(0, vocab, SHARED)]
    prompts = [prefix + [int(x) for x in rng.integers(0, vocab, n)] for n in SUFFIXES]
    blocks = [prefix[i * BLOCK:(i + 1) * BLOCK] for i in range(SHARED // BLOCK)]
    reordered = blocks[0] + blocks[2] + blocks[1] + [int(x) for x in rng.integers(0, vocab, 20)]
    unrelated = [int(x) for x in rng.integers(0, vocab, 70)]
    return prompts + [list(prompts[REPEATED]), reordered, unrelated]


def expected_hits(prompts, lookahead):
    """Per prompt: the full blocks it shares with an earlier prompt (leading, whole blocks and the
    `lookahead` tokens after them, its last position excluded), in positions."""
    hits = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            k = 0
            while (k + 1) * BLOCK <= len(p) - 1 and (k + 1) * BLOCK + lookahead <= min(len(p), len(q)) \
                    and p[:(k + 1) * BLOCK + lookahead] == q[:(k + 1) * BLOCK + lookahead]:
                k += 1
            best = max(best, k * BLOCK)
        hits.append(best)
    return hits


def check_model(weft, tmp, name, cfg, speculative, pools, failures):
    """The prompts on one model, caching on and off (and on with small pools): see the module
    docstring."""
    mdir = os.path.join(tmp, name)
    files.make_model(mdir, cfg, 2, std=0.1)
    prompts = prompt_set(cfg["vocab_size"])
    path = write_prompts(os.path.join(tmp, f"{name}_prompts.jsonl"), prompts)
    settings = ("sampling.n=2", f"sampling.max_tokens={NEW}", "sampling.temperature=1",
                "sampling.seed=5", "sampling.stop_token_ids=[]", f"rollout.block_size={BLOCK}",
                f"rollout.speculative_tokens={speculative}")
    variants = (("on", ["rollout.prefix_caching=true"]),
                ("off", ["rollout.prefix_caching=false"]),
                ("on, preemptions", ["rollout.prefix_caching=true",
                                     f"rollout.kv_cache_tokens={pools[0]}"]),
                ("on, preemptions, chunks", ["rollout.prefix_caching=true",
                                             f"rollout.kv_cache_tokens={pools[1]}",
                                             "rollout.max_batch_tokens=24"]))
    outs, stats = {}, {}
    for variant, extra in variants:
        outs[variant] = os.path.join(tmp, f"{name}_{variant.replace(', ', '_')}.jsonl")
        _, stats[variant], _ = generate(weft, mdir, path, outs[variant], *settings, *extra)
        cache = stats[variant]["prefix_cache"]
        print(f"{name}, prefix caching {variant}: {cache['hit_positions']:.0f} positions found in "
              f"the cache, {cache['computed_positions']:.0f} computed, "
              f"{stats[variant]['preemptions']:.0f} preemptions")
    for variant in ("on", "on, preemptions", "on, preemptions, chunks"):
        if not filecmp.cmp(outs["off"], outs[variant], shallow=False):
            failures.append(f"{name}, prefix caching {variant}: the output differs from caching "
                            f"off's")
    hits = expected_hits(prompts, speculative)
    want = sum(hits)
    on, off = stats["on"]["prefix_cache"], stats["off"]["prefix_cache"]
    print(f"{name}: expected {want} positions found ({hits})")
    if on["hit_positions"] != want:
        failures.append(f"{name}: caching on found {on['hit_positions']:.0f} positions, not the "
                        f"{want} the prompts share in full blocks")
    if off["hit_positions"] != 0:
        failures.append(f"{name}: caching off found {off['hit_positions']:.0f} positions")
    fewer = off["computed_positions"] - on["computed_positions"]
    if fewer != want:
        failures.append(f"{name}: caching on computed {fewer:.0f} positions fewer than caching "
                        f"off, not the {want} found")
    for variant in ("on, preemptions", "on, preemptions, chunks"):
        if stats[variant]["preemptions"] < 1:
            failures.append(f"{name}, {variant}: the small pool forced no preemption")
        elif stats[variant]["prefix_cache"]["hit_positions"] <= 0:
            failures.append(f"{name}, {variant}: the preempted samples found none of their "
                            f"blocks again")


def check_random_prefixes(weft, tmp, speculative, failures):
    """14 prompts made of 0-4 blocks drawn from 3 (shared prefixes of many depths, blocks in
    several places) and a tail of their own, on a 64-token vocabulary (samples' blocks may
    repeat prompts'), 3 samples each: caching on equals caching off byte for byte, with the
    default pool, with preemptions, and with preemptions and prefills in chunks of 20 rows."""
    cfg = dict(qwen2.SMALL_CFG, vocab_size=64)
    if speculative:
        cfg["num_nextn_predict_layers"] = speculative
    mdir = os.path.join(tmp, f"random_{speculative}")
    files.make_model(mdir, cfg, 3, std=0.1)
    rng = random.Random(speculative)
    blocks = [[rng.randrange(64) for _ in range(BLOCK)] for _ in range(3)]
    prompts = [sum((rng.choice(blocks) for _ in range(rng.randrange(5))), []) +
               [rng.randrange(64) for _ in range(rng.randrange(1, 20))] for _ in range(14)]
    path = write_prompts(os.path.join(tmp, f"random_{speculative}.jsonl"), prompts)
    settings = ("sampling.n=3", "sampling.max_tokens=20", "sampling.seed=2",
                "sampling.stop_token_ids=[]", f"rollout.block_size={BLOCK}",
                f"rollout.speculative_tokens={speculative}")
    ref = os.path.join(tmp, f"random_{speculative}_off.jsonl")
    generate(weft, mdir, path, ref, *settings, "rollout.prefix_caching=false")
    for extra in ([], ["rollout.kv_cache_tokens=160"],
                  ["rollout.kv_cache_tokens=192", "rollout.max_batch_tokens=20"]):
        out = os.path.join(tmp, f"random_{speculative}_on.jsonl")
        _, st, _ = generate(weft, mdir, path, out, *settings, *extra)
        same = filecmp.cmp(ref, out, shallow=False)
        print(f"random prefixes, {speculative} drafts, {' '.join(extra) or 'default pool'}: "
              f"{'byte-identical' if same else 'DIFFERS'}; {st['preemptions']:.0f} preemptions, "
              f"{st['prefix_cache']['hit_positions']:.0f} positions found")
        if not same:
            failures.append(f"random prefixes, {speculative} drafts, {extra}: the output differs "
                            f"from caching off's")


def cases(weft, tmp):
    failures = []
    check_model(weft, tmp, "plain", qwen2.SMALL_CFG, 0, (256, 176), failures)
    check_model(weft, tmp, "mtp", dict(qwen2.SMALL_CFG, num_nextn_predict_layers=2), 2,
                (256, 208), failures)
    for speculative in (0, 2):
        check_random_prefixes(weft, tmp, speculative, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_prefix_cache_", "checks failed"))
