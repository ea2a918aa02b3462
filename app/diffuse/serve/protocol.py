"""The OpenAI wire format: request bodies checked and turned into engine work, responses as JSON.

OpenAI's parameters map to the engine's options (`max_tokens` -> the answer's length, `temperature`,
`top_p`, `seed`); every other engine option (diffuse.generation.OPTIONS, except `gen_length`) is
accepted as an extra body field under its own name and checked by the engine's own validation;
`preset` names a published decoding mode (diffuse.generation.PRESETS) under the fields given.
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from diffuse import DiffuseError
from diffuse.generation import OPTION_NAMES, default_options, preset, resolve_options, schedule_check, whole_blocks

# Engine options a body may carry by name; the answer's length comes from max_tokens.
ENGINE_FIELDS = tuple(name for name in OPTION_NAMES if name != "gen_length")
COMMON_FIELDS = ("model", "max_tokens", "stop", "n", "stream", "stream_options", "diffusion_events", "preset")
FIELDS = {
    "chat": frozenset(COMMON_FIELDS + ENGINE_FIELDS + ("messages", "max_completion_tokens", "tools",
                                                       "tool_choice", "response_format")),
    "completion": frozenset(COMMON_FIELDS + ENGINE_FIELDS + ("prompt",)),
}
# OpenAI parameters that ask nothing of the model, which clients send by default or as a matter of
# course: checked for their type, then ignored (this server stores nothing, has one service tier,
# and makes no tool calls to run in parallel).
IGNORED = {"user": str, "metadata": dict, "store": bool, "service_tier": str, "parallel_tool_calls": bool,
           "prompt_cache_key": str, "safety_identifier": str}
# OpenAI parameters a diffusion model cannot honour: accepted at their neutral value only, so that
# clients which always send them keep working.
NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "top_logprobs": 0, "logit_bias": {},
           "echo": False, "best_of": 1, "suffix": "", "modalities": ["text"]}
# OpenAI's range for temperature: the engine takes up to 100 (the CLI's and the Studio's option).
MAX_TEMPERATURE = 2
# The JSON values (numbers, strings, lists, objects) a body may hold beyond its prompts' token ids,
# which can be --max-batch prompts of a whole context each: messages, options, stop strings.
SPARE_VALUES = 1 << 16
ROLES = ("system", "developer", "user", "assistant")
MAX_STOPS = 4       # OpenAI's limit
MAX_STOP_CHARS = 256   # each: held-back text is checked against every start of every stop string
# Unicode normalisation (NFC, NFKC: the tokenizers of these models) composes at most 4 code points
# into one (U+1F82 is 4 before NFC); every other step of a tokenizer's pipeline keeps or adds characters.
MAX_COMPOSED = 4
SEED_MOD = 2 ** 64
# A JSON string (with its escapes): found to count the structure outside strings.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


class BadRequest(Exception):
    """A request we refuse: becomes an OpenAI error body with this HTTP status."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.type = message, param, code, status, type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def shutting_down() -> BadRequest:
    return BadRequest("the server is shutting down", status=503, type="server_error", code="server_shutdown")


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class Request:
    kind: str                     # "chat" | "completion"
    prompts: list[list[int]]      # token ids, one list per prompt
    n: int                        # answers per prompt
    max_tokens: int               # the answer is cut here
    options: dict                 # resolved engine options; gen_length = max_tokens in whole blocks
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    diffusion_events: bool = False

    @property
    def n_sequences(self) -> int:
        return len(self.prompts) * self.n

    @property
    def seed(self) -> int:
        """The seed of the first answer (the client's, else the one drawn for it): reported with the
        answer, so that the client can ask for the same answer again."""
        return self.options["seed"]

    def prompt_of(self, sequence: int) -> list[int]:
        return self.prompts[sequence // self.n]

    def options_of(self, sequence: int) -> dict:
        """Choice j of a prompt samples with seed + j, so that n > 1 gives different answers."""
        j = sequence % self.n
        return {**self.options, "seed": (self.options["seed"] + j) % SEED_MOD}


def parse(raw: bytes, kind: str, model, max_batch: int) -> Request:
    """Check a body and build the engine's work; raises BadRequest with the offending parameter."""
    check_structure(raw, max_batch * model.n_ctx_train + SPARE_VALUES)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}   # null means "not given" in OpenAI's API
    for name, value in body.items():
        if name in IGNORED:
            if not isinstance(value, IGNORED[name]):
                raise BadRequest(f"Invalid type for '{name}': expected {_TYPE_NAMES[IGNORED[name]]}, but got "
                                 f"{json.dumps(value)[:40]}", param=name, code="invalid_type")
        elif name in NEUTRAL:
            if value != NEUTRAL[name]:
                raise BadRequest(f"Unsupported value: '{name}' does not support {json.dumps(value)[:40]} with this "
                                 f"server (a diffusion model). Only the default ({json.dumps(NEUTRAL[name])}) "
                                 "value is supported.", param=name, code="unsupported_value")
        elif name not in FIELDS[kind]:
            raise BadRequest(f"Unrecognized request argument supplied: {name}", param=name,
                             code="unknown_parameter")
    if kind == "chat":
        _no_tools(body)
    if "model" in body and not isinstance(body["model"], str):
        raise BadRequest("model must be a string", param="model")
    n = _int(body, "n", 1)
    if not 1 <= n <= max_batch:
        raise BadRequest(f"n must be in [1, {max_batch}] (this server's --max-batch; got {n})", param="n")
    stream = _bool(body, "stream", False)
    # include_obfuscation pads chunks against length side channels on shared networks: nothing to pad here.
    stream_options = body.get("stream_options", {})
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage", "include_obfuscation"}:
        raise BadRequest('stream_options must be an object like {"include_usage": true}', param="stream_options")
    if stream_options and not stream:
        raise BadRequest("stream_options is only allowed with stream: true", param="stream_options")
    include_usage = _bool(stream_options, "include_usage", False, "stream_options.include_usage")
    _bool(stream_options, "include_obfuscation", False, "stream_options.include_obfuscation")
    diffusion_events = _bool(body, "diffusion_events", False)
    if diffusion_events and not stream:
        raise BadRequest("diffusion_events needs stream: true", param="diffusion_events")
    stop = _stop(body.get("stop"))

    prompts = _chat_prompt(body, model) if kind == "chat" else _completion_prompts(body, model, n, max_batch)

    given = {name: body[name] for name in ENGINE_FIELDS if name in body}
    if "preset" in body:
        if not isinstance(body["preset"], str):
            raise BadRequest("preset must be a string", param="preset")
        try:
            given = {k: v for k, v in preset(body["preset"]).items() if k in ENGINE_FIELDS} | given
        except DiffuseError as e:
            raise BadRequest(str(e), param="preset") from None
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > MAX_TEMPERATURE:
        raise BadRequest(f"Invalid 'temperature': decimal above maximum value. Expected a value <= {MAX_TEMPERATURE},"
                         f" but got {temperature} instead.", param="temperature", code="decimal_above_max_value")
    for name, value in given.items():      # one at a time, so the error names its parameter
        try:
            resolve_options(model.arch, **{name: value})
        except DiffuseError as e:
            raise BadRequest(str(e), param=name) from None
    longest = max(len(p) for p in prompts)
    room = model.n_ctx_train - longest
    what = "messages" if kind == "chat" else "prompt"
    if room < 1:
        raise BadRequest(f"the prompt ({longest} tokens) leaves no room in the model's context of "
                         f"{model.n_ctx_train} positions", param=what, code="context_length_exceeded")
    try:
        options = resolve_options(model.arch, model.recipe, **given)    # over the file's recipe
    except DiffuseError as e:
        raise BadRequest(str(e)) from None
    length_name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if length_name in body:
        max_tokens = _int(body, length_name, 0)
        if max_tokens < 1:
            raise BadRequest(f"{length_name} must be at least 1 (got {max_tokens})", param=length_name)
        if (blocks := whole_blocks(max_tokens, options, model.arch)) > room:
            rounded = f", {blocks} in whole blocks of {options['block_length']}" if blocks != max_tokens else ""
            raise BadRequest(f"the prompt ({longest} tokens) + {length_name} ({max_tokens}{rounded}) exceeds the "
                             f"model's context of {model.n_ctx_train} positions", param=length_name,
                             code="context_length_exceeded")
    else:   # the model's default length, or as many whole blocks as the context leaves
        max_tokens = min(default_options(model.arch, model.recipe)["gen_length"], room)
        if whole_blocks(max_tokens, options, model.arch) > room:
            max_tokens = room // options["block_length"] * options["block_length"]
    try:
        gen_length = whole_blocks(max_tokens, options, model.arch)
        options = resolve_options(model.arch, **{**options, "gen_length": gen_length})
    except DiffuseError as e:
        raise BadRequest(str(e)) from None
    # what the engine's plan refuses on this model (mode ar on DiffusionGemma's canvases) is the
    # request's fault, said before the run rather than as the run's failure
    if refused := schedule_check(options, model.arch, hparams=model.hparams)[1]:
        raise BadRequest(refused)
    return Request(kind=kind, prompts=prompts, n=n, max_tokens=max_tokens, options=options, stop=stop,
                   stream=stream, include_usage=include_usage, diffusion_events=diffusion_events)


