"""The RL gradient does not depend on the layout (DESIGN.md sections 3 and 12): dp 1, 2 and 4,
the distributed optimizer off and on, cp 2 (alone and with dp 2), dynamic context parallelism
uniform and heterogeneous, 1 to 3 micro-batches, MTP off and on. Every layout's loss, gradients
(mtp_losses with MTP) and RL statistics equal the single-process run on the same global batch to
1e-5 relative, for PPO with token-mean and with seq-mean-token-mean, and for GSPO with
seq-mean-token-mean, whose per-sequence ratio needs every token of a sequence that CP or DCP
splits over ranks.

The model is the small fixture of parallel/test_dcp_matches_single_process.py (vocab 53, hidden
32, 2 layers). The batch: 13 documents of 1 to 61 tokens, one without targets; the 61- and
30-token ones need DCP degrees 4 and 2 at max_seqlen_per_rank = 16 (on 4 ranks the
heterogeneous plan runs the 30-token one on 2 ranks beside two 1-rank groups, which `weft plan`
is checked to say), and every document of 16 tokens or more has targets in each eighth of it
after the first (where its prompt lies), so the response crosses every CP and DCP chunk
boundary. RL rows come from tests/reference/rl.py: KL (k3) and entropy on, dual clip at 3; PPO
rows have per-token advantages and log-ratios on both sides of the clip range, GSPO rows one
advantage per document and per-sequence mean log-ratios inside and on both sides of the range
(the 61-token sequence clipped, the 30-token one below the range with A > 0, so its gradient
scales with the whole sequence's ratio, which per-chunk means would get wrong). The reference
checks that each setting really clips (clipped fraction strictly between 0 and 1) and
gives the statistics' scales (see rl.stat_scales); the single-process loss is also checked
against it.
"""
import os
import subprocess
import sys

import numpy as np

from reference import files, rl
from reference.compare import compare, rel_err
from reference.fixtures import model_and_batch, run_test
from reference.mpi import run_ranks
from reference.runner import stats_of

TOL = 1e-5
CFG = dict(vocab_size=53, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, rope_theta=100.0, rms_norm_eps=1e-6,
           tie_word_embeddings=False, attention_bias=True)
SEED = 17
LENGTHS = [61, 5, 30, 9, 1, 14, 3, 11, 7, 2, 16, 6, 12]
PROMPTS = [9, 5, 4, 2, 1, 3, 1, 2, 2, 1, 2, 1, 3]
GSPO_MEANS = [0.45, 0.0, -0.4, -0.5, 0.05, 0.1, 0.3, -0.05, 1.3, 0.0, -0.35, 0.05, 0.25]
BASE = dict(kl_loss_coef=0.1, kl_loss_type="k3", entropy_coeff=0.01, clip_ratio_c=3.0,
            loss_scale_factor=16.0)
SETTINGS = {
    "ppo/token-mean": ("ppo", rl.settings(loss_agg_mode="token-mean", **BASE)),
    "ppo/seq-mean-token-mean": ("ppo", rl.settings(loss_agg_mode="seq-mean-token-mean", **BASE)),
    "gspo/seq-mean-token-mean": ("gspo", rl.settings(policy_loss="gspo",
                                                     loss_agg_mode="seq-mean-token-mean",
                                                     **BASE)),
}
TM, SM, GS = SETTINGS
LIMIT = 16
DCP = ("parallel.dynamic_context_parallel=true", f"parallel.max_seqlen_per_rank={LIMIT}")
DDP, DIST = "parallel.use_distributed_optimizer=false", "parallel.use_distributed_optimizer=true"


def mb(k):
    return f"train.micro_batches={k}"


# (ranks, options, settings): each layout with the settings it is run with, chosen so that each
# setting meets every kind of layout without running every combination.
LAYOUTS = {
    0: [(1, (mb(3),), (TM, SM, GS)),
        (2, (DDP,), (TM, SM)),
        (2, (DIST, mb(2)), (TM, SM, GS)),
        (4, (DDP, mb(2)), (SM,)),
        (4, (DIST, mb(3)), (TM, GS)),
        (2, ("parallel.context_parallel_size=2", DDP), (TM, SM, GS)),
        (4, ("parallel.context_parallel_size=2", DIST, mb(2)), (SM, GS)),
        (4, DCP + ("parallel.dcp_mode=uniform",), (TM, SM, GS)),
        (4, DCP + ("parallel.dcp_mode=heterogeneous",), (TM, SM, GS))],
    1: [(1, (mb(3),), (TM,)),
        (2, (DIST, mb(2)), (SM,)),
        (4, (DDP,), (TM,)),
        (4, ("parallel.context_parallel_size=2", DIST, mb(2)), (SM, GS)),
        (4, DCP + ("parallel.dcp_mode=uniform",), (TM,)),
        (4, DCP + ("parallel.dcp_mode=heterogeneous",), (SM, GS))],
}


def run(weft, mdir, bpath, out, ranks, s, *options):
    stats, _ = stats_of([weft, "grad", "--model", mdir, "--batch", bpath, "--out", out,
                         *rl.args(s), *options], lambda args: run_ranks(ranks, args))
    return files.read_safetensors(out), stats


