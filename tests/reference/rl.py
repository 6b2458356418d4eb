"""Reference of the RL objective (DESIGN.md section 12) for weft's Python tests, written from the
math of the interface, independent of weft's code, in float64 PyTorch on the reference model of
qwen2.py.

  (a) settings: the rl.* keys and their defaults, as `weft grad` options.
  (b) RL rows: advantages, old and reference log-probs made from the model's own log-probs with
      chosen log-ratios (kept away from every clip edge, so that float32 round-off cannot flip a
      clip decision), written as weft reads them.
  (c) the objective: per target token t of sequence i, with logp the model's log-prob of token t,
      old and ref the row's, A the advantage:
        PPO   r = exp(clamp(logp - old, -20, 20)); pg1 = -A r; pg2 = -A clamp(r, 1-low, 1+high);
              pg = max(pg1, pg2); with c = clip_ratio_c > 1 and A < 0: pg = min(pg, -A c)
        GSPO  s_i = mean over i's targets of (logp - old); log ratio = logp - sg(logp) + sg(s_i),
              clamped at max 10; ratio = exp(that); pg = max(-A ratio, -A clamp(ratio, 1-low,
              1+high)); no dual clip
        CISPO r as PPO's; pg = -sg(clamp(r, 1-low, 1+high)) A logp (the clipped ratio a constant
              weight on the log-prob); clipped = [r outside the range]; no dual clip
        GMPO  (geo_mean) x = logp - old, c = clamp(x, -low, high), g = sgn(A) min(sgn(A) x,
              sgn(A) c) per token; r_i = exp(min(mean_i g, 20)), A_i = mean_i A; every target's
              pg = -A_i r_i; clipped = [A != 0 and g != x]; no dual clip
        KL    k1 = logp - ref; k2 = (logp - ref)^2 / 2; k3 = exp(ref - logp) - (ref - logp) - 1,
              clamped to [-10, 10]
        H_t   entropy of the softmax that predicts token t
        TIS   with tis_imp_ratio_cap = C > 0 and the rollout's log-prob roll: pg times the constant
              (no gradient) w = min(exp(old - roll), C), after the clips
      per-token objective pg + kl_loss_coef kl - entropy_coeff H, aggregated over the whole batch:
        token-mean               sum / N                  (N targets of the batch)
        seq-mean-token-mean      (1/G) sum_i sum_t / n_i  (G sequences with a target)
        seq-mean-token-sum       (1/G) sum_i sum_t
        seq-mean-token-sum-norm  (1/G) sum_i sum_t / loss_scale_factor
      plus (lambda/D) sum_k L_k, the MTP cross-entropy losses, with MTP. Statistics: loss, pg_loss,
      kl_loss, entropy (each aggregated, without its coefficient), pg_clipfrac (token-mean of
      [pg2 > pg1]), pg_clipfrac_lower (token-mean of [A < 0 and max(pg1, pg2) > -A c], PPO with
      dual clip; else 0), ppo_kl (token-mean of old - logp), tis_weight (token-mean of w; 1
      without TIS), tis_capped (token-mean of [w = C]).

`/usr/bin/python3 tests/reference/rl.py` runs this reference's self-checks: the gradient of the
objective with respect to each token's log-prob and entropy against derivatives written out by
hand (every policy loss and KL type, dual clip on and off), and the parameter gradients of the PPO
and GMPO objectives against central finite differences (GSPO's and CISPO's surrogates are not the
derivatives of their values, so finite differences do not apply to them).
"""

import json
import math
import os
import sys

import numpy as np
import torch

if __name__ == "__main__":  # run as a script (the self-check): reference.* lives in tests/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reference import qwen2  # noqa: E402

# --------------------------------------------------------------------------------------------
# (a) settings
# --------------------------------------------------------------------------------------------

POLICY_LOSSES = ("ppo", "gspo", "cispo", "geo_mean")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "k2", "k3")
DEFAULTS = dict(policy_loss="ppo", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
                kl_loss_coef=0.0, kl_loss_type="k3", entropy_coeff=0.0,
                loss_agg_mode="token-mean", loss_scale_factor=16.0, tis_imp_ratio_cap=0.0)
STATS = ("loss", "pg_loss", "kl_loss", "entropy", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl",
         "tis_weight", "tis_capped")
