"""Bad input: each case ends with one "weft: error:" line naming the input, a non-zero exit, and
nothing overwritten."""
import hashlib, json, os, shutil, subprocess, sys, tempfile

from reference import fixtures
from reference.files import make_model
from reference.runner import weft_path

WEFT = weft_path()
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "train.global_batch_size=4",
        "train.steps=2", "data.synthetic_documents=16"]
failures = []


def snapshot(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[p] = hashlib.sha256(fh.read()).hexdigest()
    return out


def expect_error(name, args, must_contain, watch):
    before = snapshot(watch)
    problem = fixtures.one_clear_error(name, [WEFT, *args], must_contain,
                                       lambda: snapshot(watch) != before)
    if problem:
        failures.append(problem)


def main():
    tmp = tempfile.mkdtemp()
    try:
        run = os.path.join(tmp, "run")
        r = subprocess.run([WEFT, "train", *TINY, f"train.output_dir={run}"], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr

        bad_yaml = os.path.join(tmp, "bad.yaml")
        with open(bad_yaml, "w") as f:
            f.write("train:\n  steps: 3\n   global_batch_size: [1, 2\n")
        expect_error("malformed YAML", ["train", "--config", bad_yaml, f"train.output_dir={run}"],
                     [bad_yaml, "YAML"], tmp)

        bad_jsonl = os.path.join(tmp, "bad.jsonl")
        with open(bad_jsonl, "w") as f:
            f.write('{"text": "fine"}\n{"prompt": "a", "response": "b"}\n{"text": "broken"\n')
        expect_error("malformed JSONL line", ["train", *TINY, f"data.source={bad_jsonl}",
                                              f"train.output_dir={run}"], [f"{bad_jsonl}:3:"], tmp)

        expect_error("unknown config key", ["train", "train.stpes=3", f"train.output_dir={run}"],
                     ['"train.stpes"', '"train.steps"'], tmp)

        long_jsonl = os.path.join(tmp, "long.jsonl")
        with open(long_jsonl, "w") as f:
            f.write(json.dumps({"text": "x" * 300}) + "\n")
        expect_error("document over budget", ["train", *TINY, f"data.source={long_jsonl}",
                                              "train.max_tokens_per_microbatch=128",
                                              f"train.output_dir={run}"],
                     [long_jsonl, "train.max_tokens_per_microbatch", "data.truncate"], tmp)

        fresh = os.path.join(tmp, "never_created")
        expect_error("context-parallel size that does not divide the ranks",
                     ["train", *TINY, "parallel.context_parallel_size=2",
                      f"train.output_dir={fresh}"],
                     ["parallel.context_parallel_size=2", "1 rank"], tmp)
        if os.path.exists(fresh):
            failures.append("context-parallel size error: the output directory was created")

        other = [a for a in TINY if not a.startswith("model.hidden_size")] + ["model.hidden_size=64"]
        expect_error("checkpoint of another model shape",
                     ["train", *other, f"train.output_dir={run}", f"resume={run}"],
                     ["hidden_size", "checkpoint"], tmp)

        model = os.path.join(tmp, "model")
        cfg = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, rope_theta=10000.0,
                   rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=True)
        make_model(model, cfg, 0)
        st = os.path.join(model, "model.safetensors")
        with open(st, "r+b") as f:
            f.truncate(os.path.getsize(st) - 100)
        expect_error("truncated safetensors", ["train", *TINY, f"model.path={model}",
                                               f"train.output_dir={run}"], [st, "truncated"], tmp)
    finally:
        shutil.rmtree(tmp)
    if failures:
        sys.exit("FAIL:\n" + "\n".join(failures))
    print("ok: every bad input gave one clear error and changed nothing")


if __name__ == "__main__":
    main()
