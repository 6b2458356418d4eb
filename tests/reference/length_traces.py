"""Seeded document-length traces for the context-parallel planner (`weft plan --lengths`).

  - lognormal: a pretraining-style corpus, lognormal lengths (sigma 1.5, mean about 1000 tokens)
    capped at 32K: most documents short, a thin tail of long ones.
  - long_tail: a chat / long-context mix, 85% short turns (lognormal, mean 600, sigma 0.7) and
    15% long documents of 2048 * (1 + Pareto(1.2)) tokens, capped at 64K: a heavy tail where a
    few documents hold much of the attention work.

Each returns a list of n ints >= 1; write() stores one per line, the format `weft plan` reads.
"""
import numpy as np


def _lognormal(rng, mean, sigma, n):
    return rng.lognormal(np.log(mean) - sigma ** 2 / 2, sigma, n)  # E[X] = mean


def lognormal(n, seed):
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(_lognormal(rng, 1000, 1.5, n)), 1, 32768).astype(int).tolist()


def long_tail(n, seed):
    rng = np.random.default_rng(seed)
    short = _lognormal(rng, 600, 0.7, n)
    long = 2048 * (1 + rng.pareto(1.2, n))
    x = np.where(rng.random(n) < 0.15, long, short)
    return np.clip(np.rint(x), 1, 65536).astype(int).tolist()


def write(path, lengths):
    with open(path, "w") as f:
        f.write("".join(f"{int(x)}\n" for x in lengths))