K3_CLAMP = 10.0
# ref - logp where k3 reaches its clamp: exp(x) - x - 1 = 10.
K3_EDGE = 2.6093
TIS_CAP = 2.0  # the truncated importance weight's cap the fixtures keep their weights away from


def settings(**over):
    """DEFAULTS with `over` applied (unknown keys are an error)."""
    bad = set(over) - set(DEFAULTS)
    if bad:
        raise KeyError(f"unknown rl settings {sorted(bad)}")
    return dict(DEFAULTS, **over)


def args(s):
    """The `weft grad` options rl.<key>=<value> of every setting of s (all written explicitly)."""
    return [f"rl.{k}={v!r}" if isinstance(v, float) else f"rl.{k}={v}" for k, v in s.items()]


def label(s):
    """A short description of the settings that differ from DEFAULTS."""
    return " ".join(f"{k}={v}" for k, v in s.items() if DEFAULTS[k] != v) or "defaults"


# --------------------------------------------------------------------------------------------
# (b) RL rows
# --------------------------------------------------------------------------------------------

def targets(doc):
    """The target positions t >= 1 with loss_mask[t] = 1."""
    return [t for t in range(1, len(doc["input_ids"])) if doc["loss_mask"][t]]


def f32(x):
    """x rounded to float32, as a float64 array (what weft reads from the row)."""
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def clip_edges(lows=(0.2,), highs=(0.2, 0.28), cs=(3.0, 2.5)):
    """Log-ratios where a clip decision changes: log(1-low), log(1+high), log(c) for every
    clip_ratio_low, clip_ratio_high and clip_ratio_c value the tests use."""
    return [math.log(1 - x) for x in lows] + [math.log(1 + x) for x in highs] + \
        [math.log(x) for x in cs]


def away(x, edges, margin):
    return all(abs(x - e) >= margin for e in edges)


def token_log_ratios(rng, n, edges, margin=0.02):
    """n log-ratios logp - old for PPO: inside the clip range, below it, above it and above
    log(c) (dual clip), none within `margin` of an edge."""
    out = []
    while len(out) < n:
        kind = rng.random()
        if kind < 0.35:
            u = rng.uniform(-0.2, 0.17)
        elif kind < 0.6:
            u = rng.uniform(-0.9, -0.25)
        elif kind < 0.8:
            u = rng.uniform(0.2, 0.9)
        else:
            u = rng.uniform(1.15, 1.7)
        if away(u, edges, margin):
            out.append(u)
    return np.array(out)


def sequence_log_ratios(rng, n, mean, spread=0.3):
    """n log-ratios whose mean is exactly `mean` (GSPO's s_i), spread around it per token."""
    u = rng.uniform(-spread, spread, size=n)
    return u - u.mean() + mean if n else u


def kl_offsets(rng, n):
    """ref - logp per token: mostly moderate, some beyond k3's clamp (x > 2.61), none near it."""
    out = []
    while len(out) < n:
        x = rng.normal(0.0, 0.6) if rng.random() < 0.8 else rng.uniform(2.8, 3.5)
        if abs(x - K3_EDGE) >= 0.05:
            out.append(x)
    return np.array(out)


def make_rows(docs, logp, rng, policy, advantages, gspo_means=None, edges=None):
    """Per-document RL fields (full-length lists, 0 off the targets, values rounded to float32)
    from the model's own log-probs: logp[i] holds document i's log-probs at its targets (in
    targets() order). policy "ppo" or "cispo": per-token log-ratios from token_log_ratios; "gspo": document
    i's log-ratios have mean gspo_means[i % len] exactly (then spread per token).
    advantages "grpo": one value per document (cycling through positive, negative, zero);
    "varying": per token, normal with some exact zeros. rollout_logprobs put old - rollout in
    [-0.6, 1.2] (about a quarter above log(TIS_CAP)), none within 0.02 of log(TIS_CAP), from a
    generator of their own (so rng's draws are what they were before the field). Returns
    [{"advantages", "old_logprobs", "ref_logprobs", "rollout_logprobs"}] per document."""
    edges = clip_edges() if edges is None else edges
    grpo = [1.3, -0.8, 0.6, -1.7, 0.0, 0.9, -0.4]
    rows = []
    for i, d in enumerate(docs):
        tt = targets(d)
        n = len(tt)
        if policy in ("ppo", "cispo"):
            u = token_log_ratios(rng, n, edges)
        elif policy == "geo_mean":  # GMPO clamps the log-ratio itself: keep away from those too
            u = token_log_ratios(rng, n, edges + [-0.2, 0.2, 0.28])
        else:
            u = sequence_log_ratios(rng, n, gspo_means[i % len(gspo_means)])
        if advantages == "grpo":
            a = np.full(n, grpo[i % len(grpo)])
        else:
            a = rng.normal(0.0, 1.0, size=n)
            a[rng.random(n) < 0.15] = 0.0
        kl = kl_offsets(rng, n)
        L = len(d["input_ids"])
        row = {k: np.zeros(L) for k in ("advantages", "old_logprobs", "ref_logprobs",
                                         "rollout_logprobs")}
        lp = np.asarray(logp[i], dtype=np.float64)
        sampler = rollout_offsets(np.random.default_rng(7919 + i), n)
        for j, t in enumerate(tt):
            row["advantages"][t] = a[j]
            row["old_logprobs"][t] = lp[j] - u[j]
            row["ref_logprobs"][t] = lp[j] + kl[j]
            row["rollout_logprobs"][t] = lp[j] - u[j] - sampler[j]
        rows.append({k: f32(v) for k, v in row.items()})
    return rows


