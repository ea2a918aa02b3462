"""A model behind an OpenAI-compatible server, run like a local one: `diffuse generate --server URL`
and the Studio's "Connect to server…" both call `RemoteModel.generate`.

Past one machine, people serve diffusion models (LLaDA2, SDAR, DiffusionGemma, ...) with SGLang or
vLLM; any such server streams text. `diffuse serve` (its /v1/models entries say owned_by "diffuse")
also streams one step event per denoising step when asked (`diffusion_events`, see
diffuse/serve/protocol.py's step_event): those are rebuilt here into StepEvents, so the CLI live view
and the Studio views work as for a local model. Only `diffuse serve` is sent the engine's own options;
any other server gets OpenAI's fields (max_tokens, temperature, top_p, seed) and the rest are named in
`RemoteModel.not_sent`.

Standard library only (http.client). A server is not trusted: every read has a timeout, a stream
with no event for that long ends the run, and an event's size and a stream's total are bounded, so
a huge or endless answer cannot take the client's memory. Every failure is one DiffuseError line.
"""
from __future__ import annotations

import http.client
import json
import math
import os
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Callable, Iterator
from urllib.parse import urlsplit

import numpy as np

from diffuse import DiffuseError
from diffuse.events import STOP_REASONS, GenerateResult, StepEvent

KEY_ENV = ("DIFFUSE_API_KEY", "OPENAI_API_KEY")    # where a key is looked for, first found wins
TIMEOUT_S = 120.0             # to connect, for each read, and between two events of a stream
MAX_EVENT_BYTES = 8 << 20     # one server-sent event (diffuse serve's step event of 1024 positions: ~25 kB)
MAX_STREAM_BYTES = 512 << 20  # one answer's whole stream: its step events are kept for the views
MAX_REPLY_BYTES = 4 << 20     # a JSON answer that is not a stream (/v1/models, errors)
READ_CHUNK = 64 << 10
# OpenAI's own request fields that every server understands; the engine's other options go to
# `diffuse serve` only.
# Step-event fields the views read beyond the ones diffuse serve has always sent, and what lacks
# without them (see RemoteModel.unsent).
STEP_EXTRAS = {"pieces": "token texts (tokens show as <id>)",
               "confidence": "top-1 probabilities (the heatmap's probability mode, confidence thresholds)",
               "scheduled": "the schedule's count per step (which commits tau added)",
               "block_start": "block bounds (equal blocks over the answer are assumed)",
               "active": "which positions were recomputed or cached (the Cache view)"}
OPENAI_OPTIONS = {"gen_length": "max_tokens", "temperature": "temperature", "top_p": "top_p", "seed": "seed"}


def api_key_from_env() -> str | None:
    return next((os.environ[name] for name in KEY_ENV if os.environ.get(name)), None)


@dataclass(frozen=True)
class Endpoint:
    """A server's OpenAI base URL, checked: http(s)://host[:port]/prefix (the prefix defaults to /v1)."""
    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        text = url.strip()
        if "://" not in text:
            text = "http://" + text          # "localhost:8080" as people type it
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as e:
            raise DiffuseError(f"{url!r} is not a server URL ({e}); give one like http://localhost:8080/v1") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DiffuseError(f"{url!r} is not a server URL; give one like http://localhost:8080/v1")
        if parts.username or parts.password:
            raise DiffuseError(f"{url!r}: put the key in --api-key (or $DIFFUSE_API_KEY), not in the URL")
        if parts.query or parts.fragment:
            raise DiffuseError(f"{url!r}: a server URL has no ?query or #fragment; give one like http://localhost:8080/v1")
        prefix = parts.path.rstrip("/") or "/v1"
        for end in ("/chat/completions", "/completions", "/models"):    # an endpoint's URL pasted whole
            prefix = prefix[:-len(end)] if prefix.endswith(end) else prefix
        return cls(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), prefix)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return f"{self.scheme}://{host}{'' if self.port == default else f':{self.port}'}{self.prefix}"

    @property
    def local(self) -> bool:
        return self.host in ("localhost", "127.0.0.1", "::1")


