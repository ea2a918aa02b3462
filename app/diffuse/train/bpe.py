"""A byte-level BPE tokenizer with LLaDA's special tokens and chat template.

Text tokens come first (ids 0..n-7), the six special tokens last, as in LLaDA-8B where the
specials sit above the text vocabulary.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from diffuse.convert.vocab import LLAMA3_SPLIT

BOS, EOS, MASK = "<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>"
START_HEADER, END_HEADER, EOT = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
SPECIALS = [BOS, EOS, MASK, START_HEADER, END_HEADER, EOT]

# LLaDA-8B-Instruct's template (Llama-3 headers, BOS before the first message).
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
)


def chat_prompt(user: str) -> str:
    """The template applied to one user message, as text (what the engine tokenizes)."""
    return f"{BOS}{START_HEADER}user{END_HEADER}\n\n{user.strip()}{EOT}{START_HEADER}assistant{END_HEADER}\n\n"


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # LLaDA-8B's pre-tokenizer (Llama-3 split, then bytes), so llama.cpp tokenizes our GGUF as "llama-bpe"
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIALS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(SPECIALS)
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {s: tok.token_to_id(s) for s in SPECIALS}


def save_tokenizer(tok: Tokenizer, out_dir: Path, max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json as in LLaDA-8B-Instruct."""
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(tok.token_to_id(s)): {
            "content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True,
        }
        for s in SPECIALS
    }
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": max_length,
        "pad_token": EOS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    specials_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials_map, indent=2) + "\n")
