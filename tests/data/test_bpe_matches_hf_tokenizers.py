"""weft's byte-level BPE gives exactly the ids of Hugging Face `tokenizers`, and decodes them back.

Trains small byte-level BPE tokenizers in-process with `tokenizers` (GPT-2 style, Qwen2 style, Qwen2
with NFC and extra added tokens, Llama-3 style with ignore_merges, and one exercising Digits, split
behaviors and add_prefix_space) on a multilingual text, saves each as tokenizer.json, and for fixed
texts (unseen CJK, emoji ZWJ sequences and skin tones, accents in NFC and NFD, code, special
tokens inside text, leading/trailing spaces, newlines, very long words, invalid UTF-8) plus seeded
random strings checks that `weft tokenize --tokenizer F` prints the ids of
encode(text, add_special_tokens=False) and that `weft tokenize --decode` gives back the original
bytes (or, where normalization or whitespace stripping changes the text, what `tokenizers`
decodes). Where the tokenizer has a post_processor (Llama 3's Sequence of ByteLevel and a
TemplateProcessing putting <|begin_of_text|> first; a TemplateProcessing with tokens on both sides;
RobertaProcessing), `weft tokenize --special`, which is how prompts and documents are encoded,
prints the ids of encode(text) (add_special_tokens=True), except that a text already beginning
with the leading tokens does not get them twice. Also checks the default byte-level tokenizer
round-trips arbitrary bytes.

Usage: /usr/bin/python3 tests/data/test_bpe_matches_hf_tokenizers.py --weft build/weft
Needs the PyPI package `tokenizers`.
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile

try:
    import tokenizers
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors, trainers)
except ImportError:
    sys.exit("this test needs the PyPI package tokenizers: "
             "/usr/bin/python3 -m pip install --break-system-packages tokenizers")

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOT = "<|endoftext|>"

TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. It's what they've said: we'll see, I'd think, you're right.
Tokenizers split text into pieces; byte-level BPE never meets an unknown character.
In 2024, 1,234,567 tokens cost $0.25 per 1000 requests (about 3.5% more than in 2023).
Français : élève, garçon, où, déjà, naïve, cœur. Deutsch: Größe, Übermäßig, Straße, Äpfel und Öl.
Español: ¿Dónde está el niño? ¡Mañana será otro día! Português: ação, coração, não, avó.
Tiếng Việt: Xin chào, tôi là người Việt Nam. Polski: zażółć gęślą jaźń. Čeština: příliš žluťoučký kůň.
中文：机器学习是人工智能的一个分支。我们今天在北京见面，天气很好。
日本語：東京は日本の首都です。ひらがなとカタカナ、そして漢字を使います。
한국어: 안녕하세요, 저는 학생입니다. 서울은 대한민국의 수도입니다.
Русский: Привет, как дела? Ελληνικά: Καλημέρα κόσμε. العربية: مرحبا بالعالم. עברית: שלום עולם.
Emoji: 😀 😂 🎉 👍 👍🏻 👍🏽 👍🏿 ❤️ 🇫🇷 🇯🇵 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 🧑🏿‍🚀 👋🏼 ✨🔥
def train(model, data, epochs=3):
\tfor epoch in range(epochs):
\t\tloss = model.step(data[epoch % len(data)])
\t\tif loss < 0.01:
\t\t\tbreak
    return {"loss": loss, "epochs": epoch + 1}

int main(void) {
    for (int i = 0; i < 10; i++) printf("%d\\n", i * i);
    return 0;
}
"""

