"""The tokenizer of a checkpoint folder, as GGUF wants it: the original tokenizer.json text (our
engine tokenizes with it) plus llama.cpp's tokenizer.ggml.* arrays (so llama.cpp can too).

Two layouts exist: LLaDA ships tokenizer.json; Dream ships a Qwen2 slow tokenizer
(vocab.json + merges.txt, added tokens in tokenizer_config.json), from which we build the
equivalent tokenizer.json with the `tokenizers` library.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gguf import TokenType
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from diffuse._core import DiffuseError
from diffuse.convert.families import Family, read_json_object, read_text, shown

# Pre-tokenizer split patterns -> llama.cpp's tokenizer.ggml.pre names.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_NAMES = {LLAMA3_SPLIT: "llama-bpe", QWEN2_SPLIT: "qwen2"}
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# Gemma 4's tool and channel markers, typed USER_DEFINED by llama.cpp's converter so that they render.
GEMMA4_VISIBLE_TOKENS = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                                   "<tool_response|>", '<|"|>'})


@dataclass
class Vocab:
    hf_json: str                    # tokenizer.json text
    ids: dict[str, int]             # token -> id, added tokens included
    tokens: list[str]               # n_vocab entries; ids without a token are "[PAD{id}]"
    types: list[int]                # gguf.TokenType per token
    merges: list[str]               # "left right"
    pre: str                        # llama.cpp pre-tokenizer name; "gemma4": Gemma 4's BPE (is_gemma_bpe)
    chat_template: str | None
    special_ids: dict[str, int]     # "bos" / "eos" / "pad" / "eot" -> id
    add_bos: bool | None

    def id_of(self, content: str) -> int | None:
        return self.ids.get(content)


def read_vocab(hf_dir: Path, family: Family, config: dict, n_vocab: int) -> Vocab:
    tok_config = _read_tokenizer_config(hf_dir / "tokenizer_config.json")
    if (hf_dir / "tokenizer.json").is_file():
        path = hf_dir / "tokenizer.json"
        hf_json = read_text(path)
        try:
            tok = Tokenizer.from_str(hf_json)
        except Exception as err:   # tokenizers raises a bare Exception
            raise DiffuseError(f"{path}: unreadable tokenizer ({shown(str(err))})") from err
    elif (hf_dir / "vocab.json").is_file() and (hf_dir / "merges.txt").is_file():
        tok = _qwen2_tokenizer(hf_dir, tok_config)
        hf_json = tok.to_str()
    else:
        raise DiffuseError(f"{hf_dir}: no tokenizer.json (or vocab.json + merges.txt)")

    ids = tok.get_vocab(with_added_tokens=True)           # token -> id
    if not ids:
        raise DiffuseError(f"{hf_dir}: the tokenizer has no tokens")
    if max(ids.values()) >= n_vocab:
        raise DiffuseError(f"{hf_dir}: the tokenizer has id {max(ids.values())} but the model only "
                           f"{n_vocab} embedding rows")
    added = tok.get_added_tokens_decoder()                # id -> AddedToken
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [TokenType.UNUSED] * n_vocab
    for text, i in ids.items():
        tokens[i] = text
        if i not in added:
            types[i] = TokenType.NORMAL
        else:
            types[i] = TokenType.CONTROL if added[i].special else TokenType.USER_DEFINED

    spec = json.loads(hf_json)
    model = spec["model"]
    if model.get("type") != "BPE":
        raise DiffuseError(f"{hf_dir}: {model.get('type')} tokenizer; diffuse converts BPE tokenizers")
    gemma = is_gemma_bpe(spec)
    if gemma:   # as llama.cpp's Gemma 4 converter types them: byte tokens, and the chat parser's visible ones
        for text, i in ids.items():
            if _BYTE_TOKEN.fullmatch(text):
                types[i] = TokenType.BYTE
            elif text in GEMMA4_VISIBLE_TOKENS:
                types[i] = TokenType.USER_DEFINED
    # Newer tokenizer.json stores merges as pairs; GGUF as "left right" (a space inside a
    # token is written as U+0120, as the gguf package does).
    merges = [m if isinstance(m, str) else " ".join(p.replace(" ", "\u0120") for p in m)
              for m in model.get("merges", [])]
    add_bos = tok_config.get("add_bos_token")

    vocab = Vocab(hf_json=hf_json, ids=ids, tokens=tokens, types=[int(t) for t in types], merges=merges,
                  pre="gemma4" if gemma else _pre_name(spec.get("pre_tokenizer")),
                  chat_template=_chat_template(hf_dir, tok_config),
                  special_ids={}, add_bos=add_bos if isinstance(add_bos, bool) else None)
    for kind in ("bos", "eos", "pad"):
        i = _special_id(vocab, tok_config.get(f"{kind}_token"), config.get(f"{kind}_token_id"), n_vocab)
        if i is not None:
            vocab.special_ids[kind] = i
    eot = vocab.id_of(family.eot_token)
    if eot is not None:
        vocab.special_ids["eot"] = eot
    return vocab


def _qwen2_tokenizer(hf_dir: Path, tok_config: dict) -> Tokenizer:
    """The fast tokenizer equivalent to a Qwen2/Dream slow tokenizer: byte-level BPE over NFC text
    split by the Qwen2 pattern, with the added tokens of tokenizer_config.json at their ids."""
    try:
        tok = Tokenizer(models.BPE.from_file(str(hf_dir / "vocab.json"), str(hf_dir / "merges.txt")))
    except Exception as err:   # tokenizers raises a bare Exception
        raise DiffuseError(f"{hf_dir}: unreadable vocab.json / merges.txt ({err})") from err
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()

    path = hf_dir / "tokenizer_config.json"
    decoder = tok_config.get("added_tokens_decoder") or {}
    try:
        added = sorted(((int(i), t) for i, t in decoder.items()), key=lambda item: item[0])
    except (ValueError, AttributeError) as err:
        raise DiffuseError(f"{path}: bad added_tokens_decoder (expected {{id: token}})") from err
    for i, t in added:
        if not (isinstance(t, dict) and isinstance(t.get("content"), str)
                and all(isinstance(t.get(k, False), bool)
                        for k in ("single_word", "lstrip", "rstrip", "normalized", "special"))):
            raise DiffuseError(f"{path}: added token {i} is {shown(t)}; expected an object with a string "
                               "content and true/false options")
        token = AddedToken(t["content"], single_word=t.get("single_word", False), lstrip=t.get("lstrip", False),
                           rstrip=t.get("rstrip", False), normalized=t.get("normalized", False),
                           special=t.get("special", False))
        if t.get("special", False):
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
        if tok.token_to_id(t["content"]) != i:
            raise DiffuseError(f"{path}: added token {shown(t['content'])} has id {i} "
                               "but does not follow the vocabulary directly")
    return tok


def is_gemma_bpe(spec: dict) -> bool:
    """Gemma's tokenizer.json (transformers' GemmaTokenizer; Gemma 4, DiffusionGemma): BPE with byte
    fallback over text whose spaces the normalizer turns into U+2581. llama.cpp calls it 'gemma4'."""
    norm = spec.get("normalizer") or {}
    return (spec["model"].get("byte_fallback") is True and norm.get("type") == "Replace"
            and (norm.get("pattern") or {}).get("String") == " " and norm.get("content") == "\u2581")


def _pre_name(pre_tokenizer: dict | None) -> str:
    """llama.cpp's name for the split pattern, or "default" for one it has no name for."""
    stack = [pre_tokenizer]
    while stack:
        p = stack.pop()
        if not isinstance(p, dict):
            continue
        stack.extend(p.get("pretokenizers") or [])
        if p.get("type") == "Split":
            return PRE_NAMES.get((p.get("pattern") or {}).get("Regex"), "default")
    return "default"


def _chat_template(hf_dir: Path, tok_config: dict) -> str | None:
    jinja = hf_dir / "chat_template.jinja"   # newer transformers save it beside the config
    if jinja.is_file():
        return read_text(jinja)
    template = tok_config.get("chat_template")
    if isinstance(template, list):           # named templates: keep the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    return template if isinstance(template, str) and template else None


def _special_id(vocab: Vocab, token, config_id, n_vocab: int) -> int | None:
    """Id of a special token named in tokenizer_config.json (a string or {"content": ...}),
    else the id given in config.json."""
    if isinstance(token, dict):
        token = token.get("content")
    if isinstance(token, str) and (i := vocab.id_of(token)) is not None:
        return i
    if type(config_id) is int and 0 <= config_id < n_vocab:   # not true/false, which are ints too
        return config_id
    return None


def _read_tokenizer_config(path: Path) -> dict:
    return read_json_object(path) if path.is_file() else {}
