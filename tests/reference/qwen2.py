"""Reference Qwen2 decoder for weft's Python tests: its configuration, the float64 forward, loss
and gradients, and AdamW with weft's schedule.

Run with Debian's Python (/usr/bin/python3), which has torch. Everything here is deliberately
plain: the model is a per-document loop with an explicit causal mask in float64, gradients come
from autograd and AdamW is written out step by step.

  (a) model configuration: SMALL_CFG, full_cfg, mtp_depth, mtp_scale, param_shapes.
  (b) forward (one document's main and MTP logits: document_logits), main and MTP losses,
      their targets, gradients (reference_grad).
  (c) AdamW steps with weft's learning-rate schedule and gradient clipping.

The files weft reads and writes (safetensors, a model directory, batch JSONL) are files.py's,
running weft is runner.py's and comparing tensors is compare.py's.

`/usr/bin/python3 tests/reference/qwen2.py` runs the reference's self-checks (a safetensors round
trip through files.py, then the model against an independent per-token numpy computation, finite
differences and torch.optim.AdamW).
"""

import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

if __name__ == "__main__":  # run as a script (the self-check): reference.* lives in tests/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reference.compare import compare, rel_err  # noqa: E402

# --------------------------------------------------------------------------------------------
# (a) model configuration
# --------------------------------------------------------------------------------------------

SMALL_CFG = dict(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=True)


def full_cfg(cfg):
    c = dict(SMALL_CFG)
    c.update(cfg)
    c.setdefault("attention_bias", True)
    return c


def head_dim(cfg):
    """The attention head size: config "head_dim" when given, else hidden_size / heads."""
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def has_qk_norm(cfg):
    """Qwen3 (model_type "qwen3") normalizes q and k per head (q_norm / k_norm, RMSNorm over the
    head_dim values of each head) before RoPE, as transformers' Qwen3Attention does."""
    return cfg.get("model_type") == "qwen3"


def mtp_depth(cfg):
    """D, the number of multi-token-prediction modules (config "num_nextn_predict_layers"; 0 or
    absent: no MTP)."""
    return int(cfg.get("num_nextn_predict_layers", 0) or 0)


def mtp_scale(cfg):
    """lambda, the MTP loss weight (config "mtp_loss_scale", default 0.1)."""
    return float(cfg.get("mtp_loss_scale", 0.1))