TEST_TEXTS = [
    "Hello world",
    "",
    " ",
    "   leading and trailing spaces   ",
    "\n\n\nmultiple\n\n\n\nnewlines\r\n\r\nand CRLF\n",
    "Tabs\tand\t\tmore\t\t\ttabs\n\t\tindented\n",
    "It's, they'RE, WE'LL, I'D, you've, She'S, don't",
    "未见过的中文句子：深度学习模型需要大量的训练数据。",
    "見たことのない日本語の文章です。カタカナ：コンピュータ。",
    "처음 보는 한국어 문장입니다. 감사합니다!",
    "New emoji: 🦄🦄 🤖 🧠 👨🏾‍🔬 👩‍❤️‍💋‍👨 🏃🏻‍♀️ 🫠 and flags 🇧🇷🇩🇪",
    "Accents precomposed: é è ê ë à ç ñ ö ü Å ǅ ḗ ệ",
    "Accents decomposed: e\u0301 e\u0300 n\u0303 o\u0308 A\u030a e\u0323\u0302 e\u0302\u0323",
    "text with " + EOT + " inside and " + EOT + EOT + " twice",
    EOT + "at the start and at the end" + EOT,
    "<|endoftext" + "|> split? <|endoftext|>> <<|endoftext|>",
    "x = [i ** 2 for i in range(100) if i % 3 == 0]  # squares\n\treturn {'a': 1, \"b\": [2, 3]}\n",
    "Numbers: 0 12 345 6789 1234567890 3.14159 -42 1e10 ٣٤٥ １２３ ² ½ Ⅻ",
    "a" * 5000,
    "supercalifragilisticexpialidocious" * 150,
    "1234567890" * 300,
    " " * 3000 + "x" + "\n" * 500 + "y\t\t\t",
    "mixed-script: abcабвαβγ中文日本語한국어",
    "NUL\x00byte and controls \x01\x02\x1b[0m \x7f",
    "Unicode spaces:\u00a0\u2000\u2009\u3000\u180e\u200b\u2028\u2029\u0085end",
    "Combining: a\u0301\u0301\u0327 Hangul jamo \u1100\u1161\u11a8 \u1112\u1161\u11ab "
    "compat \uf900 \u212b \u0344",
    # Marks and a composition newer than tokenizers' NFC tables, which it leaves alone.
    "Newer marks: x\u0898\u0323 \u1df6\u0316 \U00011935\U00011930",
    "Hebrew points: \u05e9\u05c1\u05b8 \u05d1\u05b8\u05bc Devanagari: क्षत्रिय हिन्दी  Bengali: বাংলা  Thai: ภาษาไทย",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    "<think>hmm</think> café CAFÉ cafe\u0301 [MASK] x [MASK]y",
    "foo food foo_bar (foo) foo.",
]

# Atoms for seeded random strings: every script, space kind and special token above, and the
# characters where Unicode-aware regexes and NFC differ most.
ATOMS = [
    "a", "Z", "hello", "World", " ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u180e",
    "\u2028", "\u0085", "\u200b", "\u200d", "0", "42", "2024", "٣", "１", "²", "½", "Ⅻ", ".", ",", "!?",
    "'s", "'S", "'ll", "'", "ſ", "-", "_", "(", ")", "{", "}", "#", "$", "é", "e\u0301", "\u0301",
    "\u0308", "\u0323", "\u0302", "ñ", "ß", "ǅ", "İ", "中", "文字", "日本", "カタカナ", "한", "\u1100\u1161",
    "\u11a8", "😀", "👍🏽", "👨‍👩‍👧", "🏳️‍🌈", "\ufe0f", "🇫🇷", "\u0915\u094d\u0937", "\u09ac\u09be",
    "\u05e9\u05c1\u05b8", "\u0e20\u0e32", "مرحبا", "Привет", EOT, "<|im_start|>", "<|im_end|>", "<think>",
    "café", "[MASK]", "foo", "\x00", "\x1b", "\uf900", "\u212b", "\u0344", "\U0001f9d1\u200d\U0001f680",
]

INVALID_UTF8 = [
    b"ok \xff\xfe bad",
    b"truncated \xe2\x82",
    b"\xe2\x82A \xf0\x9f\x98 x \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 end",
    b"\x80\x80\x80" + "中".encode() + b"\xe4",
]


