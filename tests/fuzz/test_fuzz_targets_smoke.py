"""Every libFuzzer target (tests/fuzz/fuzz_*.c) builds and runs a few seconds over its seed
corpus without a crash, a leak on an accepted input or a UB report, so the harnesses keep building
and the corpora keep passing. Needs clang (skipped, exit 77, without it); `make fuzz` runs the
same targets for minutes each."""
import os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    weft = sys.argv[sys.argv.index("--weft") + 1] if "--weft" in sys.argv else "build/weft"
    build = os.path.join(os.path.dirname(os.path.abspath(weft)), "fuzz-smoke")
    r = subprocess.run(["bash", os.path.join(HERE, "run.sh"), build, "2"], capture_output=True,
                       text=True, timeout=600)
    print(r.stdout + r.stderr)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