def rollout_offsets(rng, n, margin=0.02):
    """n values of old - rollout log-prob, none within `margin` of log(TIS_CAP)."""
    edge, out = math.log(TIS_CAP), []
    while len(out) < n:
        x = rng.uniform(-0.6, 1.2)
        if abs(x - edge) >= margin:
            out.append(x)
    return np.array(out)


def write_rows(path, docs, rows, fields=("advantages", "old_logprobs", "ref_logprobs")):
    """Writes the batch: input_ids, loss_mask and the RL `fields` of each document."""
    with open(path, "w") as f:
        for d, r in zip(docs, rows):
            line = {"input_ids": d["input_ids"], "loss_mask": d["loss_mask"]}
            for k in fields:
                line[k] = [float(x) for x in r[k]]
            f.write(json.dumps(line) + "\n")
    return path


# --------------------------------------------------------------------------------------------
# (c) the objective
# --------------------------------------------------------------------------------------------

def model_terms(P, cfg, docs, dtype=torch.float64):
    """The reference model's log-prob and entropy at every target: ([logp tensor (n_i,)],
    [entropy tensor (n_i,)], mtp_losses [L_1..L_D]) per document, differentiable in P."""
    logits, _, _, mtp = qwen2.forward(P, cfg, docs, dtype)
    lsm = torch.log_softmax(logits, dim=-1)
    ent = -(lsm.exp() * lsm).sum(dim=-1)
    logp, H, row = [], [], 0
    for d in docs:
        tt = targets(d)
        rows_ = torch.tensor([row + t - 1 for t in tt], dtype=torch.long)
        toks = torch.tensor([d["input_ids"][t] for t in tt], dtype=torch.long)
        logp.append(lsm[rows_, toks] if tt else torch.zeros(0, dtype=dtype))
        H.append(ent[rows_] if tt else torch.zeros(0, dtype=dtype))
        row += len(d["input_ids"])
    return logp, H, mtp


def aggregate(values, mode, scale_factor):
    """values: per-document tensors over their targets (empty for documents without one)."""
    seqs = [v for v in values if v.numel() > 0]
    N, G = sum(v.numel() for v in seqs), len(seqs)
    if mode == "token-mean":
        return sum(v.sum() for v in seqs) / N
    if mode == "seq-mean-token-mean":
        return sum(v.sum() / v.numel() for v in seqs) / G
    if mode == "seq-mean-token-sum":
        return sum(v.sum() for v in seqs) / G
    if mode == "seq-mean-token-sum-norm":
        return sum(v.sum() for v in seqs) / G / scale_factor
    raise ValueError(mode)


def token_mean(values):
    seqs = [v for v in values if v.numel() > 0]
    return sum(v.sum() for v in seqs) / sum(v.numel() for v in seqs)


