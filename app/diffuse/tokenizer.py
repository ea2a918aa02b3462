"""Text <-> token ids (the `tokenizers` library) and chat templates (jinja2, sandboxed).

Where the vocabulary comes from, first found wins:
  1. a tokenizer.json given by the caller (a file, or a folder holding one);
  2. the original tokenizer.json embedded in our GGUF files (`tokenizer.huggingface.json`);
  3. tokenizer.json beside the GGUF file (diffuse-cpp files carry no tokenizer);
  4. llama.cpp's `tokenizer.ggml.*` arrays, rebuilt as a byte-level BPE with the pre-tokenizer
     that `tokenizer.ggml.pre` names (the split rules of llama.cpp's src/llama-vocab.cpp).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from diffuse import gguf_file
from diffuse._core import DiffuseError

# ---- llama.cpp pre-tokenizers: tokenizer.ggml.pre -> split regexes (applied one after the other) ----

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


class _Pre:
    def __init__(self, regexes: list[str], ignore_merges: bool = False, nfc: bool = False):
        self.regexes = regexes
        self.ignore_merges = ignore_merges   # a word found whole in the vocabulary is one token (Llama 3)
        self.nfc = nfc                       # Qwen2's tokenizer.json normalises to NFC first


_PRE_TYPES = {
    "default": _Pre([r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
    "gpt-2": _Pre([_GPT2]),
    "olmo": _Pre([_GPT2]),
    "starcoder": _Pre([r"\p{N}", _GPT2]),
    "smollm": _Pre([r"\p{N}", _GPT2]),
    "llama-bpe": _Pre([_LLAMA3], ignore_merges=True),
    "llama3": _Pre([_LLAMA3], ignore_merges=True),
    "llama-v3": _Pre([_LLAMA3], ignore_merges=True),
    "dbrx": _Pre([_LLAMA3]),
    "smaug-bpe": _Pre([_LLAMA3]),
    "qwen2": _Pre([_QWEN2], nfc=True),
    "deepseek-r1-qwen": _Pre([_QWEN2], nfc=True),
}

# llama.cpp token types (tokenizer.ggml.token_type)
_TOKEN_CONTROL, _TOKEN_UNKNOWN, _TOKEN_USER_DEFINED = 3, 2, 4

# ---- chat templates used when a file carries none (the families' own formats) ----

_LLADA_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.first %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
_DREAM_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_DEFAULT_TEMPLATES = {"llada": _LLADA_TEMPLATE, "dream": _DREAM_TEMPLATE}

# Token strings, looked up in the vocabulary: ends of text (LLaDA: <|endoftext|> 126081 and
# <|eot_id|> 126348; Dream: <|endoftext|>, <|im_end|>), beginnings of text and mask tokens.
_EOS_STRINGS = ("<|endoftext|>", "<|eot_id|>", "<|im_end|>")
_BOS_STRINGS = ("<|startoftext|>", "<|begin_of_text|>")
_MASK_STRINGS = ("<|mdm_mask|>", "<|mask|>")


class Tokenizer:
    """A model's tokenizer. Build one with :meth:`for_model` (``diffuse.load(...).tokenizer`` does)."""

    def __init__(self, hf: HFTokenizer, *, source: str, family: str | None = None,
                 chat_template: str | None = None, bos_token_id: int | None = None,
                 eos_token_ids: tuple[int, ...] = (), mask_token_id: int | None = None):
        self._hf = hf
        self.source = source
        self.family = family
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.mask_token_id = mask_token_id
        self._template: jinja2.Template | None = None

    # ---- construction ----

    @classmethod
    def for_model(cls, gguf_path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None,
                  hparams: dict | None = None) -> Tokenizer:
        """The tokenizer of a GGUF model; `hparams` (the engine's) supplies the family and mask id."""
        gguf_path = Path(gguf_path)
        info = gguf_file.read(gguf_path)
        kv = info.kv
        family = (hparams or {}).get("arch") or info.family
        template = kv.get("tokenizer.chat_template") if isinstance(kv.get("tokenizer.chat_template"), str) else None

        json_path = None
        if tokenizer_path is not None:
            json_path = Path(tokenizer_path)
            if json_path.is_dir():
                json_path = json_path / "tokenizer.json"
            if not json_path.is_file():
                raise DiffuseError(f"{json_path}: no such tokenizer file")
        elif not isinstance(kv.get("tokenizer.huggingface.json"), str) and (gguf_path.parent / "tokenizer.json").is_file():
            json_path = gguf_path.parent / "tokenizer.json"

        if json_path is not None:
            hf = _from_json_file(json_path)
            source = str(json_path)
            template = template or _template_beside(json_path)
        elif isinstance(kv.get("tokenizer.huggingface.json"), str):
            try:
                hf = HFTokenizer.from_str(kv["tokenizer.huggingface.json"])
            except Exception as e:   # the library raises plain Exception on bad JSON
                raise DiffuseError(f"{gguf_path}: the embedded tokenizer.json is invalid: {e}") from e
            source = "embedded tokenizer.json"
        elif "tokenizer.ggml.tokens" in kv:
            hf, pre = _from_llama_cpp_arrays(gguf_path, kv)
            source = f"llama.cpp vocabulary (pre-tokenizer {pre})"
        else:
            raise DiffuseError(
                f"{gguf_path}: the file carries no tokenizer. Pass the model's tokenizer.json "
                f"(diffuse.load(path, tokenizer='.../tokenizer.json') or --tokenizer on the command line) "
                f"or put tokenizer.json beside the model file")

        def find(strings) -> list[int]:
            return [i for s in strings if (i := hf.token_to_id(s)) is not None]

        def key_id(key: str) -> int | None:
            v = kv.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < hf.get_vocab_size() else None

        bos = key_id("tokenizer.ggml.bos_token_id")
        if bos is None:
            bos = next(iter(find(_BOS_STRINGS)), None)
        eos = set(find(_EOS_STRINGS))
        eos.update(i for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if (i := key_id(k)) is not None)
        if hparams and "mask_token_id" in hparams:
            mask = hparams["mask_token_id"]
        else:
            found = [key_id("tokenizer.ggml.mask_token_id"), key_id("diffuse.mask_token_id"), *find(_MASK_STRINGS)]
            mask = next((i for i in found if i is not None), None)
        return cls(hf, source=source, family=family, chat_template=template or _DEFAULT_TEMPLATES.get(family),
                   bos_token_id=bos, eos_token_ids=tuple(sorted(eos)), mask_token_id=mask)

    # ---- text <-> ids ----

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens(self) -> dict[int, str]:
        """Special (control) tokens: id -> text."""
        return {i: t.content for i, t in self._hf.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; ids past the vocabulary (padding rows of the model's output) decode to nothing."""
        ids = [int(i) for i in ids]
        if any(i < 0 or i >= 1 << 32 for i in ids):
            raise DiffuseError(f"decode: token ids must be in [0, 2^32), got {min(ids)}..{max(ids)}")
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    # ---- chat ----

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render messages [{"role": ..., "content": ...}] with the model's chat template."""
        if self.chat_template is None:
            raise DiffuseError(f"tokenizer from {self.source} has no chat template")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise_template_error
            try:
                self._template = env.from_string(self.chat_template)
            except jinja2.TemplateError as e:
                raise DiffuseError(f"tokenizer from {self.source}: invalid chat template: {e}") from e
        bos = self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else ""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=bos, eos_token=eos)
        except jinja2.TemplateError as e:
            raise DiffuseError(f"tokenizer from {self.source}: chat template failed: {e}") from e

    def encode_chat(self, prompt: str) -> list[int]:
        """Token ids of `prompt` as a user turn ready for the assistant's answer (BOS included when
        the template writes one)."""
        return self.encode(self.apply_chat_template([{"role": "user", "content": prompt}]))

    def __repr__(self) -> str:
        return f"<diffuse.Tokenizer {self.vocab_size} tokens from {self.source}>"


def _raise_template_error(message: str):
    raise jinja2.TemplateError(message)


def _from_json_file(path: Path) -> HFTokenizer:
    try:
        return HFTokenizer.from_file(str(path))
    except Exception as e:   # the library raises plain Exception on bad JSON
        raise DiffuseError(f"{path}: not a valid tokenizer.json: {e}") from e


def _template_beside(json_path: Path) -> str | None:
    """The chat template of a Hugging Face folder (tokenizer_config.json beside tokenizer.json)."""
    config = json_path.parent / "tokenizer_config.json"
    try:
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    return template if isinstance(template, str) else None


def _from_llama_cpp_arrays(path: Path, kv: dict) -> tuple[HFTokenizer, str]:
    """A byte-level BPE tokenizer from llama.cpp's tokenizer.ggml.{tokens,token_type,merges,pre}."""
    model = kv.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise DiffuseError(f"{path}: llama.cpp tokenizer model '{model}' is not supported (only byte-level BPE, "
                           f"'gpt2'); pass the model's tokenizer.json instead")
    pre_name = kv.get("tokenizer.ggml.pre") or "default"
    pre = _PRE_TYPES.get(pre_name)
    if pre is None:
        raise DiffuseError(f"{path}: unknown llama.cpp pre-tokenizer '{pre_name}'; pass the model's "
                           f"tokenizer.json instead (diffuse.load(path, tokenizer=...) or --tokenizer)")
    tokens = kv["tokenizer.ggml.tokens"]
    merges = kv.get("tokenizer.ggml.merges")
    types = kv.get("tokenizer.ggml.token_type")
    if not isinstance(tokens, list) or not isinstance(merges, list) or (types is not None and len(types) != len(tokens)):
        raise DiffuseError(f"{path}: malformed tokenizer.ggml.* arrays")

    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)   # a repeated string keeps its first id
    pairs = []
    for m in merges:
        cut = m.find(" ", 1)     # a merge is "left right"; left is never empty
        if cut < 0:
            raise DiffuseError(f"{path}: malformed merge '{m}' in tokenizer.ggml.merges")
        pairs.append((m[:cut], m[cut + 1:]))
    try:
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges))
    except Exception as e:       # a merge naming a token that is not in the vocabulary
        raise DiffuseError(f"{path}: inconsistent tokenizer.ggml vocabulary/merges: {e}") from e
    if pre.nfc:
        hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()

    if types is not None:
        special = [tokens[i] for i, t in enumerate(types) if t in (_TOKEN_CONTROL, _TOKEN_UNKNOWN)]
        user = [tokens[i] for i, t in enumerate(types) if t == _TOKEN_USER_DEFINED]
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    bos = kv.get("tokenizer.ggml.bos_token_id")
    if kv.get("tokenizer.ggml.add_bos_token") is True and isinstance(bos, int) and 0 <= bos < len(tokens):
        hf.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                          special_tokens=[(tokens[bos], bos)])
    return hf, pre_name
