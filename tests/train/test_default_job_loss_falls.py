"""The built-in default job, shortened: it runs from scratch with no files, masks prompts, reports
memory, and its loss falls clearly; `weft plot` then renders its curves to a PNG."""
import json, os, shutil, struct, subprocess, sys, tempfile

from reference.runner import weft_path

WEFT = weft_path()


def main():
    tmp = tempfile.mkdtemp()
    try:
        run, stats_path = os.path.join(tmp, "run"), os.path.join(tmp, "stats.json")
        r = subprocess.run([WEFT, "train", "train.steps=60", "train.save_every=0",
                            f"train.output_dir={run}", "--stats", stats_path], capture_output=True,
                           text=True, timeout=600)
        print(r.stdout[-1500:])
        assert r.returncode == 0, r.stderr
        with open(stats_path) as f:
            memory = json.load(f)["memory"]
        assert memory["parameters"] > 0 and memory["peak_activations"] > 0, memory
        with open(os.path.join(run, "metrics.jsonl")) as f:
            rows = [json.loads(l) for l in f]
        assert [x["step"] for x in rows] == list(range(1, 61))
        first = sum(x["loss"] for x in rows[:5]) / 5
        last = sum(x["loss"] for x in rows[-5:]) / 5
        print(f"loss: first five steps {first:.3f}, last five {last:.3f}")
        # A byte-level model starts near ln(257) = 5.55; learning the format alone halves it.
        assert first > 4.5 and last < 0.5 * first, (first, last)
        assert os.path.exists(os.path.join(run, "checkpoints", "step_00000060", "model.safetensors"))

        png = os.path.join(tmp, "loss.png")
        r = subprocess.run([WEFT, "plot", os.path.join(run, "metrics.jsonl"), "-o", png],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        with open(png, "rb") as f:
            head = f.read(24)
        assert head[:8] == b"\x89PNG\r\n\x1a\n", head
        w, h = struct.unpack(">II", head[16:24])
        assert (w, h) == (1000, 640) and os.path.getsize(png) > 10000, (w, h, os.path.getsize(png))
        print(f"ok: loss {first:.3f} -> {last:.3f}; plot {w}x{h}, {os.path.getsize(png)} bytes")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
