"""Prefix caching computes a shared prefix once and changes no bit of the output.

Ten prompts on the CPU, blocks of 16 positions: seven start with the same 100 tokens (6 full
blocks, then their own tokens), one repeats one of those seven exactly, one holds the shared
prefix's blocks in another order (its first block shared, its second the prefix's third: keys
depend on the position, so only a lookup that follows the whole prefix may find it), and one
shares nothing. `weft generate` with rollout.prefix_caching on and off, 2 samples each at
temperature 1:
- the output files are byte-identical (so are the outputs with a pool small enough to preempt,
  where recomputed samples find their own blocks, and with a smaller pool and prefills in chunks
  of 24 rows, where sequences are preempted part-way through their prompts: a block is found
  again only once all its positions were computed);
- with caching on, the positions found in the cache are exactly what each prompt shares with the
  prompts before it in full blocks (the first prompt computes the prefix, the other six wait for
  it and find its 96 positions, the repeat finds all its full blocks, the reordered one its first
  block), never its last position (whose row gives the first token);
- the forwards computed exactly that many positions fewer.
"""
import filecmp
import os
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


def expected_hits(prompts):
    """Per prompt: the full blocks it shares with an earlier prompt (leading, whole blocks, its
    last position excluded), in positions."""
    hits = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            k = 0
            while (k + 1) * BLOCK <= min(len(p) - 1, len(q)) and \
                    p[k * BLOCK:(k + 1) * BLOCK] == q[k * BLOCK:(k + 1) * BLOCK]:
                k += 1
            best = max(best, k * BLOCK)
        hits.append(best)
    return hits


def cases(weft, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, qwen2.SMALL_CFG, 2, std=0.1)
    prompts = prompt_set(qwen2.SMALL_CFG["vocab_size"])
    path = write_prompts(os.path.join(tmp, "prompts.jsonl"), prompts)
    settings = ("sampling.n=2", f"sampling.max_tokens={NEW}", "sampling.temperature=1",
                "sampling.seed=5", "sampling.stop_token_ids=[]", f"rollout.block_size={BLOCK}")
    outs, stats = {}, {}
    for name, extra in (("on", ["rollout.prefix_caching=true"]),
                        ("off", ["rollout.prefix_caching=false"]),
                        ("on, preemptions", ["rollout.prefix_caching=true",
                                             "rollout.kv_cache_tokens=256"]),
                        ("on, preemptions, chunks", ["rollout.prefix_caching=true",
                                                     "rollout.kv_cache_tokens=176",
                                                     "rollout.max_batch_tokens=24"])):
        outs[name] = os.path.join(tmp, name.replace(", ", "_") + ".jsonl")
        _, stats[name], _ = generate(weft, mdir, path, outs[name], *settings, *extra)
        cache = stats[name]["prefix_cache"]
        print(f"prefix caching {name}: {cache['hit_positions']:.0f} positions found in the cache, "
              f"{cache['computed_positions']:.0f} computed, {stats[name]['preemptions']:.0f} "
              f"preemptions")
    for name in ("on", "on, preemptions", "on, preemptions, chunks"):
        if not filecmp.cmp(outs["off"], outs[name], shallow=False):
            failures.append(f"prefix caching {name}: the output differs from caching off's")
    want = sum(expected_hits(prompts))
    on, off = stats["on"]["prefix_cache"], stats["off"]["prefix_cache"]
    print(f"expected: {want} positions found ({expected_hits(prompts)})")
    if on["hit_positions"] != want:
        failures.append(f"caching on found {on['hit_positions']:.0f} positions, not the {want} "
                        f"the prompts share in full blocks")
    if off["hit_positions"] != 0:
        failures.append(f"caching off found {off['hit_positions']:.0f} positions in the cache")
    if off["computed_positions"] - on["computed_positions"] != want:
        failures.append(f"caching on computed {off['computed_positions'] - on['computed_positions']:.0f} "
                        f"positions fewer than caching off, not the {want} found")
    for name in ("on, preemptions", "on, preemptions, chunks"):
        if stats[name]["preemptions"] < 1:
            failures.append(f"{name}: the small pool forced no preemption")
        elif stats[name]["prefix_cache"]["hit_positions"] <= 0:
            failures.append(f"{name}: the preempted samples found none of their blocks again")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_prefix_cache_", "checks failed"))
