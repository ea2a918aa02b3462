"""Tiny GGUF files for hostile-input tests: no weights, only what the tokenizer reads."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from diffuse import gguf_file


def tiny_tokenizer_json() -> str:
    """A small, valid tokenizer.json: single letters, a few merges and the chat specials."""
    letters = "abcdefghijklmnopqrstuvwxyz <>|_\n"
    vocab = {c: i for i, c in enumerate(letters)}
    for word in ("he", "ll", "hell", "hello"):
        vocab[word] = len(vocab)
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")]))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"])
    return hf.to_str()


def tokenizer_gguf(path: Path, *, tokenizer_json: str | None = None, chat_template: str | None = None,
                   kv: dict | None = None, kv_types: dict | None = None) -> Path:
    """A Dream-family GGUF holding a tokenizer (embedded tokenizer.json unless kv has other keys)
    and optionally a chat template."""
    out = {"general.architecture": "dream", **(kv or {})}
    types = {"general.architecture": "str", **(kv_types or {})}
    if tokenizer_json is not None:
        out["tokenizer.huggingface.json"], types["tokenizer.huggingface.json"] = tokenizer_json, "str"
    if chat_template is not None:
        out["tokenizer.chat_template"], types["tokenizer.chat_template"] = chat_template, "str"
    gguf_file.write(path, out, types, [], [])
    return path
