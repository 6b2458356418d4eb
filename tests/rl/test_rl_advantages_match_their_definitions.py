"""weft rl's advantages are their estimators' definitions (DESIGN.md section 12), recomputed here
in float64 from each step's saved rollouts (rewards and response lengths), independently of
weft's code, for groups of N samples of one prompt:

  grpo                          (r - mean) / (unbiased std + 1e-6)
  grpo, norm_adv_by_std=false   r - mean (Dr. GRPO)
  rloo                          N / (N - 1) (r - mean): r minus the mean of the other samples
  reinforce_plus_plus_baseline  r - mean, then whitened over the batch's response tokens (each
                                sample weighted by its length; unbiased variance; / sqrt(var +
                                1e-8)), as verl's masked_whiten
  reinforce_plus_plus           per token t the return r - coef sum_{t' >= t} kl_t' (kl: k1 of
                                the old and reference log-probs, with rl.use_kl_in_reward; else
                                r), whitened over the batch's response tokens (saved per token)
  grpo with DAPO's overlong penalty: r + min(0, -(len - (max_tokens - buffer)) / buffer x
                                penalty) before the group statistics

Each case runs 2 steps of 4 prompts x N = 4 samples with a reward command whose rewards differ
within groups and responses of different lengths (sampling.max_tokens 16; extra stop tokens end
some early), and must give every saved advantage within 1e-7 (per-token ones, kept in float32,
within 1e-6); a case whose advantages are all 0,
whose lengths are all equal (the token weighting and the overlong penalty would not show), or
(for the overlong penalty) whose groups all take one penalty, is a broken fixture.
"""
import os
import sys

import numpy as np

from reference import fixtures
from reference.rl_loop import f32, learning_setup, rl_args, rollouts, run_rl

P, N, MAX_TOKENS, BUFFER, KL_COEF = 4, 4, 16, 8, 0.05
# A random model seldom samples its end-of-text; with seven byte values stopping a response too
# (sampling.stop_token_ids takes 8), lengths spread over 1..MAX_TOKENS.
STOPS = "[" + ",".join(str(t) for t in [256, *range(97, 104)]) + "]"
COMMON = [f"train.global_batch_size={P}", f"sampling.n={N}", f"sampling.max_tokens={MAX_TOKENS}",
          f"sampling.stop_token_ids={STOPS}", "train.steps=2", "rl.save_rollouts=true",
          "optim.lr=1e-2", "optim.min_lr=1e-2"]
CASES = {
    "grpo": [],
    "dr_grpo": ["rl.norm_adv_by_std=false"],
    "rloo": ["rl.adv_estimator=rloo"],
    "reinforce_plus_plus_baseline": ["rl.adv_estimator=reinforce_plus_plus_baseline"],
    "grpo_overlong": [f"rl.overlong_buffer={BUFFER}", "rl.overlong_penalty=0.5"],
    "reinforce_plus_plus": ["rl.adv_estimator=reinforce_plus_plus"],
    "reinforce_plus_plus_kl": ["rl.adv_estimator=reinforce_plus_plus", "rl.use_kl_in_reward=true",
                               f"rl.kl_coef={KL_COEF}", "rl.kl_penalty=k1"],
}


def overlong(length):
    return min(-(length - (MAX_TOKENS - BUFFER)) / BUFFER * 0.5, 0.0)


def whiten(x, w):
    mu = np.sum(w * x) / np.sum(w)
    var = np.sum(w * (x - mu) ** 2) / (np.sum(w) - 1)
    return (x - mu) / np.sqrt(var + 1e-8)


def token_advantages(name, rows):
    """REINFORCE++: per-token returns of every response, whitened over all of them."""
    returns = []
    for r in rows:
        kl = np.zeros(len(r["tokens"]))
        if name == "reinforce_plus_plus_kl":
            kl = f32(r["old_logprobs"]).astype(np.float64) - f32(r["ref_logprobs"])
        suffix = np.cumsum(kl[::-1])[::-1]  # sum over t' >= t
        returns.append(r["reward"] - KL_COEF * suffix)
    flat = whiten(np.concatenate(returns), np.ones(sum(len(x) for x in returns)))
    return flat, returns


def advantages(name, rewards, lengths):
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, N)
    if name == "grpo_overlong":
        r = r + np.array([overlong(x) for x in lengths]).reshape(-1, N)
    mean = r.mean(axis=1, keepdims=True)
    if name in ("grpo", "grpo_overlong"):
        return ((r - mean) / (r.std(axis=1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
    if name == "dr_grpo":
        return (r - mean).reshape(-1)
    if name == "rloo":
        return (N / (N - 1) * (r - mean)).reshape(-1)
    return whiten((r - mean).reshape(-1), np.asarray(lengths, dtype=np.float64))


def cases(weft, tmp):
    failures = []
    mdir, prompts, reward = learning_setup(tmp)
    for name, extra in CASES.items():
        out = os.path.join(tmp, name)
        run_rl(weft, rl_args(mdir, prompts, out, *reward, *COMMON, *extra))
        for step in (1, 2):
            rows = rollouts(out, step)
            lengths = [len(r["tokens"]) for r in rows]
            if name.startswith("reinforce_plus_plus") and "baseline" not in name:
                want, returns = token_advantages(name, rows)
                got = np.concatenate([r["token_advantages"] for r in rows])
                worst = float(np.max(np.abs(got - want)))
                varying = sum(len(set(np.round(x, 12))) > 1 for x in returns)
                # Only the KL in the reward makes them vary, and not at step 1 (policy = ref).
                if (name == "reinforce_plus_plus_kl" and step > 1) != (varying > 0):
                    failures.append(f"{name} step {step}: returns vary within {varying} "
                                    "responses")
                tol = 1e-6  # weft keeps per-token advantages in float32
            else:
                want = advantages(name, [r["reward"] for r in rows], lengths)
                got = np.array([r["advantage"] for r in rows])
                worst = float(np.max(np.abs(got - want)))
                tol = 1e-7
            print(f"  {name} step {step}: {len(rows)} samples, lengths {min(lengths)}-"
                  f"{max(lengths)}, |advantage| up to {np.max(np.abs(want)):.3g}, weft within "
                  f"{worst:.2e}")
            if worst > tol:
                failures.append(f"{name} step {step}: advantages differ by {worst:.3g}")
            if not np.any(want != 0):
                failures.append(f"{name} step {step}: every advantage is 0 (a broken fixture)")
            if len(set(lengths)) < 3:
                failures.append(f"{name} step {step}: lengths {sorted(set(lengths))}: too few "
                                "to tell a length weighting from none")
            groups = [{overlong(x) for x in lengths[g:g + N]} for g in range(0, len(lengths), N)]
            if name == "grpo_overlong" and all(len(g) == 1 for g in groups):
                failures.append(f"{name} step {step}: every group takes one overlong penalty")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_rl_advantages_", "advantage checks failed"))
