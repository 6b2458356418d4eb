"""Writes a small random Qwen2 model directory, as `transformers` and `tokenizers` write one:
config.json, model.safetensors, generation_config.json, and a byte-level BPE tokenizer
(tokenizer.json, tokenizer_config.json) trained on the text of a JSONL file.

For trying weft's fine-tuning path end to end without downloading a model; any Qwen2 or Llama
directory from the Hugging Face hub is used the same way.

    python3 scripts/tiny_hf_model.py OUT_DIR [--data examples/sft.jsonl]
"""
import argparse
import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM


def texts(path):
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                yield row.get("text") or row.get("prompt", "") + row.get("response", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "examples",
                                                   "sft.jsonl"))
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(list(texts(a.data)), trainers.BpeTrainer(
        vocab_size=a.vocab, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")

    torch.manual_seed(a.seed)
    eos = tok.eos_token_id
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=176,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         bos_token_id=eos, eos_token_id=eos)
    Qwen2ForCausalLM(config).save_pretrained(a.out, safe_serialization=True)
    tok.save_pretrained(a.out)
    n = sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())
    print(f"{a.out}: Qwen2, {n} parameters, vocabulary {len(tok)}")


if __name__ == "__main__":
    main()
