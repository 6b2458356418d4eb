"""Running `weft generate` from the Python tests: prompt files, the command line, and reading the
output rows and statistics back; the completions as a `weft grad` batch, so the trainer's
log-probs can be compared with the rollout's; the processed distribution computed independently
(sampling.h's filters in numpy) and the chi-square test that draws are compared with it by."""

import filecmp
import json
import os
import subprocess

import numpy as np

from reference.mpi import mpirun


def write_prompts(path, prompts, **extra):
    """prompts: lists of token ids, or strings (text prompts). Each row also gets "id": its index
    and the `extra` fields."""
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            row = {"prompt": p} if isinstance(p, str) else {"input_ids": [int(x) for x in p]}
            f.write(json.dumps(dict(row, id=i, **extra)) + "\n")
    return path


def random_prompts(lengths, vocab, seed):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(0, vocab, size=n)] for n in lengths]


def generate(weft, mdir, prompts_path, out, *settings, ranks=1, timeout=300, check=True, env=None):
    """Runs weft generate (under mpirun when ranks > 1), with the environment variables `env`
    added; returns (rows, stats, process). With check, a failure raises RuntimeError carrying the
    output."""
    stats = out + ".stats.json"
    args = [weft, "generate", "--model", mdir, "--prompts", prompts_path, "--out", out,
            "--stats", stats, *settings]
    cmd = mpirun(ranks, *args) if ranks > 1 else args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, OMP_NUM_THREADS="1" if ranks > 1 else
                                os.environ.get("OMP_NUM_THREADS", "2"), **(env or {})))
    if r.returncode != 0:
        if check:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
        return None, None, r
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    with open(stats) as f:
        return rows, json.load(f), r


def generate_each_way(weft, mdir, prompts_path, tmp, name, key, *settings):
    """weft generate with the boolean setting `key` true and then false, the other settings alike:
    ({"true": output path, "false": ...}, {"true": statistics, "false": ...})."""
    outs, stats = {}, {}
    for value in ("true", "false"):
        outs[value] = os.path.join(tmp, f"{name}_{value}.jsonl")
        _, stats[value], _ = generate(weft, mdir, prompts_path, outs[value], *settings,
                                      f"{key}={value}")
    return outs, stats


def check_batchings(weft, mdir, prompts_path, ref, variants, tmp, failures, *settings):
    """weft generate with `settings` once per (name, extra settings, ranks) of `variants`: each
    output file must equal `ref` byte for byte, and a variant whose name mentions preemptions must
    have preempted. Prints a line each; appends what fails to `failures`."""
    for name, extra, ranks in variants:
        out = os.path.join(tmp, f"{name.replace(' ', '_')}.jsonl")
        _, st, _ = generate(weft, mdir, prompts_path, out, *settings, *extra, ranks=ranks)
        same = filecmp.cmp(ref, out, shallow=False)
        print(f"{name}: {'byte-identical' if same else 'DIFFERS'}; {st['preemptions']:.0f} "
              f"preemptions, KV blocks peak {st['kv']['peak_used']}")
        if not same:
            failures.append(f"{name}: the output differs from all-at-once's")
        if "preemptions" in name and st["preemptions"] < 1:
            failures.append(f"{name}: the small pool forced no preemption")


def completions_batch(rows, path):
    """Each sample as a document of prompt + completion, the completion's tokens the targets;
    returns [(prompt length, response)] in the file's order."""
    docs = []
    with open(path, "w") as f:
        for row in rows:
            for resp in row["responses"]:
                ids = row["input_ids"] + resp["token_ids"]
                mask = [0] * len(row["input_ids"]) + [1] * len(resp["token_ids"])
                f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
                docs.append((len(row["input_ids"]), resp))
    return docs


def trainer_logprobs(docs, logprobs):
    """The trainer's log-probs (weft grad --logprobs, batch order) of each completion's tokens."""
    out, at = [], 0
    for prompt_len, resp in docs:
        n = len(resp["token_ids"])
        out.append(np.asarray(logprobs[at + prompt_len:at + prompt_len + n], dtype=np.float32))
        at += prompt_len + n
    return out


def write_tokenizer(dirname, vocab_size=320):
    """A small byte-level BPE tokenizer.json (GPT-2 style, "<|endoftext|>" its end of text) in
    dirname, trained with Hugging Face `tokenizers`; returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    text = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
            "to be or not to be, that is the question", "2 + 3 = 5 and 7 * 6 = 42"] * 20
    tok.train_from_iterator(text, trainer)
    tok.save(os.path.join(dirname, "tokenizer.json"))
    return tok


def processed(z, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The processed distribution of logits z (float64), as sampling.h states it."""
    p = np.exp((z - z.max()) / temperature)
    p /= p.sum()
    order = sorted(range(len(z)), key=lambda i: (-p[i], i))  # ties: lower id first
    keep = np.ones(len(z), dtype=bool)
    if 0 < top_k < len(z):
        keep[order[top_k:]] = False
    q = np.where(keep, p, 0.0) / p[keep].sum()
    if top_p < 1.0:
        total, kept = 0.0, []
        for i in order:
            if not keep[i]:
                continue
            kept.append(i)
            total += q[i]
            if total >= top_p:
                break
        keep[:] = False
        keep[kept] = True
        q = np.where(keep, q, 0.0) / q[keep].sum()
    if min_p > 0.0:
        keep &= q >= min_p * q.max()
        q = np.where(keep, q, 0.0) / q[keep].sum()
    return q


def chi_square(counts, expected_p):
    """(statistic, degrees of freedom, p-value, draws outside the support). Cells expecting fewer
    than 5 draws are pooled into one."""
    import torch  # only here: the regularized gamma function for the p-value
    outside = int(counts[expected_p == 0].sum())
    expected = expected_p * counts.sum()
    big, small = expected >= 5, (expected < 5) & (expected_p > 0)
    obs = np.append(counts[big], counts[small].sum()) if small.any() else counts[big]
    exp = np.append(expected[big], expected[small].sum()) if small.any() else expected[big]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(exp) - 1
    pval = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, pval, outside
