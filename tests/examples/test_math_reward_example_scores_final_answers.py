"""examples/reward_math.py, the example reward command for math answers, scores the final answer
it documents (the last \\boxed{}, else GSM8K's "####", else the last number; numbers compared as
exact fractions), speaks weft's reward protocol (several requests in one write: one answer line
each, in order; a row without "answer": an error and a non-zero exit), and runs as
`weft rl reward.type=command` with reward.processes=2 (metrics written, every reward 0 or 1).
"""
import importlib.util
import json
import os
import subprocess
import sys

from reference import fixtures
from reference import rl_loop as rl

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "examples", "reward_math.py")

# (response, answer, reward)
CASES = [
    ("Tom has 3 + 15 = 18 apples.\n#### 18", "18", 1.0),
    ("The farm sold 1000 eggs.\n#### 1,000", "1000", 1.0),
    ("So the probability is $\\boxed{\\frac{1}{2}}$.", "0.5", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0),
    ("\\boxed{\\frac34}", "0.75", 1.0),
    ("We get \\boxed{x^{2} + 1}.", "x^{2}+1", 1.0),
    ("First 12, then \\boxed{7}, then 9", "7", 1.0),
    ("I think 12, no wait, it is 13.", "13", 1.0),
    ("I think 13, no wait, it is 12.", "13", 0.0),
    ("The discount is \\boxed{25\\%}", "25", 1.0),
    ("The answer is $-3$.", "-3", 1.0),
    ("about 0.50 of them", "1/2", 1.0),
    ("There is no number here.", "5", 0.0),
    ("\\boxed{\\text{Monday}}", "Monday", 1.0),
    ("#### 17", "71", 0.0),
]


def unit_cases(failures):
    spec = importlib.util.spec_from_file_location("reward_math", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    wrong = [(r, a, want, example.reward(r, a)) for r, a, want in CASES
             if example.reward(r, a) != want]
    print(f"{len(CASES) - len(wrong)} of {len(CASES)} answers scored as documented")
    failures += [f"reward({r!r}, {a!r}) = {got}, expected {want}" for r, a, want, got in wrong]


def protocol(failures):
    lines = "".join(json.dumps({"prompt": "p", "answer": a, "response": r}) + "\n"
                    for r, a, _ in CASES)
    p = subprocess.run([sys.executable, EXAMPLE], input=lines, capture_output=True, text=True,
                       timeout=60)
    got = [json.loads(l)["reward"] for l in p.stdout.splitlines()]
    if p.returncode != 0 or got != [want for _, _, want in CASES]:
        failures.append(f"all requests in one write: exit {p.returncode}, answers {got}")
    p = subprocess.run([sys.executable, EXAMPLE], input='{"prompt": "p", "response": "1"}\n',
                       capture_output=True, text=True, timeout=60)
    if p.returncode == 0 or "answer" not in p.stderr:
        failures.append(f"a row without an answer: exit {p.returncode}, stderr {p.stderr!r}")
    print(f"protocol: {len(got)} answers in order; a row without an answer: exit {p.returncode}")


def with_weft(weft, tmp, failures):
    mdir, prompts, _ = rl.learning_setup(tmp)
    out = os.path.join(tmp, "out")
    rl.run_rl(weft, rl.rl_args(mdir, prompts, out, "reward.type=command", "reward.processes=2",
                               f"reward.command={sys.executable} {EXAMPLE}",
                               "rl.save_rollouts=true"))
    rewards = [s["reward"] for step in rl.metrics(out) for s in rl.rollouts(out, step)]
    if not rewards or any(r not in (0.0, 1.0) for r in rewards):
        failures.append(f"weft rl with the example: rewards {rewards}")
    print(f"weft rl with the example, reward.processes=2: {len(rewards)} rewards, "
          f"{sum(rewards):.0f} of them 1")


def body(weft, tmp):
    failures = []
    unit_cases(failures)
    protocol(failures)
    with_weft(weft, tmp, failures)
    return failures


if __name__ == "__main__":
    sys.exit(fixtures.run_test(body, "weft_test_reward_example_", "example reward checks failed"))
