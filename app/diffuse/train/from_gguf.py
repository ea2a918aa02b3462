"""Start a training run from a GGUF that `diffuse train` wrote (the bundled demo, say): its weights,
shapes and tokenizer, so a model can be trained further on new text or a new chat mix.

The reverse of the converter for LLaDA's layout: GGUF names back to the Hugging Face names (which
are the trainer's `state_dict()` keys, families.LLADA.tensors), and q/k rows back from llama.cpp's
adjacent RoPE pairs to rotate-half (families.qk_row_order: permuted = original[order]). Only float
files: a quantised file has lost what training needs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from diffuse import DiffuseError, gguf_file
from diffuse.convert.families import LLADA, qk_row_order
from diffuse.train.bpe import SPECIALS
from diffuse.train.model import Shape

FLOAT_TYPES = {0: np.float32, 1: np.float16}      # ggml type id -> numpy type


def shape_of(info: gguf_file.GGUFInfo) -> Shape:
    kv, a = info.kv, "llada"
    try:
        shape = Shape(vocab_size=int(kv[f"{a}.vocab_size"]), d_model=int(kv[f"{a}.embedding_length"]),
                      n_layers=int(kv[f"{a}.block_count"]), n_heads=int(kv[f"{a}.attention.head_count"]),
                      mlp_hidden_size=int(kv[f"{a}.feed_forward_length"]),
                      max_sequence_length=int(kv[f"{a}.context_length"]))
    except KeyError as e:
        raise DiffuseError(f"{info.path}: no {e.args[0]} key; not a file diffuse train can start from") from None
    theta = float(kv.get(f"{a}.rope.freq_base", shape.rope_theta))
    n_kv = int(kv.get(f"{a}.attention.head_count_kv", shape.n_heads))
    if abs(theta - shape.rope_theta) > 1e-3 or n_kv != shape.n_heads:
        raise DiffuseError(f"{info.path}: RoPE base {theta:g} and {n_kv} KV heads; the trainer's LLaDA has base "
                           f"{shape.rope_theta:g} and as many KV heads as heads")
    return shape


def tokenizer_of(info: gguf_file.GGUFInfo) -> Tokenizer:
    text = info.kv.get("tokenizer.huggingface.json")
    if not isinstance(text, str):
        raise DiffuseError(f"{info.path}: no tokenizer.huggingface.json inside; only a file written by diffuse "
                           "train (or converted from its checkpoint) carries the tokenizer training needs")
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:      # the tokenizers library raises a bare Exception for any bad JSON
        raise DiffuseError(f"{info.path}: its tokenizer.huggingface.json does not load ({e})") from None
    missing = [s for s in SPECIALS if tok.token_to_id(s) is None]
    if missing:
        raise DiffuseError(f"{info.path}: its tokenizer has no {missing[0]}; diffuse train needs LLaDA's special tokens")
    return tok


def read(path: Path) -> tuple[gguf_file.GGUFInfo, Shape, Tokenizer]:
    """The file's header, shape and tokenizer; DiffuseError for a file training cannot start from."""
    info = gguf_file.read(path)
    if info.arch != "llada":
        raise DiffuseError(f"{path}: a {info.arch} model; diffuse train starts only from a LLaDA-architecture file")
    return info, shape_of(info), tokenizer_of(info)


def load(path: Path) -> tuple[Shape, Tokenizer, dict[str, torch.Tensor]]:
    """(shape, tokenizer, state_dict in the trainer's names, float32) of a LLaDA-layout float GGUF."""
    info, shape, tok = read(path)
    state: dict[str, torch.Tensor] = {}
    for gguf_name, hf_name in LLADA.tensors.items():
        for i in range(shape.n_layers) if "{i}" in gguf_name else [None]:
            name, key = gguf_name.format(i=i), hf_name.format(i=i)
            t = info.tensor(name)
            if t is None:
                raise DiffuseError(f"{path}: tensor {name} is missing")
            if t.type not in FLOAT_TYPES:
                raise DiffuseError(f"{path}: tensor {name} is {t.type_name}; --init needs an F32 or F16 file "
                                   "(a quantised one has lost the precision training needs)")
            rows = t.raw().view(FLOAT_TYPES[t.type]).reshape(t.shape[::-1]).astype(np.float32)
            if "attn_q" in name or "attn_k" in name:
                original = np.empty_like(rows)
                original[qk_row_order(rows.shape[0], shape.n_heads)] = rows
                rows = original
            state[key] = torch.from_numpy(rows)
    return shape, tok, state
