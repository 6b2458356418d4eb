"""`weft grad` on an RL batch gives the float64 PyTorch reference's loss, gradients and RL
statistics (DESIGN.md section 12), for every policy loss, aggregation mode, KL type, dual clip on
and off and entropy on and off.

The reference (tests/reference/rl.py) is written from the objective's math, not from weft's
code. Model: the Qwen2 of model/test_model_matches_pytorch (vocab 97, hidden 64, 2 layers, GQA,
attention bias, untied), and once with MTP (D = 1), whose gradient adds (lambda/D) sum_k L_k.
Batch: 8 documents of 1 to 24 tokens with masked prompts (two without targets, one with a single
target); old_logprobs are the model's own log-probs shifted by chosen log-ratios, ref_logprobs
shifted too (some past k3's clamp), every one kept at least 0.02 in log-ratio (0.05 for k3) from
the edges where a clip decision changes, so float32 round-off cannot flip one. Advantages are
GRPO's (one per document: positive, negative, zero) or per-token (normal, some zeros). PPO's
log-ratios fall inside the clip range, below it, above it and above log(c) (dual clip); GSPO's
per-sequence log-ratio means sit inside and on both sides of the range, one above log(c) with
A < 0 (GSPO has no dual clip: it must not bind there).

CISPO's log-ratios are PPO's (inside the range and on both sides of it); GMPO's (geo_mean) too,
kept away also from the log-space bounds -0.2, 0.2 and 0.28 it clamps them to.

Cases: ppo, gspo, cispo and geo_mean x the 4 aggregation modes with KL (k3) and entropy on and
dual clip at 3 (which only PPO has);
then variations: k1 and k2, KL off (rows without ref_logprobs), dual clip off and at 2.5, entropy
off, clip-higher (clip_ratio_high 0.28), truncated importance sampling (rl.tis_imp_ratio_cap 2,
rows with rollout_logprobs whose weights fall on both sides of the cap), CISPO with k1, with
clip-higher and no KL, and with truncated importance sampling, GMPO with k1 and with
clip-higher and no KL (it refuses truncated importance sampling), no rl.* key at all (the
defaults), and MTP. Every case
asserts from the reference that its clipping is not vacuous: the clipped fraction strictly
between 0 and 1, PPO clipped on both sides of the range (A > 0 above, A < 0 below), the dual clip
bound active on some tokens (for GSPO: tokens where it would bind if it were applied), k3's
clamp on some tokens.

Checked per case, to max|diff|/max|ref| <= 1e-5: "loss", every grad.<name> (and mtp_losses with
MTP), and stats "rl": loss, pg_loss, kl_loss, entropy, pg_clipfrac, pg_clipfrac_lower, ppo_kl.
A statistic that is a sum of terms of both signs is measured against the same aggregate of its
terms' absolute values (rl.stat_scales), the size a float32 implementation's round-off follows.
kl_loss with kl_loss_coef = 0 and entropy with entropy_coeff = 0 may be reported as 0 or omitted
(weft need not compute a term it does not use); when reported non-zero they must be right.

`--conditioning` prints, instead, how far a float32 run of the reference lands from float64 on
every case (the fixture is sound when that is well under the tolerance).
"""

import os
import sys

import numpy as np
import torch

from reference import fixtures, qwen2, rl
from reference.compare import compare, compare_all, rel_err

TOL = 1e-5
LENGTHS = [13, 1, 2, 9, 24, 5, 17, 11]
PROMPTS = [4, 1, 1, 3, 6, 5, 2, 7]
# GSPO: per-document mean log-ratio s_i: above the range (A > 0: clipped), inside, below (A < 0:
# clipped), inside (A = 0), above log(c) with A < 0 (not clipped: GSPO has no dual clip), below
# with A > 0 (not clipped).
GSPO_MEANS = [0.45, 0.0, 0.05, -0.5, 0.1, 0.0, 1.3, -0.4]
SEED = 16
BASE = dict(kl_loss_coef=0.1, kl_loss_type="k3", entropy_coeff=0.01, clip_ratio_c=3.0,
            loss_scale_factor=16.0)


