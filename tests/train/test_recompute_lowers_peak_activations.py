"""Activation recomputation lowers the activation peak and changes nothing else.

weft grad with train.recompute=false and =true on a 4-layer model (hidden 64, intermediate 160)
and 6 packed documents (231 tokens), with 2 optimizer steps so the optimizer state exists. From
the statistics' memory (parameters, gradients, optimizer_state, peak_activations bytes):
parameters, gradients and optimizer_state are equal and peak_activations is strictly lower with
recomputation. loss, every grad.*, step_losses and every param.* are identical bit for bit.
"""

import os
import sys

from reference import fixtures, qwen2, runner
from reference.compare import identical

CFG = dict(qwen2.SMALL_CFG, num_hidden_layers=4, tie_word_embeddings=False)
LENGTHS = [40, 1, 2, 71, 64, 53]
PROMPTS = [5, 1, 1, 10, 8, 3]


def cases(weft, tmp):
    failures = []
    mdir = os.path.join(tmp, "model")
    cfg, params, bpath, _ = fixtures.model_and_batch(mdir, CFG, 31, LENGTHS, PROMPTS, 131)
    n_params = sum(v.size for v in params.values())
    print(f"model: {cfg['num_hidden_layers']} layers, {n_params} parameters "
          f"({4 * n_params} bytes in fp32); batch of {sum(LENGTHS)} tokens")
    outs, mems = {}, {}
    for rc in ("false", "true"):
        args = fixtures.grad_args(mdir, bpath, f"train.recompute={rc}", f"{runner.STEPS_KEY}=2")
        out, stats = fixtures.try_grad(weft, args, f"recompute={rc}", failures)
        if out is None:
            continue
        mem = stats.get("memory")
        print(f"recompute={rc}: {mem}")
        if mem is None:
            print(f"FAIL no memory in the statistics:\n{stats}")
            failures.append(f"recompute={rc}: no memory in the statistics")
            continue
        outs[rc], mems[rc] = out, mem
    if len(mems) == 2:
        off, on = mems["false"], mems["true"]
        for key in ("parameters", "gradients", "optimizer_state"):
            if off[key] != on[key]:
                failures.append(f"{key} differs: recompute off {off[key]}, on {on[key]}")
        print(f"peak_activations: off {off['peak_activations']}, on {on['peak_activations']}"
              f" (ratio {on['peak_activations'] / max(1, off['peak_activations']):.3f})")
        if not on["peak_activations"] < off["peak_activations"]:
            failures.append(f"peak_activations not lower with recompute: off "
                            f"{off['peak_activations']}, on {on['peak_activations']}")
    if len(outs) == 2:
        a, b = outs["false"], outs["true"]
        names = sorted(set(a) | set(b))
        checked = 0
        for n in names:
            if n == "loss" or n == "step_losses" or n.startswith(("grad.", "param.")):
                checked += 1
                if not identical(n, b.get(n), a.get(n)):
                    failures.append(f"{n} differs between recompute off and on")
        for n in ["loss", "step_losses"] + ["grad." + k for k in params] + [
                "param." + k for k in params]:
            if n not in a:
                failures.append(f"{n} missing from weft's output")
        print(f"compared {checked} tensors bit for bit")
    return failures


def main():
    return fixtures.run_test(cases, "weft_test_recompute_", "problems")


if __name__ == "__main__":
    sys.exit(main())