def policy_terms(logp, row, tt, s):
    """pg per token of one document (targets tt), with the clip indicators. Returns (pg,
    clipped [pg2 > pg1], lower [dual clip bound applied], beyond_c [A < 0 and max(pg1, pg2) >
    -A c, whatever the policy loss], the truncated importance weight w, capped [w = C])
    tensors."""
    dtype = logp.dtype
    A = torch.tensor([row["advantages"][t] for t in tt], dtype=dtype)
    old = torch.tensor([row["old_logprobs"][t] for t in tt], dtype=dtype)
    low, high, c = s["clip_ratio_low"], s["clip_ratio_high"], s["clip_ratio_c"]
    if s["policy_loss"] in ("ppo", "cispo", "geo_mean"):
        r = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    elif s["policy_loss"] == "gspo":
        seq = (logp - old).mean().detach()
        r = torch.exp(torch.clamp(logp - logp.detach() + seq, max=10.0))
    else:
        raise ValueError(s["policy_loss"])
    pg1 = -A * r
    pg2 = -A * torch.clamp(r, 1.0 - low, 1.0 + high)
    pg = torch.maximum(pg1, pg2)
    clipped = (pg2 > pg1).to(dtype)
    if s["policy_loss"] == "cispo":
        weight = torch.clamp(r, 1.0 - low, 1.0 + high).detach()
        pg = -weight * A * logp
        clipped = (weight != r.detach()).to(dtype)
    if s["policy_loss"] == "geo_mean" and len(tt):
        x = logp - old
        sg = torch.sign(A)
        g = sg * torch.minimum(sg * x, sg * torch.clamp(x, -low, high))
        ratio = torch.exp(torch.clamp(g.mean(), max=20.0))
        pg = (-A.mean() * ratio).expand(len(tt))
        clipped = ((sg != 0) & (g != x)).to(dtype).detach()
    # Where the dual clip bound -A c lies below the clipped loss (A < 0, ratio above c); it
    # applies to PPO only (beyond_c tells a test whether GSPO's data would show it applied).
    beyond_c = ((A < 0) & (torch.maximum(pg1, pg2) > -A * c)).to(dtype) if c > 1 \
        else torch.zeros_like(pg)
    lower = torch.zeros_like(pg)
    if s["policy_loss"] == "ppo" and c > 1:
        lower = beyond_c
        pg = torch.where(A < 0, torch.minimum(pg, -A * c), pg)
    w, capped = torch.ones_like(pg), torch.zeros_like(pg)
    if s["tis_imp_ratio_cap"] > 0 and s["policy_loss"] == "geo_mean":
        raise ValueError("GMPO's one ratio per sequence takes no per-token importance weight")
    if s["tis_imp_ratio_cap"] > 0:
        roll = torch.tensor([row["rollout_logprobs"][t] for t in tt], dtype=dtype)
        raw = torch.exp(old - roll)
        capped = (raw >= s["tis_imp_ratio_cap"]).to(dtype)
        w = torch.clamp(raw, max=s["tis_imp_ratio_cap"])
        pg = pg * w
    return pg, clipped.detach(), lower.detach(), beyond_c.detach(), w, capped


def kl_term(logp, row, tt, kind):
    ref = torch.tensor([row["ref_logprobs"][t] for t in tt], dtype=logp.dtype)
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref) ** 2
    if kind == "k3":
        x = ref - logp
        return torch.clamp(torch.exp(x) - x - 1.0, -K3_CLAMP, K3_CLAMP)
    raise ValueError(kind)