def _layer_shapes(s, p, cfg):
    """Adds the parameters of one decoder layer named with prefix p to the dict s."""
    h, I = cfg["hidden_size"], cfg["intermediate_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = head_dim(cfg)
    s[p + "input_layernorm.weight"] = (h,)
    s[p + "self_attn.q_proj.weight"] = (H * hd, h)
    s[p + "self_attn.k_proj.weight"] = (KV * hd, h)
    s[p + "self_attn.v_proj.weight"] = (KV * hd, h)
    if cfg["attention_bias"]:
        s[p + "self_attn.q_proj.bias"] = (H * hd,)
        s[p + "self_attn.k_proj.bias"] = (KV * hd,)
        s[p + "self_attn.v_proj.bias"] = (KV * hd,)
    if has_qk_norm(cfg):
        s[p + "self_attn.q_norm.weight"] = (hd,)
        s[p + "self_attn.k_norm.weight"] = (hd,)
    s[p + "self_attn.o_proj.weight"] = (h, H * hd)
    s[p + "post_attention_layernorm.weight"] = (h,)
    s[p + "mlp.gate_proj.weight"] = (I, h)
    s[p + "mlp.up_proj.weight"] = (I, h)
    s[p + "mlp.down_proj.weight"] = (h, I)


def param_shapes(cfg):
    """Ordered {HF name: shape} of every parameter of the model described by cfg. With
    num_nextn_predict_layers = D > 0, module K = 0..D-1 adds model.mtp_layers.K.{enorm, hnorm,
    final_layernorm}.weight (h), eh_proj.weight (h, 2h) and a full decoder layer under
    model.mtp_layers.K. (DeepSeek-V3 / Megatron names); embedding and output head are shared."""
    cfg = full_cfg(cfg)
    V, h = cfg["vocab_size"], cfg["hidden_size"]
    s = {"model.embed_tokens.weight": (V, h)}
    for l in range(cfg["num_hidden_layers"]):
        _layer_shapes(s, f"model.layers.{l}.", cfg)
    s["model.norm.weight"] = (h,)
    if not cfg["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, h)
    for K in range(mtp_depth(cfg)):
        p = f"model.mtp_layers.{K}."
        s[p + "enorm.weight"] = (h,)
        s[p + "hnorm.weight"] = (h,)
        s[p + "eh_proj.weight"] = (h, 2 * h)
        _layer_shapes(s, p, cfg)
        s[p + "final_layernorm.weight"] = (h,)
    return s


# --------------------------------------------------------------------------------------------
# (b) reference forward / loss / gradients
# --------------------------------------------------------------------------------------------

def _rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _decoder_layer(x, W, p, cfg, cos, sin, causal):
    """One pre-norm decoder layer (attention with RoPE, causal within the document, then the
    SwiGLU MLP, each with its residual) on x (L, h); its weights are W[p + ...]."""
    h, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, group = head_dim(cfg), cfg["rms_norm_eps"], H // KV
    L = x.shape[0]
    xn = _rmsnorm(x, W[p + "input_layernorm.weight"], eps)
    q = xn @ W[p + "self_attn.q_proj.weight"].T
    k = xn @ W[p + "self_attn.k_proj.weight"].T
    v = xn @ W[p + "self_attn.v_proj.weight"].T
    if cfg["attention_bias"]:
        q = q + W[p + "self_attn.q_proj.bias"]
        k = k + W[p + "self_attn.k_proj.bias"]
        v = v + W[p + "self_attn.v_proj.bias"]
    q, k, v = q.view(L, H, hd), k.view(L, KV, hd), v.view(L, KV, hd)
    if has_qk_norm(cfg):  # Qwen3: RMSNorm over each head's values, before RoPE
        q = _rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
        k = _rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    heads = []
    for hh in range(H):
        kv = hh // group
        s = (q[:, hh, :] @ k[:, kv, :].T) / math.sqrt(hd)
        s = s.masked_fill(~causal, float("-inf"))
        a = torch.softmax(s, dim=-1)
        heads.append(a @ v[:, kv, :])
    o = torch.cat(heads, dim=-1) @ W[p + "self_attn.o_proj.weight"].T
    x = x + o
    xn = _rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
    g = xn @ W[p + "mlp.gate_proj.weight"].T
    u = xn @ W[p + "mlp.up_proj.weight"].T
    return x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T


def mtp_input_ids(ids, k):
    """The depth-k MTP module's input token ids of one document: token t+k at position t, token
    id 0 where t+k runs past the document's end (as Megatron's roll fills)."""
    L = len(ids)
    return [int(ids[t + k]) if t + k < L else 0 for t in range(L)]


def mtp_targets(doc, k):
    """[(position t, target token)] of depth k >= 0 in one document: token t+k+1, where t+k+1 is
    inside the document and loss_mask[t+k+1] == 1 (k = 0 is the main loss; the mask of token 0
    is never read for k >= 0 since t+k+1 >= 1, and files.make_batch clears it anyway)."""
    ids, mask = doc["input_ids"], doc["loss_mask"]
    return [(t, int(ids[t + k + 1])) for t in range(len(ids) - k - 1) if mask[t + k + 1]]


def mtp_target_counts(docs, D):
    """[N_1, ..., N_D]: the number of depth-k targets in the whole batch."""
    return [sum(len(mtp_targets(d, k)) for d in docs) for k in range(1, D + 1)]


def count_targets(docs):
    """The number of main-loss targets in the batch: tokens t >= 1 with loss_mask[t] == 1 (what
    forward's loss is the mean over)."""
    return sum(sum(d["loss_mask"][1:]) for d in docs)


def document_logits(P, cfg, ids, dtype=torch.float64):
    """One document's logits: (main (L, V), [depth-k MTP logits (L, V) for k = 1..D]). Row t of
    depth k is module k's prediction of token t+k+1 from h_{k-1}(t) and Emb(token t+k) (token id
    0 past the end, mtp_input_ids); as a draft head it reads whatever tokens ids holds there.
    P: {name: torch tensor} (any float dtype; computed in `dtype`)."""
    cfg = full_cfg(cfg)
    h, H = cfg["hidden_size"], cfg["num_attention_heads"]
    hd, eps = head_dim(cfg), cfg["rms_norm_eps"]
    W = {k: v.to(dtype) for k, v in P.items()}
    E = W["model.embed_tokens.weight"]
    lm = E if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    inv_freq = cfg["rope_theta"] ** (-(torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    t_ids = torch.tensor(ids, dtype=torch.long)
    L = t_ids.shape[0]
    x = E[t_ids]
    ang = torch.arange(L, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat((torch.cos(ang), torch.cos(ang)), dim=-1).to(dtype)[:, None, :]
    sin = torch.cat((torch.sin(ang), torch.sin(ang)), dim=-1).to(dtype)[:, None, :]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    for l in range(cfg["num_hidden_layers"]):
        x = _decoder_layer(x, W, f"model.layers.{l}.", cfg, cos, sin, causal)
    x = _rmsnorm(x, W["model.norm.weight"], eps)
    depths = []
    # MTP: module k (1-based) on h_{k-1} (h_0 = x, the final-normed main hidden state).
    hprev = x
    for k in range(1, mtp_depth(cfg) + 1):
        p = f"model.mtp_layers.{k - 1}."
        e = E[torch.tensor(mtp_input_ids(ids, k), dtype=torch.long)]
        cat = torch.cat((_rmsnorm(e, W[p + "enorm.weight"], eps),
                         _rmsnorm(hprev, W[p + "hnorm.weight"], eps)), dim=-1)
        z = cat @ W[p + "eh_proj.weight"].T
        z = _decoder_layer(z, W, p, cfg, cos, sin, causal)
        hprev = _rmsnorm(z, W[p + "final_layernorm.weight"], eps)
        depths.append(hprev @ lm.T)
    return x @ lm.T, depths


def forward(P, cfg, docs, dtype=torch.float64):
    """Reference forward. P: {name: torch tensor} (any float dtype; computed in `dtype`).
    Returns (logits (T_total, V) of the main head, main loss L scalar, number of main targets,
    mtp_losses): mtp_losses is the list [L_1, ..., L_D] of per-depth token-mean MTP losses
    (scalar tensors; a depth without targets in the batch gives an exact 0), empty without MTP.
    total_loss() combines them into the training objective L_total."""
    D = mtp_depth(cfg)
    all_logits, loss_sum, n_targets = [], torch.zeros((), dtype=dtype), 0
    mtp_sums = [torch.zeros((), dtype=dtype) for _ in range(D)]
    mtp_counts = [0] * D
    for doc in docs:
        ids = doc["input_ids"]
        logits, depths = document_logits(P, cfg, ids, dtype)
        all_logits.append(logits)
        for t in range(1, len(ids)):
            if doc["loss_mask"][t]:
                row = logits[t - 1]
                loss_sum = loss_sum + (torch.logsumexp(row, dim=0) - row[ids[t]])
                n_targets += 1
        for k, lg in enumerate(depths, start=1):
            for t, tgt in mtp_targets(doc, k):
                mtp_sums[k - 1] = mtp_sums[k - 1] + (torch.logsumexp(lg[t], dim=0) - lg[t, tgt])
                mtp_counts[k - 1] += 1
    if n_targets == 0:
        raise ValueError("batch has no targets")
    mtp_losses = [sm / n if n else torch.zeros((), dtype=dtype)
                  for sm, n in zip(mtp_sums, mtp_counts)]
    return torch.cat(all_logits, dim=0), loss_sum / n_targets, n_targets, mtp_losses


def total_loss(cfg, loss, mtp_losses):
    """L_total = L + (lambda / D) * sum_k L_k (just L without MTP): what gradients are of."""
    D = len(mtp_losses)
    if D == 0:
        return loss
    return loss + (mtp_scale(cfg) / D) * sum(mtp_losses)


def to_torch(params, dtype=torch.float64):
    return {k: torch.tensor(np.asarray(v), dtype=dtype) for k, v in params.items()}


def reference_grad(params, cfg, docs, dtype=torch.float64, with_mtp=False):
    """Returns (loss float, logits numpy (T, V), {name: grad numpy}) computed in `dtype`: loss is
    the main loss L, logits the main head's, and the gradients are those of L_total (= L without
    MTP). with_mtp=True appends mtp_losses, a float64 numpy array (D,) of L_1..L_D."""
    P = {k: torch.tensor(np.asarray(v), dtype=dtype, requires_grad=True)
         for k, v in params.items()}
    logits, loss, _, mtp = forward(P, cfg, docs, dtype)
    total_loss(cfg, loss, mtp).backward()
    # A parameter the objective does not reach (none today) gets an exact zero gradient.
    grads = {k: (v.grad.detach().numpy().copy() if v.grad is not None
                 else np.zeros(tuple(v.shape))) for k, v in P.items()}
    out = (float(loss), logits.detach().numpy(), grads)
    if with_mtp:
        out += (np.array([float(x) for x in mtp], dtype=np.float64),)
    return out


# --------------------------------------------------------------------------------------------
# (c) AdamW steps with weft's schedule and clipping
# --------------------------------------------------------------------------------------------

OPTIM_DEFAULTS = dict(lr=1e-3, min_lr=0.0, warmup_steps=0, beta1=0.9, beta2=0.95, eps=1e-8,
                      weight_decay=0.1, clip_grad=1.0)


def lr_at(s, steps, lr, min_lr, warmup_steps, **_):
    """Learning rate of step s (1-based) of `steps`."""
    if s <= warmup_steps:
        return lr * s / warmup_steps
    progress = (s - warmup_steps) / max(1, steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def decays(name, shape):
    """Weight decay applies to 2-D weights only (embedding, projections, lm_head)."""
    return len(shape) == 2


def adamw_steps(params, cfg, docs, steps, dtype=torch.float64, grad_noise=0.0, noise_seed=0,
                **opt):
    """Runs `steps` steps of (gradient of L_total, clip, AdamW) from `params` on the batch `docs`
    (L_total = L without MTP; step_losses hold the main loss L either way).

    Returns dict(step_losses [steps], params {name: numpy}, grad_norms [steps] (before clipping),
    clip_coefs [steps], lrs [steps]), all computed in `dtype`. grad_noise > 0 adds uniform noise
    of at most grad_noise * max|g| (per tensor) to every gradient before clipping, to model the
    round-off of a float32 implementation (see adamw_conditioning); exact zeros stay zero."""
    rng = np.random.default_rng(noise_seed)
    o = dict(OPTIM_DEFAULTS)
    o.update(opt)
    b1, b2, eps, wd, clip = o["beta1"], o["beta2"], o["eps"], o["weight_decay"], o["clip_grad"]
    p = {k: torch.tensor(np.asarray(v), dtype=dtype) for k, v in params.items()}
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    v2 = {k: torch.zeros_like(v) for k, v in p.items()}
    losses, norms, coefs, lrs = [], [], [], []
    for s in range(1, steps + 1):
        P = {k: t.clone().requires_grad_(True) for k, t in p.items()}
        _, loss, _, mtp = forward(P, cfg, docs, dtype)
        total_loss(cfg, loss, mtp).backward()
        g = {k: (P[k].grad.detach() if P[k].grad is not None else torch.zeros_like(p[k]))
             for k in p}
        if grad_noise > 0:
            # Exact zeros (e.g. embedding rows of tokens that reach no target) stay exact: an
            # implementation that backpropagates exact zeros gets exact zeros there too.
            g = {k: gg + (gg != 0) * grad_noise * gg.abs().max() * torch.tensor(
                rng.uniform(-1.0, 1.0, size=tuple(gg.shape)), dtype=dtype)
                 for k, gg in g.items()}
        losses.append(float(loss))
        total = torch.sqrt(sum((gg * gg).sum() for gg in g.values()))
        norms.append(float(total))
        coef = 1.0
        if clip > 0:
            coef = torch.clamp(clip / (total + 1e-6), max=1.0)
            g = {k: gg * coef for k, gg in g.items()}
            coef = float(coef)
        coefs.append(coef)
        lr = lr_at(s, steps, o["lr"], o["min_lr"], o["warmup_steps"])
        lrs.append(lr)
        bc1, bc2 = 1.0 - b1 ** s, 1.0 - b2 ** s
        for k in p:
            if decays(k, p[k].shape):
                p[k] = p[k] * (1.0 - lr * wd)
            m[k] = b1 * m[k] + (1.0 - b1) * g[k]
            v2[k] = b2 * v2[k] + (1.0 - b2) * g[k] * g[k]
            denom = torch.sqrt(v2[k]) / math.sqrt(bc2) + eps
            p[k] = p[k] - (lr / bc1) * m[k] / denom
    return dict(step_losses=np.array(losses), params={k: t.numpy() for k, t in p.items()},
                grad_norms=norms, clip_coefs=coefs, lrs=lrs)


def adamw_conditioning(params, cfg, docs, steps, ref, noise=3e-6, seeds=(1, 2), **opt):
    """How much the parameters after `steps` AdamW steps move (max|diff|/max|ref| per tensor,
    worst tensor) when every gradient is perturbed by up to `noise` * max|g| of its tensor: the
    size of gradient error a correct float32 implementation makes (float32 torch measures about
    3e-6 on these fixtures). Adam divides by sqrt(v) + eps, so a gradient element whose size is
    near eps or near that round-off turns round-off into parameter changes of order lr. A
    fixture on which this returns more than a small fraction of the test's tolerance cannot
    decide anything and must be replaced (another seed), not the tolerance loosened.
    Returns (worst relative change, tensor name)."""
    worst = (0.0, None)
    for seed in seeds:
        r = adamw_steps(params, cfg, docs, steps, grad_noise=noise, noise_seed=seed, **opt)
        for k in ref["params"]:
            worst = max(worst, (rel_err(r["params"][k], ref["params"][k])[0], k))
        worst = max(worst, (rel_err(r["step_losses"], ref["step_losses"])[0], "step_losses"))
    return worst


# --------------------------------------------------------------------------------------------
# Self-checks of the reference itself
# --------------------------------------------------------------------------------------------

def _pertoken_numpy(params, cfg, docs):
    """An independent reference: token-at-a-time decoding with a KV cache, scalar RoPE pair
    rotation and explicit softmax, in numpy float64; MTP modules run token at a time too, on a
    shifted copy of the document's ids padded with 0. Returns (logits (T, V), loss, mtp_losses
    list [L_1..L_D])."""
    cfg = full_cfg(cfg)
    h, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, half = h // H, cfg["rms_norm_eps"], (h // H) // 2
    D = mtp_depth(cfg)
    W = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    lm = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]

    def norm(x, w):
        return x / math.sqrt(float(np.dot(x, x)) / x.size + eps) * w

    def rope(vec, pos):
        out = vec.copy()
        for i in range(half):
            a = pos * cfg["rope_theta"] ** (-2.0 * i / hd)
            c, s = math.cos(a), math.sin(a)
            x1, x2 = vec[i], vec[i + half]
            out[i], out[i + half] = x1 * c - x2 * s, x2 * c + x1 * s
        return out

    def layer(x, p, cache, pos):
        xn = norm(x, W[p + "input_layernorm.weight"])
        q = W[p + "self_attn.q_proj.weight"] @ xn
        k = W[p + "self_attn.k_proj.weight"] @ xn
        v = W[p + "self_attn.v_proj.weight"] @ xn
        if cfg["attention_bias"]:
            q = q + W[p + "self_attn.q_proj.bias"]
            k = k + W[p + "self_attn.k_proj.bias"]
            v = v + W[p + "self_attn.v_proj.bias"]
        ks, vs = cache
        ks.append([rope(k[j * hd:(j + 1) * hd], pos) for j in range(KV)])
        vs.append([v[j * hd:(j + 1) * hd] for j in range(KV)])
        att = np.zeros(H * hd)
        for hh in range(H):
            j = hh * KV // H
            qh = rope(q[hh * hd:(hh + 1) * hd], pos)
            sc = [float(np.dot(qh, ks[s][j])) / math.sqrt(hd) for s in range(pos + 1)]
            mx = max(sc)
            e = [math.exp(a - mx) for a in sc]
            z = sum(e)
            att[hh * hd:(hh + 1) * hd] = sum(e[s] / z * vs[s][j] for s in range(pos + 1))
        x = x + W[p + "self_attn.o_proj.weight"] @ att
        xn = norm(x, W[p + "post_attention_layernorm.weight"])
        g = W[p + "mlp.gate_proj.weight"] @ xn
        u = W[p + "mlp.up_proj.weight"] @ xn
        return x + W[p + "mlp.down_proj.weight"] @ (g / (1.0 + np.exp(-g)) * u)

    def xent(r, tok):
        mx = r.max()
        return mx + math.log(np.exp(r - mx).sum()) - r[tok]

    rows, loss, n = [], 0.0, 0
    mloss, mn = [0.0] * D, [0] * D
    for doc in docs:
        ids, mask = doc["input_ids"], doc["loss_mask"]
        cache = [([], []) for _ in range(cfg["num_hidden_layers"])]
        doc_rows, hid = [], []
        for pos, tok in enumerate(ids):
            x = W["model.embed_tokens.weight"][tok].copy()
            for l in range(cfg["num_hidden_layers"]):
                x = layer(x, f"model.layers.{l}.", cache[l], pos)
            hid.append(norm(x, W["model.norm.weight"]))
            doc_rows.append(lm @ hid[-1])
        for t in range(1, len(ids)):
            if mask[t]:
                loss += xent(doc_rows[t - 1], ids[t])
                n += 1
        rows.extend(doc_rows)
        for k in range(1, D + 1):
            p = f"model.mtp_layers.{k - 1}."
            shifted = list(ids[k:]) + [0] * min(k, len(ids))
            mcache, new_hid = ([], []), []
            for pos in range(len(ids)):
                e = W["model.embed_tokens.weight"][shifted[pos]]
                cat = np.concatenate([norm(e, W[p + "enorm.weight"]),
                                      norm(hid[pos], W[p + "hnorm.weight"])])
                z = layer(W[p + "eh_proj.weight"] @ cat, p, mcache, pos)
                new_hid.append(norm(z, W[p + "final_layernorm.weight"]))
                j = pos + k + 1  # the depth-k target's index
                if j < len(ids) and mask[j]:
                    mloss[k - 1] += xent(lm @ new_hid[-1], ids[j])
                    mn[k - 1] += 1
            hid = new_hid
    return np.array(rows), loss / n, [ls / c if c else 0.0 for ls, c in zip(mloss, mn)]


def _self_check():
    # Imported here, not at the top: files.py imports this module (make_model uses param_shapes).
    from reference import files

    ok = True
    tmp = tempfile.mkdtemp(prefix="weft_ref_")
    try:
        # safetensors round trip
        t = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.float32(2.5),
             "z": np.zeros((0, 4), np.float32)}
        files.write_safetensors(os.path.join(tmp, "t.safetensors"), t)
        back = files.read_safetensors(os.path.join(tmp, "t.safetensors"))
        ok &= back["s"].shape == () and float(back["s"]) == 2.5
        ok &= back["z"].shape == (0, 4) and np.array_equal(back["a"], t["a"])
        print("safetensors round trip:", "ok" if ok else "FAIL")

        lengths, prompts = [7, 1, 2, 5, 11], [2, 1, 1, 5, 3]
        for tied, bias, D in ((False, True, 0), (False, False, 0), (True, True, 0),
                              (True, False, 0), (False, True, 2), (True, False, 3)):
            over = dict(tie_word_embeddings=tied, attention_bias=bias, hidden_size=32,
                        intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                        rope_theta=1000.0)
            if D:
                over["num_nextn_predict_layers"] = D
            cfg, params = files.make_model(os.path.join(tmp, "m"), over, seed=3)
            back = files.read_safetensors(os.path.join(tmp, "m", "model.safetensors"))
            ok &= set(back) == set(params) == set(param_shapes(cfg)) and all(
                np.array_equal(back[k], params[k]) for k in params)
            docs = files.make_batch(os.path.join(tmp, "b.jsonl"), lengths, prompts,
                                    cfg["vocab_size"], seed=4, no_mask=(4,), mask0_one=(0,))
            loss, logits, grads, mtp = reference_grad(params, cfg, docs, with_mtp=True)
            rl, rloss, rmtp = _pertoken_numpy(params, cfg, docs)
            tag = f"tied={tied} bias={bias} D={D}"
            ok &= compare(f"{tag} logits vs per-token numpy", logits, rl, 1e-12)
            ok &= compare(f"{tag} loss vs per-token numpy", loss, rloss, 1e-12)
            ok &= len(mtp) == D
            if D:
                print(f"  {tag}: depth target counts {mtp_target_counts(docs, D)}")
                ok &= compare(f"{tag} mtp_losses vs per-token numpy", mtp, rmtp, 1e-12)

        # Finite differences on a few entries of each gradient of L_total (float64, central).
        for over in (dict(tie_word_embeddings=True),
                     dict(tie_word_embeddings=False, num_nextn_predict_layers=2,
                          mtp_loss_scale=0.7)):
            cfg, params = files.make_model(os.path.join(tmp, "m"), over, seed=5)
            docs = files.make_batch(os.path.join(tmp, "b.jsonl"), lengths, prompts,
                                    cfg["vocab_size"], 6)
            loss, _, grads = reference_grad(params, cfg, docs)
            rng = np.random.default_rng(0)
            P = to_torch(params)

            def objective(PP):
                _, l, _, m = forward(PP, cfg, docs)
                return float(total_loss(cfg, l, m))

            worst = 0.0
            for name, g in grads.items():
                for _ in range(3):
                    idx = tuple(int(rng.integers(0, s)) for s in g.shape)
                    hstep = 1e-6
                    Pp = dict(P); Pp[name] = P[name].clone(); Pp[name][idx] += hstep
                    Pm = dict(P); Pm[name] = P[name].clone(); Pm[name][idx] -= hstep
                    fd = (objective(Pp) - objective(Pm)) / (2 * hstep)
                    worst = max(worst, abs(fd - g[idx]) / max(1e-3, np.abs(g).max()))
            print(f"finite differences (D={mtp_depth(cfg)}): worst |fd - autograd| / max|grad| "
                  f"= {worst:.2e}")
            ok &= worst < 1e-6

            # AdamW: our explicit float64 loop against torch.optim.AdamW + clip_grad_norm_.
            opt = dict(lr=1e-3, min_lr=1e-4, warmup_steps=2, weight_decay=0.1, clip_grad=1.0)
            ref = adamw_steps(params, cfg, docs, 5, **opt)
            P = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
                 for k, v in params.items()}
            dec = [t for k, t in P.items() if t.dim() == 2]
            nodec = [t for k, t in P.items() if t.dim() != 2]
            o = torch.optim.AdamW([{"params": dec, "weight_decay": 0.1},
                                   {"params": nodec, "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
            tl = []
            for s in range(1, 6):
                for grp in o.param_groups:
                    grp["lr"] = lr_at(s, 5, 1e-3, 1e-4, 2)
                o.zero_grad()
                _, l, _, m = forward(P, cfg, docs)
                total_loss(cfg, l, m).backward()
                tl.append(float(l))
                torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
                o.step()
            print("adamw grad norms", ["%.3f" % x for x in ref["grad_norms"]], "lrs",
                  ["%.2e" % x for x in ref["lrs"]])
            ok &= compare("adamw step_losses vs torch.optim.AdamW", ref["step_losses"], tl,
                          1e-12)
            for k in P:
                ok &= compare(f"adamw {k} vs torch.optim.AdamW", ref["params"][k],
                              P[k].detach().numpy(), 1e-12, quiet=True)
            print("adamw params vs torch.optim.AdamW:", "ok" if ok else "FAIL")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("reference self-check:", "PASS" if ok else "FAIL")
    return ok


if __name__ == "__main__":
    sys.exit(0 if _self_check() else 1)
