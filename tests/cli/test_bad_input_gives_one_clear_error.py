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


def write(path, text, mode="w"):
    with open(path, mode) as f:
        f.write(text)
    return path


def bad_settings(tmp, run):
    """Zero, negative and non-finite settings: a config error before anything runs or is
    written (zero sizes used to end in SIGFPE or SIGSEGV)."""
    for setting, words in [("model.hidden_size=0", ["hidden_size", "positive"]),
                           ("model.intermediate_size=0", ["intermediate_size", "positive"]),
                           ("model.num_layers=0", ["model.num_layers", "positive"]),
                           ("model.num_layers=1000000000", ["2^40 parameters"]),
                           ("train.global_batch_size=0", ["train.global_batch_size"]),
                           ("train.steps=-1", ["train.steps=-1"]),
                           ("optim.lr=nan", ["optim.lr=nan"]),
                           # more documents than the data holds: a batch repeated documents
                           ("train.global_batch_size=100000",
                            ["train.global_batch_size=100000", "documents of data.source"])]:
        fresh = os.path.join(tmp, "fresh_run")
        expect_error(setting, ["train", *TINY, setting, f"train.output_dir={fresh}"], words, tmp)
        if os.path.exists(fresh):
            failures.append(f"{setting}: the output directory was created")


def bad_yaml(tmp, run):
    """An alias cycle (it recursed until SIGSEGV) and an alias bomb (100 s, then accepted)."""
    cycle = write(os.path.join(tmp, "cycle.yaml"), "a: &x {b: *x}\n")
    expect_error("YAML alias cycle", ["train", "--config", cycle, f"train.output_dir={run}"],
                 [cycle, "deeper than"], tmp)
    bomb = "a0: &a0 {}\n" + "".join(f"a{i}: &a{i} {{p: *a{i-1}, q: *a{i-1}}}\n" for i in range(1, 40))
    bomb = write(os.path.join(tmp, "bomb.yaml"), bomb)
    expect_error("YAML alias bomb", ["train", "--config", bomb, f"train.output_dir={run}"],
                 [bomb, "more than 10000 values"], tmp)


def bad_config_json(tmp, run):
    """A config.json with more heads than hidden units (head_dim 0: SIGFPE) and one whose
    sizes overflow the parameter count."""
    for name, cfg, words in [("heads", dict(num_attention_heads=64), ["head_dim", "positive"]),
                             ("huge", dict(hidden_size=1 << 29, intermediate_size=1 << 29),
                              ["2^40 parameters"])]:
        mdir = os.path.join(tmp, "cfg_" + name)
        os.makedirs(mdir)
        base = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
        write(os.path.join(mdir, "config.json"), json.dumps(dict(base, **cfg)))
        expect_error(f"config.json: {name}", ["train", *TINY, f"model.path={mdir}", "data.tokenizer=bytes",
                                              f"train.output_dir={run}"], words, tmp)


def bad_documents(tmp, run):
    """Bad JSONL lines, each named by file and line."""
    cases = [("ids outside the vocabulary", '{"input_ids": [1, 2, 999999]}', "outside the vocabulary"),
             ("negative id", '{"input_ids": [1, -2, 3]}', "outside the vocabulary"),
             ("loss_mask longer", '{"input_ids": [1, 2], "loss_mask": [0, 1, 1]}', "loss_mask has 3"),
             ("loss_mask shorter", '{"input_ids": [1, 2, 3], "loss_mask": [0, 1]}', "loss_mask has 2")]
    for name, line, words in cases:
        path = write(os.path.join(tmp, "doc.jsonl"), '{"input_ids": [1, 2, 3]}\n' + line + "\n")
        expect_error(name, ["train", *TINY, f"data.source={path}", f"train.output_dir={run}"],
                     [f"{path}:2:", words], tmp)
    bad_utf8 = write(os.path.join(tmp, "utf8.jsonl"), b'{"text": "ok"}\n{"text": "\xff\xfe bad"}\n', "wb")
    expect_error("invalid UTF-8 in text", ["train", *TINY, f"data.source={bad_utf8}",
                                           f"train.output_dir={run}"], [f"{bad_utf8}:2:"], tmp)
    huge = os.path.join(tmp, "huge_line.jsonl")
    with open(huge, "w") as f:
        f.write('{"text": "' + "x" * (100 << 20) + '"}\n')
    expect_error("JSONL line of 100 MB", ["train", *TINY, f"data.source={huge}",
                                          f"train.output_dir={run}"], [f"{huge}:1:", "64 MiB"], tmp)
    os.remove(huge)


