"""Sleep/wake (DESIGN.md section 11): in weft rl the KV pool exists only while rollout runs, so
the training phase's peak memory never includes it. Measured by the backend's own count of live
allocation bytes, per step in metrics.jsonl: the bytes held before the wake, the rollout phase's
peak, the bytes after the sleep and the training phase's peak, and the pool's size.

A tiny random byte-level model with a pool made large on purpose (rollout.kv_cache_tokens),
2 steps on 1 rank and on 2 ranks: every sleep frees the whole pool (from the second step on it
gives back exactly what the wake took; the first step's forwards also grow the model's own
working memory, which it keeps), the rollout peak holds the whole pool, and the training peak
stays below what was held plus the pool (it is in fact far below: the pool dwarfs a step's
activations here). The memory line printed at the end says the same.
"""
import sys

from reference import fixtures
from reference.rl_loop import (make_tiny_model, metrics, reward_command, rl_args, run_rl,
                               write_prompts, write_reward_script)

POOL_TOKENS = 60000


def check(label, out, failures):
    for step, m in sorted(metrics(out).items()):
        pool, before = m["kv_bytes_freed"], m["before_rollout_bytes"]
        print(f"  {label} step {step}: held {before:.0f} B, rollout peak "
              f"{m['rollout_peak_bytes']:.0f} B (pool {pool:.0f} B), after sleep "
              f"{m['after_sleep_bytes']:.0f} B, training peak {m['training_peak_bytes']:.0f} B")
        if pool <= 0:
            failures.append(f"{label} step {step}: no KV pool bytes reported")
        # The first step's forwards grow the model's own working memory, which it keeps; the pool
        # goes whole, and from the second step on a sleep gives back exactly what the wake took.
        kept = m["after_sleep_bytes"] - before
        if kept >= pool or (step > 1 and kept != 0):
            failures.append(f"{label} step {step}: {m['after_sleep_bytes']:.0f} bytes held after "
                            f"the sleep, {before:.0f} before the wake: the pool was not all freed")
        if m["rollout_peak_bytes"] < before + pool:
            failures.append(f"{label} step {step}: rollout peak {m['rollout_peak_bytes']:.0f} B is "
                            f"below the held bytes plus the pool ({before + pool:.0f} B)")
        if m["training_peak_bytes"] >= before + pool:
            failures.append(f"{label} step {step}: training peak {m['training_peak_bytes']:.0f} B "
                            f"reaches the held bytes plus the pool: the pool stayed resident")


def cases(weft, tmp):
    failures = []
    mdir = f"{tmp}/model"
    make_tiny_model(mdir)
    prompts = write_prompts(f"{tmp}/prompts.jsonl", [12, 30, 7, 21, 16, 9, 25, 4], seed=3)
    reward = reward_command(write_reward_script(tmp))
    for ranks in (1, 2):
        out = f"{tmp}/run{ranks}"
        r = run_rl(weft, rl_args(mdir, prompts, out, *reward,
                                 f"rollout.kv_cache_tokens={POOL_TOKENS}"), ranks=ranks)
        check(f"{ranks} rank(s)", out, failures)
        if "memory (last step, measured)" not in r.stdout:
            failures.append(f"{ranks} rank(s): no memory line in the output")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_memory_", "memory checks failed"))