class Connection:
    """Requests to one server: JSON answers and event streams, every failure a one-line DiffuseError."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = TIMEOUT_S):
        self.endpoint = Endpoint.parse(url)
        if api_key is not None and (not api_key.isprintable() or not api_key.strip()):
            raise DiffuseError("the API key is empty or holds a control character (a pasted newline?)")
        self.api_key = api_key.strip() if api_key else None
        if not 0 < timeout < math.inf:
            raise DiffuseError(f"the timeout must be a positive number of seconds (got {timeout})")
        self.timeout = timeout

    @property
    def url(self) -> str:
        return self.endpoint.url

    def get(self, path: str) -> dict:
        conn, response = self._open("GET", path)
        try:
            return self._json(response, path)
        finally:
            conn.close()

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """POST `body` and yield each event's JSON until [DONE] (a JSON answer, from a server that
        does not stream, is yielded once). Closing the generator closes the connection, which
        `diffuse serve` and the other engines take as a cancel."""
        conn, response = self._open("POST", path, body)
        try:
            kind = response.getheader("Content-Type", "").partition(";")[0].strip().lower()
            if kind != "text/event-stream":
                yield self._json(response, path)
                return
            yield from self._events(response, path)
        finally:
            conn.close()

    # -- the wire ----------------------------------------------------------------------------

    def _open(self, method: str, path: str, body: dict | None = None):
        e = self.endpoint
        cls = http.client.HTTPSConnection if e.scheme == "https" else http.client.HTTPConnection
        conn = cls(e.host, e.port, timeout=self.timeout)
        headers = {"Accept": "application/json, text/event-stream", "User-Agent": "diffuse"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, e.prefix + path, body=data, headers=headers)
            response = conn.getresponse()
        except BaseException as exc:
            conn.close()
            raise self._failure(exc) from None
        if response.status != 200:
            try:
                raise self._refusal(response, path, body)
            finally:
                conn.close()
        return conn, response

    def _failure(self, exc: BaseException) -> BaseException:
        where = f"{self.endpoint.host}:{self.endpoint.port}"
        if isinstance(exc, ConnectionRefusedError):
            return DiffuseError(f"cannot connect to {where}: connection refused (is the server running, on that port?)")
        if isinstance(exc, socket.gaierror):
            return DiffuseError(f"cannot find the host {self.endpoint.host}: {exc.strerror}")
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return DiffuseError(f"{self.url}: no answer within {self.timeout:g} s (the server stalls)")
        if isinstance(exc, ssl.SSLError):
            return DiffuseError(f"{self.url}: the TLS connection failed: {exc.reason or exc}")
        if isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
            return DiffuseError(f"{self.url}: the server closed the connection without an answer")
        if isinstance(exc, http.client.HTTPException):
            return DiffuseError(f"{self.url}: not an HTTP server's answer ({type(exc).__name__}: {str(exc)[:80]})")
        if isinstance(exc, OSError):
            return DiffuseError(f"cannot connect to {where}: {exc.strerror or exc}")
        return exc      # not a network failure (KeyboardInterrupt, a bug): as it is

    def _read(self, response, limit: int) -> bytes:
        try:
            data = response.read(limit + 1)
        except BaseException as exc:
            raise self._failure(exc) from None
        if len(data) > limit:
            raise DiffuseError(f"{self.url}: the server's answer is larger than {limit >> 20} MiB; not read")
        return data

    def _json(self, response, path: str) -> dict:
        data = self._read(response, MAX_REPLY_BYTES)
        value = _json_object(data)
        if value is None:
            raise DiffuseError(f"{self.url}{path} did not answer as an OpenAI-compatible server does "
                               f"({_snippet(response, data)})")
        return value

    def _refusal(self, response, path: str, body: dict | None) -> DiffuseError:
        try:
            data = response.read(MAX_REPLY_BYTES)      # the start of an error page says enough
        except BaseException as exc:
            raise self._failure(exc) from None
        message = _error_message(data) or _snippet(response, data)
        status = f"{response.status} {response.reason}".strip()
        if response.status in (401, 403):
            hint = "" if self.api_key else "; give it with --api-key or $DIFFUSE_API_KEY ($OPENAI_API_KEY)"
            return DiffuseError(f"{self.url}: the server refused the API key ({status}: {message}){hint}")
        if response.status == 404 and body and "model" in message.lower():
            return DiffuseError(f"{self.url}: no model {body.get('model')!r} there ({message})")
        if response.status in (404, 405):
            return DiffuseError(f"{self.url}{path}: {status} ({message}); is {self.url} an OpenAI-compatible API? "
                                "Its URL usually ends in /v1")
        return DiffuseError(f"{self.url}: the server answered {status}: {message}")

    def _events(self, response, path: str) -> Iterator[dict]:
        """Server-sent events (the `data:` lines of each), bounded in size and spaced by at most
        `timeout` seconds (a server that sends a byte a minute stalls as surely as one that sends none)."""
        buffer, data, total, size = b"", [], 0, 0
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                chunk = response.read1(READ_CHUNK)
            except BaseException as exc:
                raise self._failure(exc) from None
            if not chunk:
                raise DiffuseError(f"{self.url}: the server closed the stream before the answer ended")
            total += len(chunk)
            if total > MAX_STREAM_BYTES:
                raise DiffuseError(f"{self.url}: the answer's stream passed {MAX_STREAM_BYTES >> 20} MiB; stopped "
                                   "reading it")
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > MAX_EVENT_BYTES:
                raise DiffuseError(f"{self.url}: the server sent an event over {MAX_EVENT_BYTES >> 20} MiB")
            for line in lines:
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    data.append(line[5:].removeprefix(b" "))
                    size += len(data[-1])
                    if size > MAX_EVENT_BYTES:
                        raise DiffuseError(f"{self.url}: the server sent an event over {MAX_EVENT_BYTES >> 20} MiB")
                elif not line and data:         # a blank line ends an event
                    text, data, size = b"\n".join(data), [], 0
                    if text.strip() == b"[DONE]":
                        return
                    value = _json_object(text)
                    if value is None:
                        raise DiffuseError(f"{self.url}{path}: the stream holds an event that is not OpenAI's "
                                           f"JSON ({text[:60].decode('utf-8', 'replace')!r})")
                    deadline = time.monotonic() + self.timeout
                    yield value
            if time.monotonic() > deadline:
                raise DiffuseError(f"{self.url}: no event from the server in {self.timeout:g} s (it stalls)")


def _error_message(data: bytes) -> str | None:
    """OpenAI's {"error": {"message": ...}} (or {"error": "..."}, {"message": ...}, {"detail": ...})."""
    value = _json_object(data)
    if value is None:
        return None
    error = value.get("error", value)
    message = error.get("message") or error.get("detail") if isinstance(error, dict) else error
    return " ".join(str(message).split())[:300] if message else None