def _int(body: dict, name: str, default: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer (got {json.dumps(value)[:40]})", param=name)
    return value


def _bool(body: dict, name: str, default: bool, param: str | None = None) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"{param or name} must be true or false (got {json.dumps(value)[:40]})", param=param or name)
    return value


_TYPE_NAMES = {str: "a string", dict: "an object", bool: "a boolean"}


def check_structure(raw: bytes, max_values: int) -> None:
    """Refuse a body with more than max_values JSON values before parsing it: parsed, each one is a
    Python object (a 15 MB body of [[1],[1],...] is 330 MB of lists). Counted at C speed over the
    raw bytes: a value is one of its container's items, so there are at most 1 + commas + brackets
    and braces of them; strings are taken out first only when that bound says too many (a long
    text may hold many commas), after their quotes have shown that there are not too many of them."""
    def values(data: bytes) -> int:
        return 1 + data.count(b",") + data.count(b"[") + data.count(b"{")
    if values(raw) <= max_values:
        return
    message = f"the body holds more than {max_values} JSON values, more than any request this server can run needs"
    # Each string has two quotes that no backslash escapes (a quote after an escaped backslash is
    # not counted here either, so this is at most the number of strings).
    if (raw.count(b'"') - raw.count(b'\\"')) // 2 > max_values:
        raise BadRequest(message, code="too_many_values")
    if values(_JSON_STRING.sub(b"", raw)) > max_values:
        raise BadRequest(message, code="too_many_values")