def build(kind):
    """A tokenizer and whether decoding gives back the exact input (no normalization or stripping)."""
    special = [EOT]
    if kind == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        lossless = True
    elif kind in ("qwen2", "qwen2-nfc-added"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        lossless = kind == "qwen2"
        if kind == "qwen2-nfc-added":
            tok.normalizer = normalizers.NFC()
            special = [EOT, "<|im_start|>", "<|im_end|>"]
    elif kind == "llama3-ignore-merges":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        lossless = True
    elif kind == "digits-behaviors-prefix":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next"),
                pre_tokenizers.Split("-", behavior="merged_with_previous"),
                pre_tokenizers.Split(Regex(r"[.,;:!?]"), behavior="contiguous"),
                pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
            ]
        )
        lossless = False
    else:
        raise ValueError(kind)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        min_frequency=1,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = TRAINING_TEXT.splitlines(keepends=True)
    tok.train_from_iterator(lines * 3, trainer)
    if kind == "qwen2-nfc-added":
        tok.add_tokens(
            [
                AddedToken("<think>", special=False, normalized=False),
                AddedToken("</think>", special=False, normalized=False),
                AddedToken("café", special=False, normalized=True),
                AddedToken("[MASK]", special=False, normalized=False, lstrip=True, rstrip=True),
                AddedToken("foo", special=False, normalized=True, single_word=True),
            ]
        )
    add_post_processor(tok, kind)
    return tok, lossless


BOT = "<|begin_of_text|>"


def add_post_processor(tok, kind):
    """The special tokens encode(text) puts around a text: Llama 3's, and two other shapes."""
    if kind == "llama3-ignore-merges":
        tok.add_special_tokens([BOT])
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{BOT} $A", pair=f"{BOT} $A {BOT} $B:1",
                                          special_tokens=[(BOT, tok.token_to_id(BOT))])])
    elif kind == "qwen2-nfc-added":
        im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A <|im_end|> <|im_end|>",
            special_tokens=[("<|im_start|>", im_start), ("<|im_end|>", im_end)])
    elif kind == "gpt2":
        tok.post_processor = processors.RobertaProcessing(sep=(EOT, tok.token_to_id(EOT)),
                                                          cls=(EOT, tok.token_to_id(EOT)))


def special_expected(tok, text):
    """encode(text)'s ids, less a second copy of the leading special tokens."""
    x, full_x = tok.encode("x", add_special_tokens=False).ids, tok.encode("x").ids
    lead = full_x[:next(k for k in range(len(full_x)) if full_x[k:k + len(x)] == x)]
    plain, full = tok.encode(text, add_special_tokens=False).ids, tok.encode(text).ids
    return full[len(lead):] if lead and plain[:len(lead)] == lead else full


def run_weft(weft, args, stdin):
    p = subprocess.run([weft, "tokenize", *args], input=stdin, capture_output=True, timeout=120)
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace")
        raise RuntimeError(f"weft tokenize {' '.join(args)} exited {p.returncode}: {err}")
    return p.stdout


def weft_encode(weft, path, data, special=False):
    out = run_weft(weft, (["--tokenizer", path] if path else []) + (["--special"] if special else []),
                   data).decode()
    assert out.endswith("\n"), out
    return [int(x) for x in out.split()]


def weft_decode(weft, path, ids):
    args = (["--tokenizer", path] if path else []) + ["--decode"]
    return run_weft(weft, args, " ".join(map(str, ids)).encode())


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