def objective(logp, H, docs, rows, s):
    """The aggregated RL objective and its statistics from per-document logp and entropy
    tensors. Returns (loss tensor, {stat: float}, {"clipped": [...], "lower": [...], "A": [...],
    "beyond_c": int, "k3_clamped": int}) the last for the tests' checks that clipping really
    happens."""
    pg, kl, cl, lo, bc, ratio_terms, As, ws, caps = [], [], [], [], [], [], [], [], []
    k3_clamped = 0
    for lp, d, row in zip(logp, docs, rows):
        tt = targets(d)
        p, c_, l_, b_, w_, cap_ = policy_terms(lp, row, tt, s)
        ws.append(w_)
        caps.append(cap_)
        pg.append(p)
        bc.append(b_)
        cl.append(c_)
        lo.append(l_)
        As.append(np.array([row["advantages"][t] for t in tt]))
        old = torch.tensor([row["old_logprobs"][t] for t in tt], dtype=lp.dtype)
        ratio_terms.append((old - lp).detach())
        if s["kl_loss_coef"] != 0:
            kl.append(kl_term(lp, row, tt, s["kl_loss_type"]))
            if s["kl_loss_type"] == "k3" and tt:
                ref = np.array([row["ref_logprobs"][t] for t in tt])
                k3_clamped += int(np.sum(ref - lp.detach().numpy() > K3_EDGE))
    mode, sf = s["loss_agg_mode"], s["loss_scale_factor"]
    pg_loss = aggregate(pg, mode, sf)
    loss = pg_loss
    kl_loss = ent = None
    if s["kl_loss_coef"] != 0:
        kl_loss = aggregate(kl, mode, sf)
        loss = loss + s["kl_loss_coef"] * kl_loss
    ent = aggregate(H, mode, sf)
    if s["entropy_coeff"] != 0:
        loss = loss - s["entropy_coeff"] * ent
    stats = dict(loss=float(loss), pg_loss=float(pg_loss),
                 kl_loss=float(kl_loss) if kl_loss is not None else None,
                 entropy=float(ent), pg_clipfrac=float(token_mean(cl)),
                 pg_clipfrac_lower=float(token_mean(lo)), ppo_kl=float(token_mean(ratio_terms)),
                 tis_weight=float(token_mean(ws)), tis_capped=float(token_mean(caps)))
    info = dict(clipped=[c.numpy() for c in cl], lower=[l.numpy() for l in lo],
                beyond_c=int(sum(float(b.sum()) for b in bc)), A=As, k3_clamped=k3_clamped)
    return loss, stats, info


def stat_scales(logp, H, docs, rows, s):
    """For each statistic a magnitude its round-off is measured against (compare's `scale`): the
    same aggregate of the absolute values of its terms (a sum of terms of both signs can cancel
    to near zero; a float32 implementation's error is relative to the terms, not to the sum)."""
    with torch.no_grad():
        pg, kl, ratio_terms = [], [], []
        for lp, d, row in zip(logp, docs, rows):
            tt = targets(d)
            pg.append(policy_terms(lp, row, tt, s)[0].abs())
            kl.append(kl_term(lp, row, tt, s["kl_loss_type"]).abs())
            old = torch.tensor([row["old_logprobs"][t] for t in tt], dtype=lp.dtype)
            ratio_terms.append((old - lp).abs())
        mode, sf = s["loss_agg_mode"], s["loss_scale_factor"]
        pg_s, kl_s, ent_s = (float(aggregate(v, mode, sf)) for v in (pg, kl, H))
    return dict(loss=pg_s + abs(s["kl_loss_coef"]) * kl_s + abs(s["entropy_coeff"]) * ent_s,
                pg_loss=pg_s, kl_loss=kl_s, entropy=ent_s, pg_clipfrac=1.0,
                pg_clipfrac_lower=1.0, ppo_kl=float(token_mean(ratio_terms)), tis_weight=1.0,
                tis_capped=1.0)


def reference(params, cfg, docs, rows, s, dtype=torch.float64):
    """Returns (loss float, {name: grad numpy}, stats, scales, info, mtp_losses numpy (D,)): the
    RL objective of head 0 and the gradients of it plus (lambda/D) sum_k L_k with MTP."""
    P = {k: torch.tensor(np.asarray(v), dtype=dtype, requires_grad=True)
         for k, v in params.items()}
    logp, H, mtp = model_terms(P, cfg, docs, dtype)
    loss, stats, info = objective(logp, H, docs, rows, s)
    qwen2.total_loss(cfg, loss, mtp).backward()
    grads = {k: (v.grad.detach().numpy().copy() if v.grad is not None
                 else np.zeros(tuple(v.shape))) for k, v in P.items()}
    scales = stat_scales([x.detach() for x in logp], [x.detach() for x in H], docs, rows, s)
    return (float(loss), grads, stats, scales, info,
            np.array([float(x) for x in mtp], dtype=np.float64))


def model_logprobs(params, cfg, docs):
    """The reference model's float64 log-probs at each document's targets: [numpy (n_i,)]."""
    with torch.no_grad():
        logp, _, _ = model_terms(qwen2.to_torch(params), cfg, docs)
    return [x.numpy() for x in logp]


# --------------------------------------------------------------------------------------------
# Self-checks
# --------------------------------------------------------------------------------------------