def _no_tools(body: dict) -> None:
    """tools, tool_choice and response_format where this server can honour them: no tools called
    (tool_choice "none", or no tools), plain text. It cannot make tool calls or constrain an answer
    to JSON: its decoding has no grammar, and the model's text is not parsed for calls."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and not (isinstance(tools, list) and tools and all(isinstance(t, dict) for t in tools)):
        raise BadRequest("Invalid 'tools': expected a non-empty array of tool objects", param="tools")
    if choice not in (None, "none", "auto", "required") and not isinstance(choice, dict):
        raise BadRequest(f"Invalid value for 'tool_choice': {json.dumps(choice)[:40]}. Supported values are: "
                         "'none', 'auto', 'required' and a named function.", param="tool_choice",
                         code="invalid_value")
    if tools and choice != "none":
        raise BadRequest("Unsupported parameter: 'tools' is not supported by this server: it cannot turn the "
                         "model's output into tool calls. Send tool_choice: \"none\" to answer in text.",
                         param="tools", code="unsupported_parameter")
    if not tools and choice not in (None, "none", "auto"):
        raise BadRequest("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                         "specified.", param="tool_choice", code="invalid_value")
    response_format = body.get("response_format", {"type": "text"})
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind != "text":
        if kind in ("json_object", "json_schema"):
            raise BadRequest(f"Unsupported value: 'response_format.type' does not support '{kind}' with this server"
                             ": its decoding cannot constrain the answer to JSON. Only 'text' is supported.",
                             param="response_format.type", code="unsupported_value")
        raise BadRequest('Invalid \'response_format\': expected an object like {"type": "text"}',
                         param="response_format", code="invalid_value")


def _stop(value) -> list[str]:
    stops = [value] if isinstance(value, str) else value if value is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop must be a non-empty string or a list of non-empty strings", param="stop")
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"stop has {len(stops)} strings, at most {MAX_STOPS} are allowed", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise BadRequest(f"a stop string has more than {MAX_STOP_CHARS} characters", param="stop")
    for s in stops:
        _unicode(s, "stop")
    return stops


@functools.lru_cache(maxsize=4)
def _chars_per_token(tokenizer) -> int:
    """The most characters of a text that one token can stand for: its longest token string (a
    byte-level vocabulary spells each byte as one character, so this also bounds code points),
    times MAX_COMPOSED for normalisation."""
    longest = max((len(tokenizer.id_to_token(i) or "") for i in range(tokenizer.vocab_size)), default=1)
    return MAX_COMPOSED * max(longest, 1)


def _fits(chars: int, model, what: str) -> None:
    """Refuse, before tokenising, text that has more tokens than the context has positions: each
    token stands for at most _chars_per_token characters. This bounds a request's tokenizer work
    (and memory) by the model's context instead of the body's size. (A tokenizer that drops
    characters, e.g. one splitting on whitespace, could fit more: such text is refused too.)"""
    limit = model.n_ctx_train * _chars_per_token(model.tokenizer)
    if chars > limit:
        raise BadRequest(f"the {what} has {chars} characters, more than the {limit} that the model's context of "
                         f"{model.n_ctx_train} positions can hold", param=what, code="context_length_exceeded")


def _unicode(text: str, param: str) -> str:
    """JSON may spell lone UTF-16 surrogates ("\\ud800"), which are no Unicode text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(f"{param} holds a lone surrogate (U+{ord(text[e.start]):04X} at character {e.start}), "
                         "which is not valid Unicode text", param=param) from None
    return text


