"""`weft generate` draws a small model's next token from the exact processed distribution.

One 12-token prompt, 20,000 samples of one new token each, for six settings of temperature, top-k,
top-p and min-p alone and together. The expected distribution is computed here, independently:
the next-token logits of the PyTorch reference forward (float64) on the model's weights, then the
processing in numpy as sampling.h states it (temperature, softmax, top-k, top-p with the crossing
token, min-p, each renormalized, Hugging Face's order). Counts pass a chi-square test (cells
under 5 expected pooled; p above 1e-3) and no draw falls outside the kept set. Controls: the
draws of top-p 0.8 against top-p 0.7's distribution, and temperature 1's against 0.9's, must fail.
Each sample's recorded log-prob is the base model's (temperature 1, unfiltered) and its processed
log-prob the processed distribution's, both within 1e-5 of the reference.
"""
import os
import sys

import numpy as np

from reference import files, fixtures, qwen2
from reference.generation import (chi_square, generate, processed, random_prompts,
                                  write_prompts)

N, P_MIN = 20000, 1e-3
SETTINGS = [dict(temperature=1.0), dict(temperature=0.7), dict(top_k=10),
            dict(temperature=1.2, top_p=0.8), dict(min_p=0.1),
            dict(temperature=1.3, top_k=20, top_p=0.9, min_p=0.05)]
CONTROLS = [("top_p 0.8 drawn, 0.7 expected", dict(temperature=1.2, top_p=0.8),
             dict(temperature=1.2, top_p=0.7)),
            ("temperature 1 drawn, 0.9 expected", dict(temperature=1.0), dict(temperature=0.9))]


def draws(weft, mdir, prompts, tmp, name, setting):
    keys = [f"sampling.{k}={v}" for k, v in setting.items()]
    rows, _, _ = generate(weft, mdir, prompts, os.path.join(tmp, f"{name}.jsonl"), *keys,
                          f"sampling.n={N}", "sampling.max_tokens=1", "sampling.seed=5",
                          "sampling.stop_token_ids=[]", "sampling.processed_logprobs=true")
    responses = rows[0]["responses"]
    tokens = np.array([r["token_ids"][0] for r in responses])
    logprobs = np.array([r["logprobs"][0] for r in responses])
    processed_lp = np.array([r["processed_logprobs"][0] for r in responses])
    return tokens, logprobs, processed_lp


def cases(weft, tmp):
    failures = []
    cfg = qwen2.SMALL_CFG
    mdir = os.path.join(tmp, "model")
    files.make_model(mdir, cfg, 3, std=0.15)
    prompt = random_prompts([12], cfg["vocab_size"], 1)[0]
    prompts = write_prompts(os.path.join(tmp, "prompt.jsonl"), [prompt])
    params = qwen2.to_torch(files.read_safetensors(os.path.join(mdir, "model.safetensors")))
    doc = {"input_ids": prompt, "loss_mask": [0] + [1] * (len(prompt) - 1)}
    z = qwen2.forward(params, cfg, [doc])[0][-1].numpy()
    base = z - z.max() - np.log(np.exp(z - z.max()).sum())
    V = cfg["vocab_size"]
    for i, s in enumerate(SETTINGS):
        name = ", ".join(f"{k} {v}" for k, v in s.items())
        tokens, lp, plp = draws(weft, mdir, prompts, tmp, f"s{i}", s)
        q = processed(z, **s)
        stat, df, pval, outside = chi_square(np.bincount(tokens, minlength=V), q)
        lp_err = float(np.abs(lp - base[tokens]).max())
        plp_err = float(np.abs(plp - np.log(q[tokens] + 1e-300)).max())
        print(f"{name:48s} kept {int((q > 0).sum()):2d}: chi-square {stat:7.2f} df {df:2d} "
              f"p {pval:.3g}, {outside} outside; |logprob err| {lp_err:.2g}, "
              f"processed {plp_err:.2g}")
        if pval < P_MIN or outside:
            failures.append(f"{name}: p {pval:.3g}, {outside} draws outside the kept set")
        if lp_err > 1e-5 or plp_err > 1e-5:
            failures.append(f"{name}: log-probs off by {lp_err:.2g} (base), "
                            f"{plp_err:.2g} (processed)")
    for name, drawn, expected in CONTROLS:
        tokens, _, _ = draws(weft, mdir, prompts, tmp, "control", drawn)
        counts = np.bincount(tokens, minlength=V)
        stat, df, pval, outside = chi_square(counts, processed(z, **expected))
        print(f"control: {name:39s} chi-square {stat:7.2f} df {df:2d} p {pval:.3g}, "
              f"{outside} outside")
        if pval >= P_MIN and not outside:
            failures.append(f"control {name}: the test did not tell the distributions apart")
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(cases, "weft_test_generate_distribution_", "checks failed"))