def _json_object(data: bytes) -> dict | None:
    """`data` as a JSON object; None for anything else (not JSON, too deep, a list or a number)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _snippet(response, data: bytes) -> str:
    kind = response.getheader("Content-Type", "") or "no content type"
    text = " ".join(data[:200].decode("utf-8", "replace").split())
    return f"{kind}: {text[:80]!r}" if text else f"{kind}, empty"


# ---- the model -------------------------------------------------------------------------------

class RemoteModel:
    """One model of an OpenAI-compatible server. `generate` runs like diffuse.Model.generate: on
    `diffuse serve` with a StepEvent per step (positions relative to the answer: prompt_length 0,
    since the prompt's tokens stay on the server); elsewhere text only (`steps_sent` False)."""

    def __init__(self, connection: Connection, entry: dict, served: tuple[str, ...] = ()):
        self.connection, self.id = connection, entry["id"]
        self.owned_by = str(entry.get("owned_by") or "")
        self.served = served or (self.id,)
        self.steps_sent = self.owned_by == "diffuse"    # diffuse serve streams step events
        # What diffuse serve tells of its model in the entry's "diffuse" object (arch, n_ctx_train,
        # recipe, n_expert, eos_ids): the Studio's settings show its defaults from it.
        info = entry.get("diffuse") if isinstance(entry.get("diffuse"), dict) else {}
        self.arch: str | None = info.get("arch") if isinstance(info.get("arch"), str) else None
        self.n_ctx_train: int = info.get("n_ctx_train") if isinstance(info.get("n_ctx_train"), int) else 0
        self.n_expert: int = info.get("n_expert") if isinstance(info.get("n_expert"), int) else 0
        self.recipe: dict = info.get("recipe") if isinstance(info.get("recipe"), dict) else {}
        self.tokenizer = RemoteTokenizer()
        self.tokenizer.learn(info)
        self.unsent: set[str] = set()       # STEP_EXTRAS keys missing from the last step event

    @classmethod
    def connect(cls, url: str, api_key: str | None = None, model: str | None = None,
                timeout: float = TIMEOUT_S) -> RemoteModel:
        """The server's model `model` (default: the first it lists), checked against /v1/models."""
        conn = Connection(url, api_key, timeout)
        listed = list_models(conn)
        if not listed:
            raise DiffuseError(f"{conn.url}: the server lists no models")
        found = [m for m in listed if model is None or m["id"] == model]
        if not found:
            names = ", ".join(m["id"] for m in listed[:10]) + (", ..." if len(listed) > 10 else "")
            raise DiffuseError(f"{conn.url}: no model {model!r} there; it serves {names}")
        return cls(conn, found[0], tuple(m["id"] for m in listed))

    @property
    def url(self) -> str:
        return self.connection.url

    @property
    def server_kind(self) -> str:
        return "diffuse serve" if self.steps_sent else (f"{self.owned_by} server" if self.owned_by
                                                         else "OpenAI-compatible server")

    def views_note(self) -> str:
        """What the views cannot show for this server's runs, in a sentence ("" when nothing)."""
        if not self.steps_sent:
            return (f"{self.id} on a {self.server_kind} ({self.url}) sends text only, no denoising steps: "
                    "the step views have nothing to draw")
        if not self.unsent:
            return ""
        return f"{self.url} does not send " + "; ".join(STEP_EXTRAS[k] for k in STEP_EXTRAS if k in self.unsent)

    def not_sent(self, options: dict) -> list[str]:
        """The options given (not None) that this server is not sent: all but OpenAI's own, unless
        it is diffuse serve."""
        if self.steps_sent:
            return []
        return [k for k, v in options.items() if v is not None and k not in OPENAI_OPTIONS]

    def request(self, prompt, chat: bool, options: dict) -> tuple[str, dict]:
        """The endpoint and body for a prompt (text, token ids, or chat messages) and options."""
        body: dict = {"model": self.id, "stream": True, "stream_options": {"include_usage": True}}
        if chat:
            messages = prompt if _is_messages(prompt) else [{"role": "user", "content": prompt}]
            if not all(isinstance(m.get("content"), str) for m in messages):
                raise DiffuseError("a chat needs text messages; token ids go with chat off")
            path, body["messages"] = "/chat/completions", messages
        else:
            path, body["prompt"] = "/completions", prompt
        for name, value in options.items():
            if value is None:
                continue
            if name in OPENAI_OPTIONS:
                body[OPENAI_OPTIONS[name]] = value
            elif self.steps_sent:
                body[name] = value
        if self.steps_sent:
            body["diffusion_events"] = True
        return path, body

    def generate(self, prompt, *, chat: bool = True, on_step: Callable[[StepEvent], bool | None] | None = None,
                 on_text: Callable[[str], bool | None] | None = None, **options) -> GenerateResult:
        """The answer to `prompt` (text, token ids with chat=False, or a chat's messages). on_step
        gets each StepEvent (diffuse serve only), on_text each piece of final text; either
        returning False cancels (the connection is closed: the server stops at its next step)."""
        if isinstance(prompt, str) and not prompt.strip():
            raise DiffuseError("the prompt is empty")
        path, body = self.request(prompt, chat, options)
        run = _Answer(self)
        started = time.perf_counter()
        events = self.connection.stream(path, body)
        try:
            for value in events:
                if not run.take(value, on_step, on_text):
                    run.cancelled = True
                    break
        finally:
            events.close()
        if not run.cancelled and run.finish_reason is None:
            raise DiffuseError(f"{self.url}: the stream ended without a finish_reason; the answer is incomplete")
        return run.result((time.perf_counter() - started) * 1000)

    def __repr__(self) -> str:
        return f"RemoteModel({self.id!r} at {self.url}, {self.server_kind})"


def list_models(conn: Connection) -> list[dict]:
    """The entries of /v1/models ({"id", "owned_by", ...} each)."""
    answer = conn.get("/models")
    data = answer.get("data")
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
        raise DiffuseError(f"{conn.url}/models did not answer as an OpenAI-compatible server does (no data list "
                           "of models with ids)")
    return data


def _is_messages(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


class RemoteTokenizer:
    """What a client knows of the server's tokenizer: the token texts and end-of-text ids its step
    events sent (diffuse serve's `pieces` and `eos_ids`); the views and the live view decode with it.
    Each answer's events bring the texts of all of its tokens and its end-of-text ids, so the
    latest answer's are right also after the server switched models."""

    chat_template = None        # the server applies its own

    def __init__(self):
        self.pieces: dict[int, str] = {}
        self.eos_token_ids: set[int] = set()
        self.special_tokens: dict[int, str] = {}

    def learn(self, d: dict) -> None:
        pieces, eos = d.get("pieces", {}), d.get("eos_ids", [])
        if isinstance(pieces, dict):
            self.pieces.update({int(k): str(v) for k, v in pieces.items()})
        if isinstance(eos, list) and eos:
            self.eos_token_ids = {int(t) for t in eos}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The token texts as sent (an id the server sent no text for shows as <id>)."""
        return "".join(self.pieces.get(int(t), f"<{int(t)}>") for t in ids
                       if not (skip_special_tokens and int(t) in self.eos_token_ids))


class _Answer:
    """One streamed answer (choice 0) as it arrives: its text, step events, finish and usage."""

    def __init__(self, model: RemoteModel):
        self.model = model
        self.text = ""
        self.events: list[StepEvent] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None     # the engine's, where diffuse serve sends it
        self.usage: dict = {}
        self.cancelled = False

    def take(self, value: dict, on_step, on_text) -> bool:
        """One event of the stream; False when a listener cancels."""
        if "error" in value:     # diffuse serve's failed stream: an error event, then [DONE]
            raise DiffuseError(f"{self.model.url}: the server failed: {_error_message(json.dumps(value).encode())}")
        keep = True
        if isinstance(value.get("diffusion"), dict) and value["diffusion"].get("index", 0) == 0:
            event = self.step(value["diffusion"])
            self.events.append(event)
            if on_step is not None:
                keep = on_step(event) is not False
        usage = value.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = value.get("choices")
        for c in choices if isinstance(choices, list) else ():
            if not isinstance(c, dict) or c.get("index", 0) != 0:
                continue
            # a stream's delta, or a whole answer (a server that did not stream)
            part = c.get("delta") or c.get("message") or {}
            text = part.get("content") if isinstance(part, dict) else None
            if text is None and isinstance(c.get("text"), str):     # /v1/completions
                text = c["text"]
            if isinstance(text, str) and text:
                self.text += text
                if on_text is not None:
                    keep = (on_text(text) is not False) and keep
            if isinstance(c.get("finish_reason"), str):
                self.finish_reason = c["finish_reason"]
            if c.get("stop_reason") in STOP_REASONS:
                self.stop_reason = c["stop_reason"]
        return keep

    def step(self, d: dict) -> StepEvent:
        """diffuse serve's step event (protocol.step_event) as a StepEvent of the answer alone."""
        try:
            tokens = np.asarray(d["tokens"], np.int32)
            n = tokens.shape[0]
            mask = np.asarray(d["mask"], bool)
            entropy = np.array([math.nan if x is None else x for x in d["entropy"]], np.float32)
            confidence = np.array([math.nan if x is None else x for x in d.get("confidence", [None] * n)],
                                  np.float32)
            unmasked = np.asarray(d["unmasked"], np.int32)
            edited = np.asarray(d.get("edited", []), np.int32)
            n_blocks, block = int(d["n_blocks"]), int(d["block"])
            shapes_ok = (tokens.ndim == 1 and mask.shape == (n,) and entropy.shape == (n,)
                         and confidence.shape == (n,) and unmasked.ndim == 1 and edited.ndim == 1
                         and 0 <= block < n_blocks and all(((a >= 0) & (a < n)).all() for a in (unmasked, edited)))
            if not shapes_ok:
                raise ValueError("positions or lengths that do not fit the answer")
            start, end = _block_bounds(d, block, n_blocks, n)
            active, cached = _positions(d.get("active"), n), _positions(d.get("cached"), n)
            experts = None
            if d.get("experts") is not None:      # MoE: (n_layer, len(active), k)
                experts = np.asarray(d["experts"], np.int32)
                if experts.ndim != 3 or experts.shape[1] != len(active):
                    raise ValueError("experts that do not fit the active positions")
            self.model.tokenizer.learn(d)
            self.model.unsent = {k for k in STEP_EXTRAS if k not in d or (k == "active" and not isinstance(d[k], list))}
            return StepEvent(step=int(d["step"]), block=block, n_blocks=n_blocks,
                             steps_allowed=int(d["steps_allowed"]), prompt_length=0, block_start=start,
                             block_end=end, tokens=tokens, mask=mask, unmasked=unmasked, entropy=entropy,
                             confidence=confidence, active=active, cached=cached,
                             forward_ms=float(d["forward_ms"]), sample_ms=float(d["sample_ms"]),
                             total_ms=float(d["total_ms"]), scheduled=int(d.get("scheduled", -1)), edited=edited,
                             experts=experts, **_uniform_fields(d, n), **_causal_fields(d, n))
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise DiffuseError(f"{self.model.url}: a step event that is not diffuse serve's "
                               f"({type(e).__name__}: {str(e)[:80]})") from None

    def result(self, total_ms: float) -> GenerateResult:
        ev = self.events
        last = ev[-1] if ev else None
        tokens = last.tokens if last is not None else np.zeros(0, np.int32)
        decided = np.full(tokens.shape[0], -1, np.int32)
        for e in ev:
            decided[e.unmasked] = e.step
        if self.cancelled:
            reason = "cancelled"
        elif self.stop_reason is not None:
            reason = self.stop_reason
        elif last is not None:     # a diffuse serve of before the field: told from the steps
            reason = "eos" if len(ev) < last.steps_allowed else "done"
        else:
            reason = "eos" if self.finish_reason == "stop" else "done"
        completion = self.usage.get("completion_tokens")
        useful = completion if isinstance(completion, int) else int((~last.mask).sum()) if last is not None else 0
        return GenerateResult(
            text=self.text, tokens=tokens, prompt_tokens=np.zeros(0, np.int32), steps=len(ev),
            steps_allowed=last.steps_allowed if last is not None else 0, stop_reason=reason,
            step_ms=np.array([e.total_ms for e in ev]), forward_ms=np.array([e.forward_ms for e in ev]),
            sample_ms=np.array([e.sample_ms for e in ev]), total_ms=total_ms,
            gen_length=tokens.shape[0] if last is not None else useful, useful_length=useful, decided_step=decided,
            forward_passes=passes if type(passes := self.usage.get("forward_passes")) is int and passes > 0 else 0)


def _block_bounds(d: dict, block: int, n_blocks: int, n: int) -> tuple[int, int]:
    """The block's positions in the answer: as the server sends them, else equal blocks over the
    answer (exact for full attention; block diffusion's first block may start in the prompt)."""
    if "block_start" in d and "block_end" in d:
        return max(0, int(d["block_start"])), min(n, int(d["block_end"]))
    return block * n // n_blocks, (block + 1) * n // n_blocks


def _uniform_fields(d: dict, n: int) -> dict:
    """Uniform-state diffusion's argmax draft (token ids), re-drawn positions (answer positions) and
    entropy cut (nats), all three where the event has a draft (StepEvent's fields of those names)."""
    if d.get("draft") is None:
        return {}
    draft, redrawn = np.asarray(d["draft"], np.int32), np.asarray(d["redrawn"], np.int32)
    cut = float(d["entropy_cut"])
    if draft.ndim != 1 or (draft < 0).any() or redrawn.ndim != 1 or ((redrawn < 0) | (redrawn >= n)).any():
        raise ValueError("a draft that is not token ids, or re-drawn positions outside the answer")
    if not math.isfinite(cut):
        raise ValueError("an entropy cut that is not a number")
    return {"draft": draft, "redrawn": redrawn, "entropy_cut": cut}


def _causal_fields(d: dict, n: int) -> dict:
    """Self-speculation's draft (token ids) and drafts kept, WeDLM's window in pass order and its
    commits (answer positions), where the event has them (StepEvent's fields of those names)."""
    out = {}
    if d.get("spec_draft") is not None:
        draft, kept = np.asarray(d["spec_draft"], np.int32), int(d.get("spec_accepted", -1))
        if draft.ndim != 1 or not draft.size or (draft < 0).any() or not 0 <= kept < draft.size:
            raise ValueError("a draft that is not token ids, or more drafts kept than drafted")
        out |= {"spec_draft": draft, "spec_accepted": kept}
    if d.get("window_order") is not None:
        window, committed = (np.asarray(d.get(k, []), np.int32) for k in ("window_order", "committed"))
        if window.ndim != 1 or committed.ndim != 1 or not all(((a >= 0) & (a < n)).all() for a in (window, committed)):
            raise ValueError("a window or commits outside the answer")
        out |= {"window_order": window, "committed": committed}
    return out


def _positions(value, n: int) -> np.ndarray:
    """Positions the server sent as a list; a count (what diffuse serve sent before it sent lists)
    names none."""
    if isinstance(value, list):
        out = np.asarray(value, np.int32)
        if out.ndim != 1 or ((out < 0) | (out >= n)).any():
            raise ValueError("active or cached positions outside the answer")
        return out
    return np.zeros(0, np.int32)