class Report:
    def __init__(self):
        self.failures = 0

    def fail(self, what, text, expected, got, tok=None):
        self.failures += 1
        i = first_difference(expected, got)
        print(f"MISMATCH {what}\n  text: {text[:300]!r}{'...' if len(text) > 300 else ''}")
        print(f"  lengths: expected {len(expected)}, weft {len(got)}; first difference at position {i}")
        print(f"  expected[{max(0, i - 3)}:{i + 5}] = {expected[max(0, i - 3):i + 5]!r}")
        print(f"  weft    [{max(0, i - 3)}:{i + 5}] = {got[max(0, i - 3):i + 5]!r}")
        if tok is not None and isinstance(expected, list):
            print(f"  expected tokens: {[tok.id_to_token(x) for x in expected[max(0, i - 3):i + 5]]}")
            print(f"  weft tokens:     {[tok.id_to_token(x) for x in got[max(0, i - 3):i + 5] if x >= 0]}")


def random_texts(n, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 14))) for _ in range(n)]


def check_tokenizer(weft, kind, tmp, report):
    tok, lossless = build(kind)
    path = os.path.join(tmp, f"{kind}.json")
    tok.save(path)
    texts = TEST_TEXTS + [TRAINING_TEXT, TRAINING_TEXT * 4] + random_texts(120, seed=sum(map(ord, kind)))
    cases = [(t, t.encode()) for t in texts]
    cases += [(b.decode("utf-8", errors="replace"), b) for b in INVALID_UTF8]
    n_tokens = 0
    for text, data in cases:
        expected = tok.encode(text, add_special_tokens=False).ids
        got = weft_encode(weft, path, data)
        n_tokens += len(expected)
        if got != expected:
            report.fail(f"{kind}: encode", text, expected, got, tok)
            continue
        decoded = weft_decode(weft, path, expected)
        if lossless:
            want = text.encode()
        else:
            # tokenizers ends decoding with a lossy UTF-8 conversion that weft leaves to the caller
            # (it matters for added tokens like "café", whose "é" the ByteLevel decoder reads as
            # the byte 0xE9).
            want = tok.decode(expected, skip_special_tokens=False).encode()
            decoded = decoded.decode("utf-8", errors="replace").encode()
        if decoded != want:
            report.fail(f"{kind}: decode", text, list(want), list(decoded))
    if tok.post_processor is not None:
        for text in TEST_TEXTS + random_texts(30, seed=5):
            expected = special_expected(tok, text)
            got = weft_encode(weft, path, text.encode(), special=True)
            if got != expected:
                report.fail(f"{kind}: encode --special", text, expected, got, tok)
        print(f"{kind}: encode --special equals encode(text) with its special tokens")
    how = "the original bytes" if lossless else "what tokenizers decodes (after its lossy UTF-8 step)"
    print(
        f"{kind}: vocab {tok.get_vocab_size()}, {len(cases)} texts ({len(INVALID_UTF8)} with invalid UTF-8), "
        f"{n_tokens} tokens compared with tokenizers {tokenizers.__version__}; decode gives {how}"
    )


def check_byte_level(weft, report):
    rng = random.Random(7)
    cases = [t.encode() for t in TEST_TEXTS] + INVALID_UTF8 + [bytes(range(256)) * 3]
    cases += [bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))) for _ in range(30)]
    eot = EOT.encode()
    for data in cases:
        expected = []
        for i, part in enumerate(data.split(eot)):
            if i:
                expected.append(256)
            expected.extend(part)
        got = weft_encode(weft, None, data)
        if got != expected:
            report.fail("byte-level: encode", data.decode(errors="replace"), expected, got)
            continue
        decoded = weft_decode(weft, None, got)
        if decoded != data:
            report.fail("byte-level: decode", data.decode(errors="replace"), list(data), list(decoded))
    print(f"byte-level: {len(cases)} byte strings (arbitrary bytes included) encode to bytes + 256 "
          "and round-trip")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    args = ap.parse_args()
    report = Report()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ["gpt2", "qwen2", "qwen2-nfc-added", "llama3-ignore-merges", "digits-behaviors-prefix"]:
            check_tokenizer(args.weft, kind, tmp, report)
    check_byte_level(args.weft, report)
    if report.failures:
        print(f"FAILED: {report.failures} mismatches")
        return 1
    print("all ids and decodes match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