def _tokenizer_refused(e: DiffuseError, model, param: str) -> BadRequest:
    """The tokenizer's refusal (a chat template's raise_exception, ...) without the server's file
    paths, which its messages name."""
    message = str(e)
    for path in (model.path, model.tokenizer.source):
        message = message.replace(path, Path(path).name)
    return BadRequest(message, param=param)


def _chat_prompt(body: dict, model) -> list[list[int]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects", param="messages")
    plain = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, dict) and (m.get("role") in ("tool", "function") or m.get("tool_calls")):
            raise BadRequest(f"{where} is a tool call or its result: tools are not supported by this server",
                             param=where, code="unsupported_value")
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"{where} must be an object with a role among {', '.join(ROLES)}", param=where)
        plain.append({"role": "system" if m["role"] == "developer" else m["role"], "content": _content(m, where)})
    if not any(m["content"].strip() for m in plain):
        raise BadRequest("the prompt is empty: every message's content is blank", param="messages")
    _fits(sum(len(m["content"]) for m in plain), model, "messages")   # a chat template renders each in full
    for i, m in enumerate(plain):
        _unicode(m["content"], f"messages[{i}].content")
    try:
        return [model.tokenizer.encode_chat(plain)]
    except DiffuseError as e:
        raise _tokenizer_refused(e, model, "messages") from None


def _content(message: dict, where: str) -> str:
    """A message's text: a string, or a list of text parts (images and audio are not for this model)."""
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, dict) else None
            if kind in _MEDIA_PARTS:
                raise BadRequest(f"{where}.content[{j}] is {_MEDIA_PARTS[kind]} (type {kind!r}): diffuse runs "
                                 "text models only (a DiffusionGemma file holds no vision tower); send text parts",
                                 param=f"{where}.content[{j}]")
        if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
    raise BadRequest(f"{where}.content must be a string or a list of text parts", param=f"{where}.content")


# Content parts that carry media (OpenAI's chat and Responses names, and transformers' chat format).
_MEDIA_PARTS = {"image_url": "an image", "input_image": "an image", "image": "an image",
                "input_audio": "audio", "audio": "audio", "video": "a video", "file": "a file", "input_file": "a file"}


def _completion_prompts(body: dict, model, n: int, max_batch: int) -> list[list[int]]:
    """A prompt is text or token ids; `prompt` is one of those or a list of them. Every check that
    needs no tokenizer comes first."""
    prompt = body.get("prompt")
    many = isinstance(prompt, list) and bool(prompt) and all(isinstance(p, (str, list)) for p in prompt)
    prompts = prompt if many else [prompt]
    if len(prompts) * n > max_batch:
        raise BadRequest(f"{len(prompts)} prompts x n={n} answers is more than this server's --max-batch "
                         f"({max_batch})", param="n")
    for p in prompts:
        if not (isinstance(p, str) or (isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                                                  for t in p))):
            raise BadRequest("prompt must be a string, a list of token ids, or a list of those", param="prompt")
        if isinstance(p, str):
            _fits(len(p), model, "prompt")
            _unicode(p, "prompt")
        elif len(p) > model.n_ctx_train:
            raise BadRequest(f"the prompt has {len(p)} token ids, more than the model's context of "
                             f"{model.n_ctx_train} positions", param="prompt", code="context_length_exceeded")
    out = []
    for p in prompts:
        try:
            out.append(model.encode_prompt(p, chat=False))
        except DiffuseError as e:
            raise _tokenizer_refused(e, model, "prompt") from None
    return out


# ---- responses ----

def usage(prompt_tokens: int, completion_tokens: int, forward_passes: int = 0) -> dict:
    """OpenAI's counts, and the forward passes where the engine counts them (modes ar and self_spec,
    Nemotron's diffusion: GenerateResult.forward_passes, summed over the request's answers)."""
    counts = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
              "total_tokens": prompt_tokens + completion_tokens}
    return counts | ({"forward_passes": forward_passes} if forward_passes else {})


