"""Text <-> token ids (the `tokenizers` library) and chat templates (jinja2, sandboxed).

Where the vocabulary comes from, first found wins:
  1. a tokenizer.json given by the caller (a file, or a folder holding one);
  2. the original tokenizer.json embedded in our GGUF files (`tokenizer.huggingface.json`);
  3. tokenizer.json beside the GGUF file (diffuse-cpp files carry no tokenizer);
  4. llama.cpp's `tokenizer.ggml.*` arrays, rebuilt as a byte-level BPE with the pre-tokenizer
     that `tokenizer.ggml.pre` names (the split rules of llama.cpp's src/llama-vocab.cpp), or as
     Gemma 4's BPE (`tokenizer.ggml.model` "gemma4": what llama.cpp's and PR #24423's converters
     write for Gemma 4 and DiffusionGemma, read as llama.cpp's llama-vocab.cpp reads it).
"""
from __future__ import annotations

import functools
import json
import os
import re
import secrets
import threading
import time
from pathlib import Path

import jinja2
from jinja2 import nodes, pass_context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer
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
# SDAR/TraDo and Fast-dLLM v2 are Qwen models: ChatML, as Dream.
_DEFAULT_TEMPLATES = {"llada": _LLADA_TEMPLATE, "dream": _DREAM_TEMPLATE, "sdar": _DREAM_TEMPLATE,
                      "fast-dllm-v2": _DREAM_TEMPLATE}

# Token strings, looked up in the vocabulary: ends of text (LLaDA: <|endoftext|> 126081 and
# <|eot_id|> 126348; Dream: <|endoftext|>, <|im_end|>), beginnings of text and mask tokens.
# Gemma 4 (DiffusionGemma): <turn|> (106) ends a turn, as llama.cpp's vocabulary reader also
# decides by its string; its <eos> (1) is the file's eos id.
_EOS_STRINGS = ("<|endoftext|>", "<|eot_id|>", "<|im_end|>", "<turn|>")
_BOS_STRINGS = ("<|startoftext|>", "<|begin_of_text|>")
_MASK_STRINGS = ("<|mdm_mask|>", "<|mask|>")