def check_fixture(docs, failures):
    """Long documents have targets in each eighth of their length after the first (which holds
    the prompt), so their response crosses every CP and DCP chunk boundary."""
    for i, d in enumerate(docs):
        L = len(d["input_ids"])
        if L < 16:
            continue
        tt = rl.targets(d)
        missing = [k for k in range(1, 8)
                   if not any(k * L // 8 <= t < (k + 1) * L // 8 for t in tt)]
        if missing:
            failures.append(f"fixture: document {i} ({L} tokens) has no target in eighths "
                            f"{missing}")


def check_heterogeneous_plan(weft, bpath, failures):
    """On 4 ranks the heterogeneous plan runs groups of different degrees side by side."""
    def plan(args):
        return subprocess.run(args, capture_output=True, text=True, timeout=60)
    stats, r = stats_of([weft, "plan", "--ranks", "4", "--batch", bpath, *DCP,
                         "parallel.dcp_mode=heterogeneous"], plan)
    micro = stats.get("micro_batches", [])
    steps = {m["step"] for m in micro}
    mixed = [s for s in steps if len({m["degree"] for m in micro if m["step"] == s}) > 1]
    degrees = sorted({m["degree"] for m in micro})
    print(f"heterogeneous plan on 4 ranks: degrees {degrees}, steps with mixed degrees {mixed}")
    if r.returncode != 0 or not mixed or 4 not in degrees:
        failures.append(f"fixture: the heterogeneous plan on 4 ranks has no step with mixed "
                        f"degrees or no degree 4 (exit {r.returncode}, degrees {degrees})")


def compare_outputs(got, ref, got_stats, ref_stats, scales, tag):
    """Every tensor of the single-process output and its RL statistics. Returns failures."""
    missing = [k for k in ref if k not in got]
    if missing:
        return [f"{tag}: missing outputs {missing}"]
    worst = max((rel_err(got[k], ref[k])[0], k) for k in ref)
    bad = []
    g_rl, r_rl = got_stats.get("rl", {}), ref_stats.get("rl", {})
    for k in rl.STATS:
        if k not in r_rl:
            continue
        if not compare(f"stats.rl.{k}", None if g_rl.get(k) is None else np.float64(g_rl[k]),
                       np.float64(r_rl[k]), TOL, quiet=True, scale=scales[k]):
            bad.append(f"stats.rl.{k}")
    status = "ok" if worst[0] <= TOL and not bad else "FAIL"
    print(f"{status} {tag}: worst {worst[1]} {worst[0]:.2e} (tol {TOL}); loss "
          f"{float(got['loss']):.7f} vs {float(ref['loss']):.7f}; clipfrac "
          f"{g_rl.get('pg_clipfrac')} vs {r_rl.get('pg_clipfrac')}")
    out = [f"{tag}: {k} differs" for k in bad]
    if worst[0] > TOL:
        out.append(f"{tag}: {worst[1]} differs by {worst[0]:.2e}")
    return out


def body(weft, tmp):
    failures = []
    for mtp in (0, 1):
        mdir = os.path.join(tmp, f"mtp{mtp}")
        cfg, params, bpath, docs = model_and_batch(mdir, dict(CFG, num_nextn_predict_layers=mtp),
                                                   SEED, LENGTHS, PROMPTS, SEED + 1)
        if mtp == 0:
            check_fixture(docs, failures)
            check_heterogeneous_plan(weft, bpath, failures)
        lp64 = rl.model_logprobs(params, cfg, docs)
        rng = np.random.default_rng(SEED + 2)
        rows = {policy: rl.make_rows(docs, lp64, rng, policy,
                                     "varying" if policy == "ppo" else "grpo",
                                     gspo_means=GSPO_MEANS) for policy in ("ppo", "gspo")}
        paths = {policy: rl.write_rows(os.path.join(mdir, f"{policy}.jsonl"), docs, r)
                 for policy, r in rows.items()}
        used = sorted({name for _, _, names in LAYOUTS[mtp] for name in names})
        refs = {}
        for name in used:
            policy, s = SETTINGS[name]
            loss, _, want, scales, info, _ = rl.reference(params, cfg, docs, rows[policy], s)
            tag = f"mtp={mtp} {name}"
            if not 0 < want["pg_clipfrac"] < 1 or (policy == "ppo" and
                                                   not 0 < want["pg_clipfrac_lower"] < 1) or \
                    not info["beyond_c"]:
                failures.append(f"{tag}: the fixture does not clip (pg_clipfrac "
                                f"{want['pg_clipfrac']}, lower {want['pg_clipfrac_lower']}, "
                                f"tokens beyond the dual clip bound {info['beyond_c']})")
            ref, ref_stats = run(weft, mdir, paths[policy],
                                 os.path.join(tmp, "ref.safetensors"), 1, s)
            if not compare(f"{tag} single-process loss vs reference", ref.get("loss"),
                           np.float64(loss), TOL, scale=scales["loss"]):
                failures.append(f"{tag}: single-process loss differs from the reference")
            refs[name] = (ref, ref_stats, scales)
        for ranks, options, names in LAYOUTS[mtp]:
            for name in names:
                policy, s = SETTINGS[name]
                tag = f"mtp={mtp} {name} ranks={ranks} {' '.join(options)}"
                try:
                    got, stats = run(weft, mdir, paths[policy],
                                     os.path.join(tmp, "got.safetensors"), ranks, s, *options)
                except RuntimeError as e:
                    print(f"FAIL {tag}:\n{e}")
                    failures.append(f"{tag}: weft failed")
                    continue
                ref, ref_stats, scales = refs[name]
                failures += compare_outputs(got, ref, stats, ref_stats, scales, tag)
    return failures


if __name__ == "__main__":
    sys.exit(run_test(body, "weft_test_rl_layout_"))
