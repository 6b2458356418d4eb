"""Speculative decoding with the MTP modules draws from the policy's own distribution.

A random Qwen2 with 16 tokens and two MTP modules whose drafts q differ much from the main model's
p (depth-1 acceptance about 0.4 at temperature 1), one 6-token prompt, 20,000 samples of 3 new
tokens. Drafting starts at the first new token: token 1 comes from the prefill, tokens 2 (and 3
with two drafts) are drafted then and verified in the next step, so the first tokens' joint
distribution goes through the acceptance test (accept x with probability min(1, p(x)/q(x)), else
draw from max(0, p - q) normalized, a bonus token when all pass).

  - rollout.speculative_tokens=1, temperature 1: x2 is an accepted draft or a residual draw, x3
    the bonus token after an accepted x2, or a draft verified a step later.
  - rollout.speculative_tokens=2, temperature 1 with top-p 0.8: x3 is also a depth-2 draft.

For both, the (x1, x2) counts pass a chi-square test against p(x1) p(x2 | x1), and the (x2, x3)
counts against sum_x1 p(x1) p(x2 | x1) p(x3 | x1, x2). The distributions are computed here,
independently: the PyTorch reference's main and MTP logits (float64) for every continuation of the
prompt, processed in numpy as sampling.h states it (reference.generation.processed); cells under 5
expected draws are pooled, p above 1e-3 passes, and no draw may fall outside the kept set. The
recorded log-probs (base and processed) of every token, drafted or not, are the reference's within
1e-5, and the statistics' draft counts (offered at depth 1, accepted at each depth) are the ones
expected from sum_x min(p(x), q(x)) over the draws' paths, within 5 standard errors.

Control: the same runs with WEFT_TEST_SKIP_SPECULATIVE_ACCEPT_TEST=0:* (every draft accepted
without the test, a deliberately biased rule) must fail the same chi-square test, and must pass
it against what that rule draws, the drafts' own joint distribution p(x1) q1(x2 | x1)
[q2(x3 | x1, x2)]: the draft heads read h_{j-1} and Emb(token t+j) as in training.
"""
import os
import sys

import numpy as np

from reference import files, fixtures, qwen2
from reference.generation import chi_square, generate, processed, random_prompts, write_prompts

N, P_MIN, SE = 20000, 1e-3, 5.0
CFG = dict(qwen2.SMALL_CFG, vocab_size=16, hidden_size=32, intermediate_size=64,
           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
           num_nextn_predict_layers=2)
SETTINGS = [(1, dict(temperature=1.0)), (2, dict(temperature=1.0, top_p=0.8))]
NEW_TOKENS = 3
CONTROL = {"WEFT_TEST_SKIP_SPECULATIVE_ACCEPT_TEST": "0:*"}  # every draft accepted


def log_softmax(z):
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