def _hand_derivatives(logp, docs, rows, s):
    """d objective / d logp_t and d objective / d H_t written out by hand, per document."""
    mode, sf = s["loss_agg_mode"], s["loss_scale_factor"]
    low, high, c = s["clip_ratio_low"], s["clip_ratio_high"], s["clip_ratio_c"]
    counts = [len(targets(d)) for d in docs]
    N, G = sum(counts), sum(1 for n in counts if n)
    dlp, dH = [], []
    for lp, d, row, n in zip(logp, docs, rows, counts):
        w = {"token-mean": 1.0 / N, "seq-mean-token-mean": 1.0 / (G * n) if n else 0.0,
             "seq-mean-token-sum": 1.0 / G, "seq-mean-token-sum-norm": 1.0 / (G * sf)}[mode]
        tt = targets(d)
        lpv = lp.detach().numpy()
        A = np.array([row["advantages"][t] for t in tt])
        old = np.array([row["old_logprobs"][t] for t in tt])
        ref = np.array([row["ref_logprobs"][t] for t in tt])
        roll = np.array([row["rollout_logprobs"][t] for t in tt])
        cap = s["tis_imp_ratio_cap"]
        tis = np.minimum(np.exp(old - roll), cap) if cap > 0 else np.ones(n)
        g = np.zeros(n)
        if s["policy_loss"] in ("ppo", "cispo", "geo_mean"):
            r = np.exp(lpv - old)
        else:
            r = np.full(n, math.exp(np.mean(lpv - old))) if n else np.zeros(0)
        for j in range(n):
            inside = (1 - low) <= r[j] <= (1 + high)
            # max(-A r, -A clamp(r)): the unclipped branch wins when r is inside the range, or
            # when clipping would lower the loss (A > 0 below the range, A < 0 above it).
            unclipped = inside or (A[j] > 0 and r[j] < 1 - low) or (A[j] < 0 and r[j] > 1 + high)
            gj = -A[j] * r[j] if unclipped else 0.0
            if s["policy_loss"] == "cispo":  # d/dlogp of -sg(clip(r)) A logp
                gj = -A[j] * min(max(r[j], 1 - low), 1 + high)
            if s["policy_loss"] == "geo_mean":  # every target's -A_i r_i, through the mean of g
                x = lpv - old
                c_ = np.clip(x, -low, high)
                gm = np.where(A > 0, np.minimum(x, c_), np.where(A < 0, np.maximum(x, c_), 0.0))
                ri = math.exp(min(gm.mean(), 20.0))
                free = A[j] != 0 and gm[j] == x[j]
                gj = -A.mean() * ri if free else 0.0
            if s["policy_loss"] == "ppo" and c > 1 and A[j] < 0 and \
                    max(-A[j] * r[j], -A[j] * min(max(r[j], 1 - low), 1 + high)) > -A[j] * c:
                gj = 0.0
            gj *= tis[j]
            if s["kl_loss_coef"] != 0:
                x = ref[j] - lpv[j]
                gk = {"k1": 1.0, "k2": lpv[j] - ref[j],
                      "k3": (1.0 - math.exp(x)) if abs(math.exp(x) - x - 1) <= K3_CLAMP else 0.0
                      }[s["kl_loss_type"]]
                gj += s["kl_loss_coef"] * gk
            g[j] = w * gj
        dlp.append(g)
        dH.append(np.full(n, -s["entropy_coeff"] * w))
    return dlp, dH