class Tokenizer:
    """A model's tokenizer. Build one with :meth:`for_model` (``diffuse.load(...).tokenizer`` does)."""

    def __init__(self, hf: HFTokenizer, *, source: str, family: str | None = None,
                 chat_template: str | None = None, bos_token_id: int | None = None,
                 eos_token_ids: tuple[int, ...] = (), mask_token_id: int | None = None,
                 model_path: str | None = None):
        self._hf = hf
        self.source = source
        # errors name the model file too: "embedded tokenizer.json" alone does not say which
        self._where = source if model_path is None or model_path in source else f"{model_path} ({source})"
        self.family = family
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.mask_token_id = mask_token_id
        self._template: jinja2.Template | None = None
        # Whether special tokens' strings are parsed is a setting of the library's tokenizer, shared
        # by every thread that encodes with this one: each encode sets it and runs under this lock.
        self._encoding_lock = threading.Lock()

    # ---- construction ----

    @classmethod
    def for_model(cls, gguf_path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None,
                  hparams: dict | None = None) -> Tokenizer:
        """The tokenizer of a GGUF model; `hparams` (the engine's) supplies the family and mask id."""
        gguf_path = Path(gguf_path)
        info = gguf_file.read(gguf_path)
        kv = info.kv
        family = (hparams or {}).get("family") or info.family
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
            try:
                text = json_path.read_text(encoding="utf-8")
            except (OSError, UnicodeError) as e:
                raise DiffuseError(f"{json_path}: not a valid tokenizer.json: {e}") from e
            hf = _from_json(text, f"{json_path}: not a valid tokenizer.json")
            source = str(json_path)
            template = template or template_beside(json_path)
        elif isinstance(kv.get("tokenizer.huggingface.json"), str):
            hf = _from_json(kv["tokenizer.huggingface.json"], f"{gguf_path}: the embedded tokenizer.json is invalid")
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
                   bos_token_id=bos, eos_token_ids=tuple(sorted(eos)), mask_token_id=mask,
                   model_path=str(gguf_path))

    # ---- text <-> ids ----

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens(self) -> dict[int, str]:
        """Special (control) tokens: id -> text."""
        return {i: t.content for i, t in self._hf.get_added_tokens_decoder().items() if t.special}

    @functools.cached_property
    def _special_strings(self) -> tuple[str, ...]:
        """The special tokens' strings, longest first (one inside another is found whole)."""
        return tuple(sorted({t for t in self.special_tokens.values() if t}, key=len, reverse=True))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` as text: a special token's string in it (``<|eot_id|>``) is encoded
        as the characters it is, never as that token, so text from a user cannot end its turn or
        forge another. add_special_tokens: what the tokenizer adds itself (a BOS some models put
        first). Conversations: encode_chat."""
        return self._encoding(text, add_special_tokens, parse_special=False).ids

    def encode_with_special_tokens(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text that we wrote, each special token's string as that token (a chat
        template's output). Never for text from a user: that is what encode and encode_chat are for."""
        return self._encoding(text, add_special_tokens, parse_special=True).ids

    def _encoding(self, text: str, add_special_tokens: bool, parse_special: bool):
        if not isinstance(text, str):
            raise DiffuseError(f"encode: expected text, got {type(text).__name__}")
        if len(text) > MAX_TEXT_CHARS:   # bounds the time a hostile split regex or normalizer can take
            raise DiffuseError(f"encode: the text has {len(text)} characters, more than {MAX_TEXT_CHARS}")
        with self._encoding_lock:
            self._hf.encode_special_tokens = not parse_special   # the library's name: specials encoded as text
            return _tokenizers_call(f"{self._where}: encoding failed", self._hf.encode, text,
                                    add_special_tokens=add_special_tokens)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; ids past the vocabulary (padding rows of the model's output) decode to nothing."""
        try:
            ids = [int(i) for i in ids]
        except (TypeError, ValueError, OverflowError) as e:
            raise DiffuseError(f"decode: token ids must be integers: {e}") from e
        if any(i < 0 or i >= 1 << 32 for i in ids):
            raise DiffuseError(f"decode: token ids must be in [0, 2^32), got {min(ids)}..{max(ids)}")
        return _tokenizers_call(f"{self._where}: decoding failed", self._hf.decode, ids,
                                skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    # ---- chat ----

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render messages [{"role": ..., "content": ...}] with the model's chat template."""
        what = f"{self._where}: the model's chat template"
        if self.chat_template is None:
            raise DiffuseError(f"tokenizer from {self.source} has no chat template")
        if self._template is None:
            if len(self.chat_template) > _MAX_TEMPLATE_CHARS:
                raise DiffuseError(f"{what} has {len(self.chat_template)} characters, more than {_MAX_TEMPLATE_CHARS}")
            env = _GuardedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise_template_error
            try:
                self._template = env.from_string(self.chat_template)
            except Exception as e:   # TemplateSyntaxError; RecursionError on deeply nested expressions
                raise DiffuseError(f"{what} is invalid: {type(e).__name__}: {e}") from e
        bos = self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else ""
        given = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        env = self._template.environment
        env.budget.current = _Budget(_MAX_WORK_CHARS + 16 * given)
        try:
            out, size = [], 0
            for piece in self._template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                 bos_token=bos, eos_token=eos):
                size += len(piece)
                if size > MAX_TEXT_CHARS:
                    raise _TemplateLimit(f"produced more than {MAX_TEXT_CHARS} characters")
                out.append(piece)
            return "".join(out)
        except _TemplateLimit as e:
            raise DiffuseError(f"{what} {e}") from e
        except Exception as e:   # raise_exception(), undefined names, MemoryError, RecursionError, ...
            raise DiffuseError(f"{what} failed: {type(e).__name__}: {e}") from e
        finally:
            env.budget.current = None

    def encode_chat(self, prompt: str | list[dict]) -> list[int]:
        """Token ids of a conversation ready for the assistant's answer (BOS included when the
        template writes one): `prompt` is its messages, or the text of one user turn.

        Special tokens come from the chat template only: a special token's string anywhere in the
        messages (a content, a role) is encoded as text, as encode does."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        marks = _Marks(self._special_strings)
        text = self.apply_chat_template(marks.hide(messages))
        if not marks.used:     # nothing to put back: the rendered text, encoded whole as always
            return self.encode_with_special_tokens(text)
        # The template's special tokens where the library finds them (the users' strings are marks
        # now); the text between them, the users' strings put back, encoded as text in one piece each,
        # so that it splits into tokens as the library splits the text between special tokens.
        found = self._encoding(text, False, parse_special=True)
        special = self.special_tokens
        ids, start = [], 0
        for token, (begin, end) in zip(found.ids, found.offsets):
            if token in special:
                if begin > start:
                    ids += self.encode(marks.show(text[start:begin]))
                ids.append(token)
                start = end
        if start < len(text):
            ids += self.encode(marks.show(text[start:]))
        return ids

    def __repr__(self) -> str:
        return f"<diffuse.Tokenizer {self.vocab_size} tokens from {self.source}>"


class _Marks:
    """Stand-ins for special tokens' strings in the messages of a chat, so that the template renders
    them as it renders any text (it may trim or test a content) and `show` puts them back, to be
    encoded as text. A mark is private-use characters around a number, which no trim or case
    change alters, with a nonce drawn per chat, which no user can type in advance."""

    def __init__(self, specials: tuple[str, ...]):
        self.specials = specials
        self._open = f"\ue000{secrets.randbelow(10**9)}."
        self._pattern = re.compile(re.escape(self._open) + "(\\d+)\ue001")
        self.used = False

    def hide(self, value):
        """`value` (messages: dicts, lists, strings) with every special token's string marked."""
        if isinstance(value, str):
            for i, special in enumerate(self.specials):
                if special in value:
                    value = value.replace(special, f"{self._open}{i}\ue001")
                    self.used = True
            return value
        if isinstance(value, dict):
            return {self.hide(k): self.hide(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.hide(v) for v in value]
        return value

    def show(self, text: str) -> str:
        return self._pattern.sub(lambda m: self.specials[int(m.group(1))], text)


def _raise_template_error(message: str):
    raise jinja2.TemplateError(message)


# ---- hostile chat templates ----
# The sandbox blocks escapes but not cost. A render gets a deadline, a cap on loop iterations, on
# call depth (recursive macros), on the size of every value it makes and on the characters it makes
# in all; operations that allocate before we could look at the result are checked beforehand.

TEMPLATE_SECONDS = 2.0
_MAX_TEMPLATE_CHARS = 1 << 20        # template source (real ones are a few kB)
_MAX_VALUE = 1 << 20                 # characters of a string / items of a list made by the template
_MAX_WORK_CHARS = 64 << 20           # characters made by all operations of one render, plus 16x the messages
_MAX_ITERATIONS = 1_000_000          # loop iterations of one render, all loops together
_MAX_CALL_DEPTH = 64                 # nested calls: recursive macros
_MAX_INT_ARG = 100_000               # numbers given to calls and filters (widths, counts): jinja's range cap
_MAX_INT_BITS = 1 << 16              # integers the template computes
_SLOW_FILTERS = ("wordwrap", "urlize")   # superlinear or slow per character: 1M characters take seconds
_MAX_SLOW_FILTER_CHARS = 1 << 15
# a width, precision or count in a %-style or str.format format string that could be huge
_WIDE_FORMAT = re.compile(r"\d{6,}|%[-#0 +]*(\d*\.)?\*|\{[^{}]*:[^{}]*\{")


class _TemplateLimit(Exception):
    """A chat template went past one of the bounds above."""


class _Budget:
    def __init__(self, work_chars: int):
        self.deadline = time.monotonic() + TEMPLATE_SECONDS
        self.work = work_chars
        self.iterations = 0
        self.depth = 0


class _GuardedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox plus the bounds above. Loops and outputs are routed through guard filters by
    rewriting the parsed template (`_parse`); calls and the operators that can blow up are
    intercepted by the sandbox's own hooks; every stock filter is wrapped."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})   # also keeps them out of constant folding

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.budget = threading.local()   # renders on different threads (GUI, engine) share the template
        self.filters = {name: _guarded_filter(self, name, f) for name, f in self.filters.items()}
        self.filters["_diffuse_loop"] = _loop_guard
        self.filters["_diffuse_out"] = _output_guard
        self.filters["_diffuse_value"] = _value_guard

    def _parse(self, source, name, filename):
        return _AddGuards().visit(super()._parse(source, name, filename))

    def tick(self) -> _Budget | None:
        """The running render's budget after checking its deadline (None at compile time)."""
        b = getattr(self.budget, "current", None)
        if b is not None and time.monotonic() > b.deadline:
            raise _TemplateLimit(f"took longer than {TEMPLATE_SECONDS:g} s")
        return b

    def made(self, value):
        size = len(value) if isinstance(value, (str, list, tuple, dict)) else 0
        if size > _MAX_VALUE:
            raise _TemplateLimit(f"made a value of {size} characters or items, more than {_MAX_VALUE}")
        b = self.tick()
        if b is not None:
            b.work -= size
            if b.work < 0:
                raise _TemplateLimit("made too much text in all (a runaway loop?)")
        return value

    def call_binop(self, context, operator, left, right):
        self.tick()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > _MAX_VALUE:
                    raise _TemplateLimit(f"repeats a value {n} times, more than {_MAX_VALUE} characters or items")
            if isinstance(left, int) and isinstance(right, int):
                _check_int_bits(left.bit_length() + right.bit_length())
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            _check_int_bits(left.bit_length() * right)
        elif operator == "%" and isinstance(left, str):
            _check_format(left)
        return self.made(super().call_binop(context, operator, left, right))

    def call(self, context, obj, /, *args, **kwargs):
        b = self.tick()
        _check_int_args(args, kwargs)
        target = getattr(obj, "__wrapped__", obj)   # the sandbox wraps str.format
        receiver = getattr(target, "__self__", None)
        if isinstance(receiver, str):
            name = getattr(target, "__name__", "")
            if name in ("format", "format_map"):
                _check_format(receiver)
            elif name == "replace" and len(args) >= 2:
                _check_replace(receiver, args[0], args[1])
            elif name == "join" and args:
                _check_join(receiver, args[0])
        if b is not None:
            b.depth += 1
            if b.depth > _MAX_CALL_DEPTH:
                raise _TemplateLimit(f"nests calls more than {_MAX_CALL_DEPTH} deep (a recursive macro?)")
        try:
            return self.made(super().call(context, obj, *args, **kwargs))
        finally:
            if b is not None:
                b.depth -= 1


class _AddGuards(NodeTransformer):
    """Route every loop's iterable, every output expression and every ~ through the guard filters."""

    def visit_For(self, node):
        node = self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, "_diffuse_loop", [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node):   # a ~ b: builds a string the operator hooks do not see
        return nodes.Filter(self.generic_visit(node), "_diffuse_value", [], [], None, None, lineno=node.lineno)

    def visit_Output(self, node):
        node = self.generic_visit(node)
        node.nodes = [nodes.Filter(n, "_diffuse_out", [], [], None, None, lineno=n.lineno) for n in node.nodes]
        return node


@pass_context   # a context filter is never constant-folded, so it runs at render time
def _loop_guard(context, iterable):
    env = context.environment
    for item in iterable:
        b = env.tick()
        if b is not None:
            b.iterations += 1
            if b.iterations > _MAX_ITERATIONS:
                raise _TemplateLimit(f"ran more than {_MAX_ITERATIONS} loop iterations")
        yield item


@pass_context
def _value_guard(context, value):
    return context.environment.made(value)


@pass_context
def _output_guard(context, value):
    # counts what macros, {% set %} blocks and filter blocks buffer, not only what reaches the output
    return context.environment.made(str(value))


def _guarded_filter(env: _GuardedEnvironment, name: str, f):
    @functools.wraps(f)   # keeps jinja's pass_context/pass_eval_context marker
    def guarded(*args, **kwargs):
        _check_int_args(args, kwargs)
        values = [a for a in args if not isinstance(a, (jinja2.runtime.Context, nodes.EvalContext, jinja2.Environment))]
        if name == "replace" and len(values) >= 3:
            _check_replace(*values[:3])
        elif name == "join" and values:
            _check_join(values[1] if len(values) > 1 else kwargs.get("d", ""), values[0])
        elif name == "indent" and values:
            width = values[1] if len(values) > 1 else kwargs.get("width", 4)
            pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
            if isinstance(values[0], str):
                _check_size(len(values[0]) + values[0].count("\n") * pad, "indenting")
        elif name == "format" and values and isinstance(values[0], str):
            _check_format(values[0])
        elif name in _SLOW_FILTERS and values and len(str(values[0])) > _MAX_SLOW_FILTER_CHARS:
            raise _TemplateLimit(f"gives {len(str(values[0]))} characters to the {name} filter "
                                 f"(at most {_MAX_SLOW_FILTER_CHARS})")
        return env.made(f(*args, **kwargs))
    return guarded


def _check_int_args(args, kwargs) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, (int, float)) and abs(a) > _MAX_INT_ARG:
            raise _TemplateLimit(f"passes the number {a} to a function (more than {_MAX_INT_ARG})")


def _check_int_bits(bits: int) -> None:
    if bits > _MAX_INT_BITS:
        raise _TemplateLimit(f"computes a number of about {bits} bits, more than {_MAX_INT_BITS}")


def _check_format(fmt: str) -> None:
    if _WIDE_FORMAT.search(fmt):
        raise _TemplateLimit("uses a format string with a huge or computed width/precision")


def _check_size(size: int, doing: str) -> None:
    if size > _MAX_VALUE:
        raise _TemplateLimit(f"would make a string of more than {_MAX_VALUE} characters by {doing}")


def _check_replace(s, old, new) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        _check_size(len(s) + (s.count(old) if old else len(s) + 1) * len(new), "replacing")


def _check_join(sep, items) -> None:
    if isinstance(sep, str) and hasattr(items, "__len__"):
        _check_size(len(sep) * len(items), "joining")


# ---- hostile tokenizer.json files ----

MAX_TEXT_CHARS = 4 << 20      # longest text encode takes (and a chat template may produce)
_MAX_PIPELINE_STEPS = 64      # normalizers + pre-tokenizers + decoders, Sequence nesting counted
_MAX_PIPELINE_DEPTH = 8       # Sequence inside Sequence inside ...
_MAX_GROWTH = 16              # how many times Replace/Prepend steps together may lengthen a text
_MAX_VOCAB = 4 << 20          # vocabulary entries and merges (real ones have at most ~0.3M)


def _tokenizers_call(what: str, fn, *args, **kwargs):
    """fn(*args) with every failure of the tokenizers library as a DiffuseError: it raises plain
    Exception on bad input and pyo3's PanicException, a BaseException, when its Rust code panics
    (e.g. Oniguruma's retry limit on a backtracking split regex)."""
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        raise DiffuseError(f"{what}: {type(e).__name__}: {e}") from e


def _from_json(text: str, what: str) -> HFTokenizer:
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise DiffuseError(f"{what}: {e}") from e
    if not isinstance(spec, dict):
        raise DiffuseError(f"{what}: not a JSON object")
    _check_pipeline(spec, what)
    return _tokenizers_call(what, HFTokenizer.from_str, text)


def _check_pipeline(spec: dict, what: str) -> None:
    """Refuse what would make encode/decode blow up before the library sees it: Replace chains that
    double the text at every step grow it exponentially, deep Sequences and huge vocabularies."""
    steps, growth = 0, 1.0

    def walk(node, depth):
        nonlocal steps, growth
        if not isinstance(node, dict):
            return   # wrong types are the library's to reject
        steps += 1
        if steps > _MAX_PIPELINE_STEPS or depth > _MAX_PIPELINE_DEPTH:
            raise DiffuseError(f"{what}: more than {_MAX_PIPELINE_STEPS} normalizer/pre-tokenizer/decoder "
                               f"steps or Sequences nested deeper than {_MAX_PIPELINE_DEPTH}")
        kind, pattern = node.get("type"), node.get("pattern")
        if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str) and _backtracks(pattern["Regex"]):
            raise DiffuseError(f"{what}: the regex {pattern['Regex'][:200]!r} repeats a group that itself repeats "
                               f"or alternates; matching it can take exponential time")
        if kind == "Replace":
            content = node.get("content")
            literal = pattern.get("String") if isinstance(pattern, dict) else None
            shortest = len(literal) if isinstance(literal, str) else 1   # a regex may match one character
            if isinstance(content, str):
                growth *= max(1.0, len(content) / max(1, shortest))
        elif kind == "Prepend" and isinstance(node.get("prepend"), str):
            growth *= 1 + len(node["prepend"])   # worst case: before every character (a Split into single chars)
        for key in ("normalizers", "pretokenizers", "decoders"):   # a Sequence's steps
            children = node.get(key)
            for child in children if isinstance(children, list) else [children]:
                walk(child, depth + 1)

    for key in ("normalizer", "pre_tokenizer", "decoder"):
        walk(spec.get(key), 0)
    if growth > _MAX_GROWTH:
        raise DiffuseError(f"{what}: its Replace/Prepend steps can make a text {growth:.3g} times longer "
                           f"(at most {_MAX_GROWTH} allowed)")
    model = spec.get("model")
    if isinstance(model, dict):
        for key in ("vocab", "merges"):
            if hasattr(model.get(key), "__len__") and len(model[key]) > _MAX_VOCAB:
                raise DiffuseError(f"{what}: {len(model[key])} entries in model.{key}, more than {_MAX_VOCAB}")
    if hasattr(spec.get("added_tokens"), "__len__") and len(spec["added_tokens"]) > _MAX_VOCAB:
        raise DiffuseError(f"{what}: more than {_MAX_VOCAB} added tokens")


def _backtracks(pattern: str) -> bool:
    """Whether a regex repeats a group that itself holds a quantifier or an alternation, e.g.
    (a+)+b or (a|aa)*$: Oniguruma backtracks exponentially on those (real split patterns only
    quantify groups with `?`)."""
    inside = [False]   # per open group: holds a quantifier or |
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 1
        elif c == "[":                       # a character class: nothing in it counts
            i += 2 if pattern.startswith("[^]", i) or pattern.startswith("[]", i) else 1
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif c == "(":
            inside.append(False)
            if pattern.startswith("(?", i):  # (?: (?i: (?= ...: that ? is no quantifier
                i += 1
        elif c == ")" and len(inside) > 1:
            held = inside.pop()
            if held and _repeats(pattern, i + 1):
                return True
            inside[-1] = inside[-1] or held
        elif c in "*+?{|":
            inside[-1] = True
        i += 1
    return False


_BOUNDS = re.compile(r"\{(\d*)(,(\d*))?\}")   # {n} {n,} {n,m}


def _repeats(pattern: str, i: int) -> bool:
    """Whether the quantifier at pattern[i] (if any) allows more than one repetition."""
    if pattern[i:i + 1] in ("*", "+"):
        return True
    m = _BOUNDS.match(pattern, i)
    if m is None:
        return False
    most = m.group(3) if m.group(2) else m.group(1)
    return most == "" or int(most) > 1


def template_beside(json_path: Path) -> str | None:
    """The chat template of a Hugging Face folder (tokenizer_config.json beside tokenizer.json)."""
    config = json_path.parent / "tokenizer_config.json"
    try:
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return template if isinstance(template, str) else None


def _from_llama_cpp_arrays(path: Path, kv: dict) -> tuple[HFTokenizer, str]:
    """A BPE tokenizer from llama.cpp's tokenizer.ggml.{model,tokens,token_type,merges,pre}: byte-level
    ('gpt2') or Gemma 4's ('gemma4')."""
    model = kv.get("tokenizer.ggml.model")
    if model not in ("gpt2", "gemma4"):
        raise DiffuseError(f"{path}: llama.cpp tokenizer model '{model}' is not supported (only byte-level BPE, "
                           f"'gpt2', and Gemma 4's, 'gemma4'); pass the model's tokenizer.json instead")
    pre_name = "gemma4" if model == "gemma4" else kv.get("tokenizer.ggml.pre") or "default"
    pre = _PRE_TYPES.get(pre_name)
    if pre is None and model == "gpt2":
        raise DiffuseError(f"{path}: unknown llama.cpp pre-tokenizer '{pre_name}'; pass the model's "
                           f"tokenizer.json instead (diffuse.load(path, tokenizer=...) or --tokenizer)")
    tokens = kv["tokenizer.ggml.tokens"]
    merges = kv.get("tokenizer.ggml.merges")
    types = kv.get("tokenizer.ggml.token_type")
    if (not isinstance(tokens, list) or not isinstance(merges, list)
            or not all(isinstance(t, str) for t in tokens) or not all(isinstance(m, str) for m in merges)
            or (types is not None and (not hasattr(types, "__len__") or len(types) != len(tokens)))):
        raise DiffuseError(f"{path}: malformed tokenizer.ggml.* arrays")
    if len(tokens) > _MAX_VOCAB or len(merges) > _MAX_VOCAB:
        raise DiffuseError(f"{path}: {len(tokens)} tokens and {len(merges)} merges, more than {_MAX_VOCAB}")

    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)   # a repeated string keeps its first id
    pairs = []
    for m in merges:
        cut = m.find(" ", 1)     # a merge is "left right"; left is never empty
        if cut < 0:
            raise DiffuseError(f"{path}: malformed merge '{m}' in tokenizer.ggml.merges")
        pairs.append((m[:cut], m[cut + 1:]))
    what = f"{path}: inconsistent tokenizer.ggml vocabulary/merges"
    if model == "gemma4":
        hf = _gemma4(what, vocab, pairs)
    else:   # fails on a merge naming a token that is not in the vocabulary
        hf = HFTokenizer(_tokenizers_call(what, models.BPE, vocab=vocab, merges=pairs,
                                          ignore_merges=pre.ignore_merges))
        if pre.nfc:
            hf.normalizer = normalizers.NFC()
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        hf.decoder = decoders.ByteLevel()

    if types is not None:
        special = [tokens[i] for i, t in enumerate(types) if t in (_TOKEN_CONTROL, _TOKEN_UNKNOWN)]
        user = [tokens[i] for i, t in enumerate(types) if t == _TOKEN_USER_DEFINED]
        what = f"{path}: bad tokenizer.ggml tokens"
        _tokenizers_call(what, hf.add_special_tokens, [AddedToken(t, special=True, normalized=False) for t in special])
        _tokenizers_call(what, hf.add_tokens, [AddedToken(t, special=False, normalized=False) for t in user])

    bos = kv.get("tokenizer.ggml.bos_token_id")
    if kv.get("tokenizer.ggml.add_bos_token") is True and isinstance(bos, int) and 0 <= bos < len(tokens):
        hf.post_processor = _tokenizers_call(
            f"{path}: bad tokenizer.ggml.bos_token_id", processors.TemplateProcessing,
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], bos)])
    return hf, pre_name


def _gemma4(what: str, vocab: dict[str, int], pairs: list[tuple[str, str]]) -> HFTokenizer:
    """Gemma 4's BPE as llama.cpp reads a 'gemma4' vocabulary: spaces become U+2581, the text is
    split only into runs of newlines and runs of anything else, merges run by rank over raw UTF-8
    (no byte-level alphabet), a piece no merge reaches falls back to its <0xXX> byte tokens."""
    if any(f"<0x{b:02X}>" not in vocab for b in range(256)):
        raise DiffuseError(f"{what}: a 'gemma4' vocabulary needs the 256 byte tokens <0x00>..<0xFF>")
    hf = HFTokenizer(_tokenizers_call(what, models.BPE, vocab=vocab, merges=pairs, byte_fallback=True))
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), behavior="isolated")
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return hf
