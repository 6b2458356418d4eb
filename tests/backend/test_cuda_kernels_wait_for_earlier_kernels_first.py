#!/usr/bin/env python3
"""Every CUDA kernel of weft begins with wait_for_earlier_kernels().

On sm_90 and newer the CUDA backend launches its kernels early (programmatic dependent launch,
kernels.h's weft_cuda_queue): a kernel's blocks may be resident while the kernel before it still
runs, and only griddepcontrol.wait, in common.cuh's wait_for_earlier_kernels, keeps them from
reading what that kernel has not yet written. A kernel without it would race on the GPU, and
neither the CPU emulation nor a GPU run would reliably show it. So this test reads every kernel
definition under src/backend/cuda and fails, naming the kernel, where the body's first statement
is anything else. (Its overload with common.cuh's fixed_rows first asks L2 for weights no kernel
of a forward writes: a prefetch reads nothing into the kernel, so it may come first.)

    python3 tests/backend/test_cuda_kernels_wait_for_earlier_kernels_first.py [--weft IGNORED]
"""

import argparse
import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.join(HERE, "..", "..", "src", "backend", "cuda")
# Plain, or with the weights (common.cuh's fixed_rows) it asks L2 for before the wait: a prefetch
# reads nothing into the kernel.
FIRST = "wait_for_earlier_kernels("


def strip_comments(text):
    """The source with // and /* */ comments blanked (same length, newlines kept)."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"//[^\n]*|/\*.*?\*/", blank, text, flags=re.S)


def kernels(text):
    """(name, first statement) of each __global__ function defined in the text."""
    found = []
    for m in re.finditer(r"\b__global__\b", text):
        depth, i = 0, m.end()
        while i < len(text):  # the body's brace: the first '{' outside the parentheses
            c = text[i]
            depth += c == "("
            depth -= c == ")"
            if depth == 0 and c in "{;":
                break
            i += 1
        if i == len(text) or text[i] == ";":
            continue  # a declaration
        head = text[m.end():i]
        name = re.findall(r"(\w+)\s*\(", re.sub(r"__launch_bounds__\s*\([^)]*\)", "", head))
        body = text[i + 1:]
        first = body.lstrip().split("\n", 1)[0].strip()
        found.append((name[0] if name else "?", first))
    return found


def main():
    argparse.ArgumentParser(description=__doc__).add_argument("--weft")
    files = sorted(glob.glob(os.path.join(SOURCES, "*.cu")) +
                   glob.glob(os.path.join(SOURCES, "*.cuh")))
    checked, wrong = 0, []
    for path in files:
        with open(path) as f:
            for name, first in kernels(strip_comments(f.read())):
                checked += 1
                if not first.startswith(FIRST):
                    wrong.append(f"{os.path.relpath(path, os.path.join(HERE, '..', '..'))}: "
                                 f"kernel {name} begins with {first!r}")
    print(f"{checked} kernels in {len(files)} files; {len(wrong)} do not begin with {FIRST}")
    for w in wrong:
        print("  " + w)
    if checked < 30:  # the sources hold 36 today: a parse that finds few is the test's own bug
        print(f"only {checked} kernels found: the parse is broken")
        return 1
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