# A finished choice also carries the engine's stop reason (events.STOP_REASONS), diffuse's own
# field beside OpenAI's finish_reason: diffuse.remote gives it to the rebuilt run.
def choice(kind: str, index: int, text: str, finish_reason: str | None, stop_reason: str | None = None) -> dict:
    extra = {"stop_reason": stop_reason} if stop_reason else {}
    if kind == "chat":
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish_reason, **extra}
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason, **extra}


def delta(kind: str, index: int, text: str | None, finish_reason: str | None = None, role: bool = False,
          stop_reason: str | None = None) -> dict:
    extra = {"stop_reason": stop_reason} if stop_reason else {}
    if kind == "chat":
        d = {"role": "assistant"} if role else {}
        if text is not None:
            d["content"] = text
        return {"index": index, "delta": d, "logprobs": None, "finish_reason": finish_reason, **extra}
    return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason, **extra}


def envelope(kind: str, rid: str, created: int, model_id: str, choices: list[dict], stream: bool, **extra) -> dict:
    obj = {"chat": ("chat.completion", "chat.completion.chunk"), "completion": ("text_completion",) * 2}[kind]
    return {"id": rid, "object": obj[stream], "created": created, "model": model_id, "choices": choices, **extra}


def step_event(index: int, ev, pieces: dict[int, str], eos_ids: list[int] | None = None) -> dict:
    """One denoising step of answer `index`, enough for every live view of a client (diffuse.remote
    rebuilds the StepEvent): positions relative to the answer, NaN -> null. The prompt stays on the
    server: `active`, `cached` (and the rows of MoE `experts`) list the answer's positions only, and
    `block_start` is negative when the block began in the prompt. `pieces` are the texts of the
    tokens this event brings that the client has not had; `eos_ids` come with an answer's first event.
    Uniform-state diffusion (DiffusionGemma) adds the argmax draft of the canvas, the re-drawn
    positions (`unmasked`: the accepted ones) and the entropy cut (StepEvent's fields); WeDLM its
    window_order and committed; self-speculation its spec_draft (token ids) and spec_accepted."""
    p = ev.prompt_length
    active, cached = np.asarray(ev.active, np.int64), np.asarray(ev.cached, np.int64)
    d = {"index": index, "step": ev.step, "block": ev.block, "n_blocks": ev.n_blocks,
         "steps_allowed": ev.steps_allowed, "scheduled": int(ev.scheduled),
         "block_start": int(ev.block_start) - p, "block_end": int(ev.block_end) - p,
         "tokens": ev.gen_tokens.tolist(), "mask": ev.gen_mask.tolist(),
         "unmasked": [int(i) - p for i in ev.unmasked], "edited": [int(i) - p for i in ev.edited],
         "entropy": _rounded(ev.entropy[p:]), "confidence": _rounded(ev.confidence[p:]),
         "active": (active[active >= p] - p).tolist(), "cached": (cached[cached >= p] - p).tolist(),
         "pieces": {str(t): text for t, text in pieces.items()},
         "forward_ms": round(ev.forward_ms, 3), "sample_ms": round(ev.sample_ms, 3), "total_ms": round(ev.total_ms, 3)}
    if eos_ids is not None:
        d["eos_ids"] = eos_ids
    if ev.draft is not None:   # uniform-state diffusion (DiffusionGemma): argmax draft, re-drawn positions, cut
        d |= {"draft": ev.draft.tolist(), "redrawn": [int(i) - p for i in ev.redrawn],
              "entropy_cut": round(float(ev.entropy_cut), 4)}
    if ev.experts is not None:
        d["experts"] = np.asarray(ev.experts)[:, active >= p].tolist()
    if ev.window_order is not None:   # WeDLM: the window in its pass's order, the positions it committed
        d |= {"window_order": [int(i) - p for i in ev.window_order], "committed": [int(i) - p for i in ev.committed]}
    if ev.spec_draft is not None:     # self-speculation: the block as drafted, the drafts the verify pass kept
        d |= {"spec_draft": ev.spec_draft.tolist(), "spec_accepted": int(ev.spec_accepted)}
    return d


def _rounded(values) -> list[float | None]:
    """Entropies and probabilities to 4 places (what a view can show), NaN (not evaluated) as null."""
    return [None if math.isnan(x) else round(x, 4) for x in values.tolist()]