class Reference:
    """The policy's and the drafts' distributions after the prompt, for every x1 and (x1, x2): p1
    (V), p2 and q1 (V, V): token 2 and its depth-1 draft given x1; p3, q2 and r1 (V, V, V): token 3,
    its depth-2 draft given x1 and the draft x2, and its depth-1 draft made a step later (after x2
    was drawn in a verification); base_* the same unprocessed, as log-probs."""

    def __init__(self, params, prompt, setting):
        V, P = CFG["vocab_size"], len(prompt)
        pr = lambda z: processed(z, **setting)
        self.p1, self.p2, self.q1 = None, np.zeros((V, V)), np.zeros((V, V))
        self.p3, self.q2, self.r1 = (np.zeros((V, V, V)) for _ in range(3))
        self.base1, self.base2, self.base3 = None, np.zeros((V, V)), np.zeros((V, V, V))

        def logits(ids):
            main, depths = qwen2.document_logits(params, CFG, ids)
            return main.numpy(), [d.numpy() for d in depths]

        for x1 in range(V):
            main, (d1, _) = logits(prompt + [x1])
            if x1 == 0:
                self.p1, self.base1 = pr(main[P - 1]), log_softmax(main[P - 1])
            self.p2[x1], self.q1[x1] = pr(main[P]), pr(d1[P - 1])
            self.base2[x1] = log_softmax(main[P])
            for x2 in range(V):
                main, (d1, d2) = logits(prompt + [x1, x2])
                self.p3[x1, x2], self.base3[x1, x2] = pr(main[P + 1]), log_softmax(main[P + 1])
                self.q2[x1, x2], self.r1[x1, x2] = pr(d2[P - 1]), pr(d1[P])

    def joints(self, k, accept_all=False):
        """The expected (x1, x2) and (x2, x3) distributions of k drafts per step: the policy's, or
        with every draft accepted (the control's rule: x2 from q1, and x3 from q2 with k = 2)."""
        p2 = self.q1 if accept_all else self.p2
        p3 = self.q2 if accept_all and k == 2 else self.p3
        j12 = self.p1[:, None] * p2
        j23 = (j12[:, :, None] * p3).sum(axis=0)
        return j12, j23

    def acceptance(self, k):
        """Per sample, with 3 new tokens: the expected accepted drafts at depths 1..k, and the
        expected drafts offered at depth 1. After x1, k drafts are offered; when the depth-1 draft
        fails, x2 is a residual draw and x3's draft (module 1 reading x2) is offered a step later;
        when it passes, x3 is the bonus token (k = 1) or the depth-2 draft's outcome (k = 2)."""
        m1 = np.minimum(self.p2, self.q1).sum(axis=1)  # (x1,) the depth-1 draft passes
        b1 = np.minimum(self.p3, self.r1).sum(axis=2)  # (x1, x2) the next step's draft passes
        accepted = [float(self.p1 @ (m1 + (np.maximum(self.p2 - self.q1, 0) * b1).sum(axis=1)))]
        if k == 2:
            a2 = np.minimum(self.p3, self.q2).sum(axis=2)  # (x1, x2) the depth-2 draft passes
            accepted.append(float(self.p1 @ (np.minimum(self.p2, self.q1) * a2).sum(axis=1)))
        return accepted, float(self.p1 @ (2 - m1))


def draws(weft, mdir, prompts, tmp, name, k, setting, control=False):
    """(tokens (N, NEW_TOKENS), base log-probs, processed log-probs, the speculative statistics);
    the control's run (every draft accepted) gives its tokens only: its processed log-probs may be
    log 0."""
    keys = [f"sampling.{key}={v}" for key, v in setting.items()]
    if not control:
        keys.append("sampling.processed_logprobs=true")
    rows, stats, _ = generate(weft, mdir, prompts, os.path.join(tmp, f"{name}.jsonl"), *keys,
                              f"sampling.n={N}", f"sampling.max_tokens={NEW_TOKENS}",
                              "sampling.seed=5", "sampling.stop_token_ids=[]",
                              f"rollout.speculative_tokens={k}", env=CONTROL if control else None)
    responses = rows[0]["responses"]
    if any(len(r["token_ids"]) != NEW_TOKENS for r in responses):
        raise RuntimeError(f"{name}: a sample has not {NEW_TOKENS} tokens")
    tokens = np.array([r["token_ids"] for r in responses], dtype=np.int64)
    if control:
        return tokens
    get = lambda key: np.array([r[key] for r in responses], dtype=np.float64)
    return tokens, get("logprobs"), get("processed_logprobs"), stats["speculative"]


def pair_tests(tag, tokens, expected, V):
    """Chi-square of the (x1, x2) and (x2, x3) counts against `expected` (two (V, V) arrays);
    returns [(label, p, draws outside the support)]."""
    out = []
    for label, (a, b), want in (("(x1, x2)", (0, 1), expected[0]),
                                ("(x2, x3)", (1, 2), expected[1])):
        counts = np.bincount(tokens[:, a] * V + tokens[:, b], minlength=V * V)
        stat, df, pval, outside = chi_square(counts, want.ravel())
        print(f"  {tag} {label}: chi-square {stat:8.2f} df {df:3d} p {pval:.3g}, "
              f"{outside} outside the support")
        out.append((label, pval, outside))
    return out