def case_list():
    """(batch name, settings, explicit keys?) per case; batch names are <policy>_<advantages>."""
    cases = []
    for policy in rl.POLICY_LOSSES:
        for mode in rl.AGG_MODES:
            cases.append((f"{policy}_grpo", rl.settings(policy_loss=policy, loss_agg_mode=mode,
                                                        **BASE), True))
    for batch, over in [
            ("ppo_varying", dict(kl_loss_type="k1", loss_agg_mode="seq-mean-token-mean")),
            ("ppo_varying", dict(kl_loss_type="k2", loss_agg_mode="token-mean")),
            ("gspo_varying", dict(policy_loss="gspo", kl_loss_type="k1",
                                  loss_agg_mode="seq-mean-token-sum")),
            ("gspo_varying", dict(policy_loss="gspo", kl_loss_type="k2",
                                  loss_agg_mode="seq-mean-token-mean")),
            ("ppo_varying", dict(kl_loss_coef=0.0, loss_agg_mode="token-mean")),
            ("gspo_grpo", dict(policy_loss="gspo", kl_loss_coef=0.0,
                               loss_agg_mode="seq-mean-token-mean")),
            ("ppo_grpo", dict(clip_ratio_c=0.0, loss_agg_mode="token-mean")),
            ("ppo_varying", dict(clip_ratio_c=0.0, loss_agg_mode="seq-mean-token-sum-norm")),
            ("ppo_varying", dict(clip_ratio_c=2.5, loss_agg_mode="seq-mean-token-sum")),
            ("ppo_varying", dict(entropy_coeff=0.0, loss_agg_mode="seq-mean-token-mean")),
            ("gspo_varying", dict(policy_loss="gspo", entropy_coeff=0.0,
                                  loss_agg_mode="token-mean")),
            ("ppo_varying", dict(clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean")),
            ("gspo_grpo", dict(policy_loss="gspo", clip_ratio_high=0.28,
                               loss_agg_mode="token-mean")),
            ("ppo_varying", dict(tis_imp_ratio_cap=rl.TIS_CAP,
                                 loss_agg_mode="seq-mean-token-mean")),
            ("gspo_grpo", dict(policy_loss="gspo", tis_imp_ratio_cap=rl.TIS_CAP,
                               loss_agg_mode="seq-mean-token-sum")),
            ("cispo_varying", dict(policy_loss="cispo", kl_loss_type="k1",
                                   loss_agg_mode="seq-mean-token-mean")),
            ("cispo_varying", dict(policy_loss="cispo", kl_loss_coef=0.0, clip_ratio_high=0.28,
                                   loss_agg_mode="token-mean")),
            ("cispo_grpo", dict(policy_loss="cispo", tis_imp_ratio_cap=rl.TIS_CAP,
                                entropy_coeff=0.0, loss_agg_mode="seq-mean-token-sum")),
            ("geo_mean_varying", dict(policy_loss="geo_mean", kl_loss_type="k1",
                                      loss_agg_mode="seq-mean-token-mean")),
            ("geo_mean_varying", dict(policy_loss="geo_mean", kl_loss_coef=0.0,
                                      clip_ratio_high=0.28, loss_agg_mode="token-mean"))]:
        cases.append((batch, rl.settings(**dict(BASE, **over)), True))
    cases.append(("ppo_varying", rl.settings(), False))  # no rl.* key: the defaults
    return cases


MTP_CASES = [("ppo_grpo", rl.settings(**BASE), True),
             ("gspo_varying", rl.settings(policy_loss="gspo", loss_agg_mode="seq-mean-token-mean",
                                          **BASE), True)]


def make_batches(mdir, params, cfg, docs):
    """The RL fields of each batch variant: {name: rows}, and their files with and without
    ref_logprobs, with rollout_logprobs too: {(name, with_ref, with_rollout): path}."""
    lp64 = rl.model_logprobs(params, cfg, docs)
    rng = np.random.default_rng(SEED + 1000)
    rows = {}
    for policy in rl.POLICY_LOSSES:
        for adv in ("grpo", "varying"):
            rows[f"{policy}_{adv}"] = rl.make_rows(docs, lp64, rng, policy, adv,
                                                   gspo_means=GSPO_MEANS)
    paths = {}
    for name, r in rows.items():
        paths[(name, True, False)] = rl.write_rows(os.path.join(mdir, f"{name}.jsonl"), docs, r)
        paths[(name, False, False)] = rl.write_rows(os.path.join(mdir, f"{name}_noref.jsonl"),
                                                    docs, r, fields=("advantages", "old_logprobs"))
        paths[(name, True, True)] = rl.write_rows(
            os.path.join(mdir, f"{name}_rollout.jsonl"), docs, r,
            fields=("advantages", "old_logprobs", "ref_logprobs", "rollout_logprobs"))
    return rows, paths


def not_vacuous(s, info, stats, N):
    """Problems that would let the case pass without exercising clipping: returns a list."""
    problems = []
    clipped = np.concatenate(info["clipped"])
    A = np.concatenate(info["A"])
    if not 0 < stats["pg_clipfrac"] < 1:
        problems.append(f"clipped fraction {stats['pg_clipfrac']:.3f} not strictly in (0, 1)")
    if not (np.any(clipped[A > 0] > 0) and np.any(clipped[A < 0] > 0)):
        problems.append("clipping does not happen on both sides of the range")
    if s["policy_loss"] == "ppo" and s["clip_ratio_c"] > 1 and \
            not 0 < stats["pg_clipfrac_lower"] < 1:
        problems.append(f"dual clip fraction {stats['pg_clipfrac_lower']:.3f} not in (0, 1)")
    if s["policy_loss"] == "gspo" and s["clip_ratio_c"] > 1 and not info["beyond_c"]:
        problems.append("no GSPO token with A < 0 beyond the dual clip bound (where PPO's dual "
                        "clip, which GSPO does not have, would bind)")
    if s["tis_imp_ratio_cap"] > 0 and not 0 < stats["tis_capped"] < 1:
        problems.append(f"importance weights capped on a fraction {stats['tis_capped']:.3f} of "
                        "the tokens, not strictly in (0, 1)")
    if s["kl_loss_coef"] != 0 and s["kl_loss_type"] == "k3" and not 0 < info["k3_clamped"] < N:
        problems.append(f"k3 clamped on {info['k3_clamped']} of {N} tokens")
    return problems


def check_stats(got, want, scales, s, tag):
    """weft's stats["rl"] against the reference; returns the failing names."""
    bad = []
    if not isinstance(got, dict):
        print("  FAIL stats: no \"rl\" object in weft's statistics")
        return ["stats.rl"]
    for k in rl.STATS:
        ref = want[k]
        optional = (k == "kl_loss" and s["kl_loss_coef"] == 0) or \
                   (k == "entropy" and s["entropy_coeff"] == 0)
        if optional and (got.get(k) is None or got.get(k) == 0):
            print(f"  ok   stats.rl.{k:41s} {got.get(k)!r} (the term is off)")
            continue
        if ref is None:  # kl_loss with the KL term off (the rows carry no ref_logprobs)
            print(f"  FAIL stats.rl.{k}: weft reports {got.get(k)!r} without ref_logprobs")
            bad.append(f"stats.rl.{k}")
            continue
        g = got.get(k)
        if not compare(f"stats.rl.{k}", None if g is None else np.float64(g), np.float64(ref),
                       TOL, scale=scales[k]):
            bad.append(f"stats.rl.{k}")
    return bad


def run_cases(weft, tmp, tag, cfg_over, cases, failures):
    mdir = os.path.join(tmp, tag)
    cfg, params, _, docs = fixtures.model_and_batch(mdir, cfg_over, SEED, LENGTHS, PROMPTS,
                                                    SEED + 100)
    N = qwen2.count_targets(docs)
    G = sum(1 for d in docs if rl.targets(d))
    print(f"[{tag}] documents {len(docs)}, targets N={N}, sequences with targets G={G}")
    rows, paths = make_batches(mdir, params, cfg, docs)
    for batch, s, explicit in cases:
        name = f"{tag} {batch} {rl.label(s) if explicit else '(no rl.* keys)'}"
        print(f"--- {name}")
        loss, grads, want, scales, info, mtp = rl.reference(params, cfg, docs, rows[batch], s)
        print(f"  reference: loss {loss:.8f} pg_clipfrac {want['pg_clipfrac']:.3f} "
              f"pg_clipfrac_lower {want['pg_clipfrac_lower']:.3f} k3 clamped "
              f"{info['k3_clamped']} ppo_kl {want['ppo_kl']:.4f}")
        problems = not_vacuous(s, info, want, N)
        if problems:
            failures.append(f"{name}: the fixture does not exercise clipping: "
                            + "; ".join(problems))
            continue
        bpath = paths[(batch, s["kl_loss_coef"] != 0, s["tis_imp_ratio_cap"] > 0)]
        out, stats = fixtures.try_grad(
            weft, fixtures.grad_args(mdir, bpath, *(rl.args(s) if explicit else [])), name,
            failures)
        if out is None:
            continue
        bad = []
        if not compare("loss", out.get("loss"), np.float64(loss), TOL, scale=scales["loss"]):
            bad.append("loss")
        if qwen2.mtp_depth(cfg) and not compare("mtp_losses", out.get("mtp_losses"), mtp, TOL):
            bad.append("mtp_losses")
        bad += compare_all("grad.", out, grads, TOL)
        bad += check_stats(stats.get("rl"), want, scales, s, name)
        failures += [f"{name}: {b}" for b in bad]


def conditioning():
    """float32 reference vs float64 on every case: the worst relative error per case."""
    import tempfile
    tmp = tempfile.mkdtemp(prefix="weft_rl_cond_")
    for tag, over, cases in (("mtp0", {}, case_list()),
                             ("mtp1", dict(num_nextn_predict_layers=1), MTP_CASES)):
        mdir = os.path.join(tmp, tag)
        cfg, params, _, docs = fixtures.model_and_batch(mdir, dict(qwen2.SMALL_CFG, **over), SEED,
                                                        LENGTHS, PROMPTS, SEED + 100)
        rows, _ = make_batches(mdir, params, cfg, docs)
        for batch, s, _ in cases:
            l64, g64, *_ = rl.reference(params, cfg, docs, rows[batch], s)
            l32, g32, *_ = rl.reference(params, cfg, docs, rows[batch], s, dtype=torch.float32)
            worst = max((rel_err(g32[k], g64[k])[0], k) for k in g64)
            print(f"{tag} {batch} {rl.label(s)}: loss {abs(l32 - l64) / abs(l64):.1e}, "
                  f"worst gradient {worst[1]} {worst[0]:.1e}")


def body(weft, tmp):
    failures = []
    run_cases(weft, tmp, "mtp0", dict(qwen2.SMALL_CFG), case_list(), failures)
    run_cases(weft, tmp, "mtp1", dict(qwen2.SMALL_CFG, num_nextn_predict_layers=1), MTP_CASES,
              failures)
    return failures


if __name__ == "__main__":
    if "--conditioning" in sys.argv:
        conditioning()
        sys.exit(0)
    sys.exit(fixtures.run_test(body, "weft_test_rl_loss_",
                               f"comparisons over tolerance {TOL:g} or failed"))
