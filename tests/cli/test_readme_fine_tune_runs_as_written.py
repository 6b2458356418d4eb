"""The README's "Using it" fine-tuning block runs exactly as written (issue 23, acceptance): make a
Hugging Face model directory, train it, resume the run, generate from its last checkpoint, plot
the metrics. The block is read from README.md itself, run line by line by bash in a scratch
directory holding the repository's scripts/ and examples/ and this build as ./build; then:
- every command exits 0;
- the run's metrics.jsonl holds steps 1-40 once each (30, then 10 more by resume), in one run
  directory with its checkpoints at 30 and 40;
- generated.jsonl has a decoded response per prompt (the model's tokenizer travelled with the
  checkpoint);
- the plot is a PNG;
- the checkpoint loads in transformers as model and tokenizer."""
import json, os, re, shutil, subprocess, sys, tempfile

from reference.runner import weft_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = "Fine-tuning a Hugging Face model directory, end to end"


def readme_block():
    """The first indented code block after MARK, as its command lines."""
    text = open(os.path.join(ROOT, "README.md")).read()
    after = text[text.index(MARK):].split("\n")
    lines, started = [], False
    for line in after[1:]:
        if line.startswith("    "):
            started = True
            lines.append(line[4:])
        elif started:
            break
    return lines


def main():
    weft = weft_path()
    block = readme_block()
    assert len(block) >= 5 and all(re.match(r"(python3|\./build/weft) ", l) for l in block), block
    tmp = tempfile.mkdtemp(prefix="weft_readme_")
    try:
        os.symlink(os.path.dirname(weft), os.path.join(tmp, "build"))
        for d in ("scripts", "examples"):
            os.symlink(os.path.join(ROOT, d), os.path.join(tmp, d))
        # A fresh Debian's python3 is the one the set-up installs transformers for.
        env = dict(os.environ, PATH="/usr/bin:" + os.environ.get("PATH", ""),
                   OMP_WAIT_POLICY="passive")
        for line in block:
            print("$", line, flush=True)
            r = subprocess.run(["bash", "-c", line], cwd=tmp, env=env, capture_output=True,
                               text=True, timeout=600)
            print(r.stdout[-600:], end="")
            if r.returncode:
                sys.exit(f"FAIL: exit {r.returncode}: {line}\n{r.stderr}")

        run = os.path.join(tmp, "runs", "tiny")
        with open(os.path.join(run, "metrics.jsonl")) as f:
            steps = [json.loads(l)["step"] for l in f]
        assert steps == list(range(1, 41)), steps
        ckpts = sorted(os.listdir(os.path.join(run, "checkpoints")))
        assert ckpts == ["step_00000030", "step_00000040"], ckpts
        with open(os.path.join(run, "generated.jsonl")) as f:
            rows = [json.loads(l) for l in f]
        assert len(rows) == 4 and all(isinstance(r["responses"][0].get("text"), str) for r in rows), rows
        with open(os.path.join(run, "loss.png"), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", "loss.png is not a PNG"
        from transformers import AutoModelForCausalLM, AutoTokenizer
        ckpt = os.path.join(run, "checkpoints", "step_00000040")
        AutoModelForCausalLM.from_pretrained(ckpt)
        tok = AutoTokenizer.from_pretrained(ckpt)
        print(f"checkpoint loads in transformers; eos {tok.eos_token!r}; first response "
              f"{rows[0]['responses'][0]['text']!r}")
        print("PASS")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
