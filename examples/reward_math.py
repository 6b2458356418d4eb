#!/usr/bin/env python3
r"""A reward command for math problems with one final answer (GSM8K, MATH-style), for
`weft rl reward.type=command`:

    weft rl model.path=MODEL data.source=train.jsonl reward.type=command \
        reward.command="python3 examples/reward_math.py" reward.processes=4

Each row of train.jsonl is {"prompt": "...", "answer": "..."} (the prompt already rendered with
the model's chat template). weft writes one JSON request per line on stdin (the row's fields plus
"response") and reads one line {"reward": x} per request, in order; this answers 1.0 when the
response's final answer equals the row's "answer", else 0.0.

The final answer is the content of the last \boxed{...} (braces balanced) if there is one, else
what follows the last "####" (GSM8K's marker), else the last number in the response. Both sides
are normalized: $ and % signs, spaces, \left/\right, \! and \, are dropped (so "25\%" is 25, as
math graders read it), "\dfrac" and "\tfrac" read as "\frac", a trailing period goes, "1,000" is
1000, and answers that are numbers (integers, decimals, fractions a/b or \frac{a}{b}) are
compared as exact fractions, so 0.5, 1/2 and \frac{1}{2} are equal. Anything else is compared as
the normalized text. Dependencies: Python's standard library alone.
"""
import json
import re
import sys
from fractions import Fraction

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text):
    """The content of the last \\boxed{...} or \\fbox{...}, braces balanced; None if none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced: no answer


def final_answer(response):
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    if "####" in response:
        return response.rsplit("####", 1)[1].strip().split("\n")[0]
    numbers = NUMBER.findall(response)
    return numbers[-1] if numbers else None


def normalize(text):
    t = text.strip()
    for drop in ("$", "\\%", "%", "\\left", "\\right", "\\!", "\\,", "\\ ", " "):
        t = t.replace(drop, "")
    t = t.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    t = t.rstrip(".")
    if re.fullmatch(r"\\text\{.*\}", t):
        t = t[6:-1]
    return t


def as_number(t):
    """The exact value of a normalized answer that is a number, else None."""
    m = re.fullmatch(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", t) or \
        re.fullmatch(r"(-?)\\frac(\d)(\d)", t)
    try:
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3)) * (-1 if m.group(1) else 1)
        elif re.fullmatch(r"-?[\d.]+/-?[\d.]+", t):
            a, b = t.split("/")
            value = Fraction(a) / Fraction(b)
        elif re.fullmatch(r"-?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?|-?\.\d+", t):
            value = Fraction(t.replace(",", ""))
        else:
            return None
    except (ValueError, ZeroDivisionError):
        return None
    return value


def reward(response, answer):
    got = final_answer(response)
    if got is None:
        return 0.0
    got, want = normalize(got), normalize(str(answer))
    a, b = as_number(got), as_number(want)
    if a is not None and b is not None:
        return float(a == b)
    return float(got == want)


def main():
    for line in sys.stdin:
        request = json.loads(line)
        if "answer" not in request:
            sys.exit(f"reward_math.py: the row has no \"answer\" field: {line[:200]}")
        print(json.dumps({"reward": reward(request["response"], request["answer"])}), flush=True)


if __name__ == "__main__":
    main()