def _self_check():
    from reference import files
    from reference.compare import compare
    import shutil
    import tempfile

    ok = True
    tmp = tempfile.mkdtemp(prefix="weft_rl_ref_")
    try:
        cfg, params = files.make_model(tmp, dict(hidden_size=32, intermediate_size=48,
                                                  vocab_size=41), seed=3)
        docs = files.make_batch(os.path.join(tmp, "b.jsonl"), [9, 1, 12, 5, 7], [3, 1, 4, 5, 2],
                                cfg["vocab_size"], seed=4)
        lp64 = model_logprobs(params, cfg, docs)
        rng = np.random.default_rng(5)
        batches = {
            ("ppo", "grpo"): make_rows(docs, lp64, rng, "ppo", "grpo"),
            ("ppo", "varying"): make_rows(docs, lp64, rng, "ppo", "varying"),
            ("gspo", "grpo"): make_rows(docs, lp64, rng, "gspo", "grpo",
                                        gspo_means=[0.4, -0.5, 0.05, 0.3, -0.6]),
            ("gspo", "varying"): make_rows(docs, lp64, rng, "gspo", "varying",
                                           gspo_means=[0.4, -0.5, 1.3, 0.3, -0.6]),
        }
        batches[("cispo", "grpo")] = batches[("ppo", "grpo")]
        batches[("cispo", "varying")] = batches[("ppo", "varying")]
        batches[("geo_mean", "grpo")] = make_rows(docs, lp64, rng, "geo_mean", "grpo")
        batches[("geo_mean", "varying")] = make_rows(docs, lp64, rng, "geo_mean", "varying")
        # (1) d objective / d logp and d H by autograd (logp, H as leaves) vs by hand.
        for (policy, adv), rows in batches.items():
            for mode in AGG_MODES:
                for kl in KL_TYPES:
                    for c, tis in ((3.0, 0.0), (0.0, 0.0), (3.0, TIS_CAP)):
                        if tis and policy == "geo_mean":  # weft refuses the pair
                            continue
                        s = settings(policy_loss=policy, loss_agg_mode=mode, kl_loss_coef=0.3,
                                     kl_loss_type=kl, entropy_coeff=0.05, clip_ratio_c=c,
                                     tis_imp_ratio_cap=tis)
                        lp = [torch.tensor(x, requires_grad=True) for x in lp64]
                        H = [torch.rand(len(x), dtype=torch.float64, requires_grad=True)
                             for x in lp64]
                        loss, _, _ = objective(lp, H, docs, rows, s)
                        loss.backward()
                        want_lp, want_H = _hand_derivatives(lp, docs, rows, s)
                        got_lp, got_H = (np.concatenate([
                            x.grad.numpy() if x.grad is not None else np.zeros(x.numel())
                            for x in xs]) for xs in (lp, H))
                        tag = f"{policy}/{adv} {label(s)}"
                        ok &= compare(f"{tag} dL/dlogp", got_lp, np.concatenate(want_lp), 1e-12,
                                      quiet=True)
                        ok &= compare(f"{tag} dL/dH", got_H, np.concatenate(want_H), 1e-12,
                                      quiet=True)
        print("objective derivatives vs by hand:", "ok" if ok else "FAIL")
        # (2) parameter gradients of the PPO objective vs central finite differences.
        P = qwen2.to_torch(params)
        for policy, adv in [(p, a) for p in ("ppo", "geo_mean") for a in ("grpo", "varying")]:
            rows = batches[(policy, adv)]
            for s in (settings(policy_loss=policy, loss_agg_mode="seq-mean-token-mean",
                               kl_loss_coef=0.2, entropy_coeff=0.1),
                      settings(policy_loss=policy, loss_agg_mode="token-mean", kl_loss_coef=0.2,
                               kl_loss_type="k2", clip_ratio_c=0.0, entropy_coeff=0.05),
                      settings(policy_loss=policy, loss_agg_mode="seq-mean-token-sum",
                               kl_loss_coef=0.1,
                               tis_imp_ratio_cap=TIS_CAP if policy == "ppo" else 0.0)):
                _, grads, _, _, info, _ = reference(params, cfg, docs, rows, s)

                def value(PP):
                    with torch.no_grad():
                        lp, H, _ = model_terms(PP, cfg, docs)
                        return float(objective(lp, H, docs, rows, s)[0])

                worst, rng2 = 0.0, np.random.default_rng(0)
                for name, g in grads.items():
                    for _ in range(2):
                        idx = tuple(int(rng2.integers(0, n)) for n in g.shape)
                        h = 1e-6
                        Pp = dict(P); Pp[name] = P[name].clone(); Pp[name][idx] += h
                        Pm = dict(P); Pm[name] = P[name].clone(); Pm[name][idx] -= h
                        fd = (value(Pp) - value(Pm)) / (2 * h)
                        worst = max(worst, abs(fd - g[idx]) / max(1e-3, np.abs(g).max()))
                clipped = np.concatenate(info["clipped"]).mean()
                print(f"finite differences {policy}/{adv} {label(s)}: clipped fraction "
                      f"{clipped:.2f}, "
                      f"worst |fd - autograd| / max|grad| = {worst:.2e}")
                ok &= worst < 1e-6 and 0 < clipped < 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("RL reference self-check:", "PASS" if ok else "FAIL")
    return ok


if __name__ == "__main__":
    sys.exit(0 if _self_check() else 1)
