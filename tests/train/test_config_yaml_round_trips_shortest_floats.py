"""A run's config.yaml writes every real setting as the shortest text that reads back as the same
double (optim.lr: 0.003, not 0.0030000000000000001), and loading it with --config gives a job
that saves the same config.yaml again (issue 23, item 8)."""
import os, re, shutil, subprocess, sys, tempfile

from reference.runner import weft_path

WEFT = weft_path()
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "data.synthetic_documents=16",
        "train.global_batch_size=4", "train.steps=1"]


def train(*args):
    r = subprocess.run([WEFT, "train", *args], capture_output=True, text=True, timeout=120)
    if r.returncode:
        sys.exit(f"weft train failed:\n{r.stderr}")


def main():
    tmp = tempfile.mkdtemp()
    try:
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        train(*TINY, "optim.lr=0.003", "optim.weight_decay=0.1", "optim.eps=1e-8",
              f"train.output_dir={a}")
        text = open(os.path.join(a, "config.yaml")).read()
        for want in ("optim.lr: 0.003\n", "optim.weight_decay: 0.1\n", "optim.eps: 1e-08\n"):
            assert want in text, f"config.yaml lacks {want!r}:\n{text}"
        for key, value in re.findall(r"^([\w.]+): (-?[0-9][0-9.e+-]*)$", text, re.M):
            if any(c in value for c in ".e"):
                x = float(value)
                shortest = next(s for s in (f"{x:.{p}g}" for p in range(1, 18)) if float(s) == x)
                assert len(value) <= len(shortest), f"{key}: {value} (shortest: {shortest})"
        train("--config", os.path.join(a, "config.yaml"), f"train.output_dir={b}")
        again = open(os.path.join(b, "config.yaml")).read()
        assert again == text.replace(a, b), "config.yaml did not round-trip"
        print("config.yaml: shortest round-trip floats; loads back to the same file")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