def grad_huge_document(tmp, model):
    """weft grad on one 2M-token document: refused before it allocates (it used to run out of
    memory after minutes). A wide model makes the activations far beyond any test machine."""
    wide = os.path.join(tmp, "wide")
    make_model(wide, dict(vocab_size=300, hidden_size=2048, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                          rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                          attention_bias=False), 0)
    batch = write(os.path.join(tmp, "long.jsonl"), '{"input_ids": [' + "1," * 1999999 + "1]}\n")
    out = os.path.join(tmp, "grads.safetensors")
    expect_error("weft grad on a 2M-token document",
                 ["grad", "--model", wide, "--batch", batch, "--out", out],
                 [batch, "document 1 has 2000000 tokens", "available"], tmp)


def config_round_trip(tmp):
    """A run directory whose name holds a quote and a backslash: the saved config.yaml loads
    back (resume) with the same output_dir."""
    odd = os.path.join(tmp, 'odd "dir\\x')
    r = subprocess.run([WEFT, "train", *TINY, f"train.output_dir={odd}"], capture_output=True,
                       text=True, timeout=120)
    saved = os.path.join(odd, "config.yaml")
    r2 = subprocess.run([WEFT, "train", "--config", saved, "train.steps=3", f"resume={odd}"],
                        capture_output=True, text=True, timeout=120)
    if r.returncode or r2.returncode or "resumed from" not in r2.stdout:
        failures.append(f"config.yaml round trip of {odd!r}: {r.stderr} {r2.stderr}")
    else:
        print("config.yaml round trip of a path with a quote and a backslash: ok")


def directories_for_files(tmp, run):
    """A directory where a file is expected is refused by name (a tokenizer read as "out of host
    memory allocating 9223372036854775808 bytes", --config as "malformed YAML: input error"), and
    no error prints a ":-1:" line number."""
    folder = os.path.join(tmp, "a_folder")
    os.makedirs(folder, exist_ok=True)
    for name, args in [("tokenizer", [f"data.tokenizer={folder}"]),
                       ("config", ["--config", folder]),
                       ("data", [f"data.source={folder}"])]:
        expect_error(f"a directory as the {name} file", ["train", *TINY, *args,
                                                         f"train.output_dir={run}"],
                     [folder, "directory"], tmp)
    expect_error("a model directory without config.json", ["grad", "--model", folder, "--batch",
                                                            folder, "--out", f"{tmp}/g.st"],
                 ["config.json", "No such file"], tmp)
    r = subprocess.run([WEFT, "grad", "--model", folder, "--batch", folder, "--out",
                        f"{tmp}/g.st"], capture_output=True, text=True, timeout=60)
    if ":-1:" in r.stderr:
        failures.append(f"an error printed a line number of -1: {r.stderr!r}")


def progress_without_a_terminal(tmp):
    """Output that is not a terminal (mpirun logs, pipes) gets plain lines: no carriage returns
    or escape sequences from the progress bar."""
    r = subprocess.run([WEFT, "train", *TINY, "train.steps=12", "train.log_every=4",
                        f"train.output_dir={tmp}/plain"], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0 or "\r" in r.stdout or "\033" in r.stdout:
        failures.append(f"progress written to a pipe holds control characters: {r.stdout!r}")


def hardened_inputs(tmp, run, model):
    directories_for_files(tmp, run)
    progress_without_a_terminal(tmp)
    bad_settings(tmp, run)
    bad_yaml(tmp, run)
    bad_config_json(tmp, run)
    bad_documents(tmp, run)
    grad_huge_document(tmp, model)
    config_round_trip(tmp)


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
        # Suggestions by the last component and other frameworks' names (learning_rate used to
        # suggest optim.min_lr).
        for key, known in [("optim.learning_rate", "optim.lr"), ("train.max_steps", "train.steps"),
                           ("optim.max_grad_norm", "optim.clip_grad"),
                           ("model.num_hidden_layers", "model.num_layers")]:
            expect_error(f"unknown config key {key}", ["train", f"{key}=1",
                                                       f"train.output_dir={run}"],
                         [f'"{key}"', f'did you mean "{known}"'], tmp)

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
        expect_error("truncated safetensors", ["train", *TINY, f"model.path={model}", "data.tokenizer=bytes",
                                               f"train.output_dir={run}"], [st, "truncated"], tmp)
        hardened_inputs(tmp, run, model)
    finally:
        shutil.rmtree(tmp)
    if failures:
        sys.exit("FAIL:\n" + "\n".join(failures))
    print("ok: every bad input gave one clear error and changed nothing")


if __name__ == "__main__":
    main()