def cases(weft, tmp):
    failures = []
    # OpenMP threads that sleep while they wait: speculation runs many small forwards, and two
    # threads spinning at each barrier of a tiny model on a busy 2-core machine (ctest -j 2) made
    # this test up to 10 times slower. Results do not depend on it.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    mdir = os.path.join(tmp, "model")
    _, weights = files.make_model(mdir, CFG, 3, std=0.2)
    params = qwen2.to_torch(weights)
    V = CFG["vocab_size"]
    prompt = random_prompts([6], V, 1)[0]
    prompts = write_prompts(os.path.join(tmp, "prompt.jsonl"), [prompt])
    for k, setting in SETTINGS:
        name = f"k={k}, " + ", ".join(f"{key} {v}" for key, v in setting.items())
        ref = Reference(params, prompt, setting)
        tokens, lp, plp, spec = draws(weft, mdir, prompts, tmp, f"k{k}", k, setting)
        print(f"{name}: acceptance {[round(a, 3) for a in spec['acceptance']]} (drafted "
              f"{spec['drafted']}, accepted {spec['accepted']})")
        for label, pval, outside in pair_tests("speculative", tokens, ref.joints(k), V):
            if pval < P_MIN or outside:
                failures.append(f"{name} {label}: p {pval:.3g}, {outside} draws outside the "
                                f"kept set")
        # Log-probs of every token, drafted or not: base (temperature 1, unfiltered) and processed.
        x1, x2, x3 = tokens.T
        base = np.stack([ref.base1[x1], ref.base2[x1, x2], ref.base3[x1, x2, x3]], axis=1)
        proc = np.stack([ref.p1[x1], ref.p2[x1, x2], ref.p3[x1, x2, x3]], axis=1)
        lp_err = float(np.abs(lp - base).max())
        plp_err = float(np.abs(plp - np.log(proc + 1e-300)).max())
        print(f"  |log-prob err| {lp_err:.2g}, processed {plp_err:.2g}")
        if lp_err > 1e-5 or plp_err > 1e-5:
            failures.append(f"{name}: log-probs off by {lp_err:.2g} (base), {plp_err:.2g} "
                            f"(processed)")
        # The statistics: drafts offered at depth 1 (a second time after a rejection) and
        # accepted at each depth, against their expectations (each a sum of N Bernoulli draws).
        want, offered1 = ref.acceptance(k)
        counts = [("offered at depth 1", spec["drafted"][0], offered1 - 1, 1)]
        counts += [(f"accepted at depth {d + 1}", spec["accepted"][d], want[d], 0)
                   for d in range(k)]
        if k == 2:
            counts.append(("offered at depth 2", spec["drafted"][1], 1.0, 0))
        for label, got, m, base_count in counts:
            expect, sd = N * (base_count + m), np.sqrt(N * m * (1 - m))
            print(f"  drafts {label}: {got}, expected {expect:.0f} +- {sd:.0f}")
            if abs(got - expect) > SE * sd + 0.5:
                failures.append(f"{name}: {got} drafts {label}, expected {expect:.0f} +- {sd:.0f}")
        if not 0.1 < spec["acceptance"][0] < 0.9:
            failures.append(f"{name}: acceptance {spec['acceptance'][0]:.3f}: the fixture should "
                            f"reject and accept often")

        tokens = draws(weft, mdir, prompts, tmp, f"k{k}_control", k, setting, control=True)
        for label, pval, outside in pair_tests("control vs policy", tokens, ref.joints(k), V):
            if pval >= P_MIN and not outside:
                failures.append(f"control {name} {label}: accepting every draft passed the test "
                                f"(p {pval:.3g}): it cannot tell the distributions apart")
        for label, pval, outside in pair_tests("control vs drafts", tokens,
                                                ref.joints(k, accept_all=True), V):
            if pval < P_MIN or outside:
                failures.append(f"control {name} {label}: accepting every draft does not draw "
                                f"the drafts' distribution (p {pval:.3g}, {outside} outside)")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_speculative_distribution_", "checks failed"))
