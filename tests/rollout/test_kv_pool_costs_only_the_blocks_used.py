"""A KV pool reserved for the worst case costs the memory of the blocks its sequences write.

`weft generate` sizes its pool for every sample at its longest, or by `rollout.kv_cache_tokens`
(`rollout.kv_cache_fraction` of free memory by default): far more than a job usually writes. On
the CPU the pool's pages must not be touched before a block is used, or the reservation alone
takes that memory (and the time to clear it). The same prompts are generated with a pool of 256
positions and one of about 512 MB: the outputs must be byte-identical, and the second process's
peak resident memory may exceed the first's by at most 1% of the larger pool (5 MB: the
blocks written are a few KB, and the peak's noise about 100 KB; touching the pool adds 512 MB).
"""
import json
import os
import subprocess
import sys

from reference import files, fixtures, qwen2
from reference.generation import random_prompts, write_prompts


# Runs argv[1:] and prints its exit status and peak resident set (KiB). A child's peak counts the
# memory of the process it was forked from, so the measuring process must be a small one, not
# this test (which holds numpy and the model writer).
MEASURE = ("import os, subprocess, sys\n"
           "p = subprocess.Popen(sys.argv[1:])\n"
           "_, status, usage = os.wait4(p.pid, 0)\n"
           "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n")


def peak_rss_bytes(cmd):
    """Runs cmd; returns (its exit status, its peak resident set in bytes, its output)."""
    r = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    status, kib = (int(x) for x in r.stdout.strip().splitlines()[-1].split())
    return status, kib * 1024, r.stdout + r.stderr


def cases(weft, tmp):
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, qwen2.SMALL_CFG, 5, std=0.1)
    prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"),
                            random_prompts([9, 40, 17], qwen2.SMALL_CFG["vocab_size"], 6))
    runs, failures = {}, []
    for name, tokens in (("small pool", 256), ("large pool", 1 << 20)):
        out = os.path.join(tmp, f"{name.replace(' ', '_')}.jsonl")
        rc, rss, text = peak_rss_bytes(
            [weft, "generate", "--model", mdir, "--prompts", prompts, "--out", out, "--stats",
             out + ".stats.json", "sampling.max_tokens=24", "sampling.seed=3",
             f"rollout.kv_cache_tokens={tokens}"])
        if rc != 0:
            return [f"{name}: weft generate failed ({rc}):\n{text}"]
        with open(out, "rb") as f:
            body = f.read()
        with open(out + ".stats.json") as f:
            pool = json.load(f)["kv"]["pool_bytes"]
        runs[name] = (rss, pool, body)
        print(f"{name}: KV pool {pool} bytes, peak resident {rss} bytes")
    (rss_small, _, out_small), (rss_large, pool_large, out_large) = runs.values()
    if out_small != out_large:
        failures.append("the outputs differ between the two pool sizes")
    grown = rss_large - rss_small
    print(f"resident memory the larger pool added: {grown} bytes "
          f"({grown / pool_large:.4f} of its {pool_large} bytes; at most 0.01 allowed)")
    if grown > pool_large / 100:
        failures.append(f"the {pool_large}-byte pool added {grown} bytes of resident memory: its "
                        "unused blocks were touched")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_kv_pool_", "checks failed"))
