"""The HTTP side: OpenAI routes on Starlette, served by uvicorn on a socket bound up front.

Browsers are kept out unless asked for: a request must name this machine in its Host header (a
DNS-rebinding page names its own domain), must not come from a web page of another origin (Origin)
unless --cors-origin allows it, and posts only application/json (which a page cannot send to
another origin without a CORS preflight).
"""
from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import hmac
import json
import signal
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from diffuse import DiffuseError
from diffuse.serve import protocol
from diffuse.serve.batcher import INTERNAL_ERROR, Batcher, Job, logger
from diffuse.serve.metrics import Metrics

MAX_BODY_BYTES = 16 << 20
# Bytes of large bodies (LARGE_BODY_BYTES and more) held at once, read or waiting to be parsed:
# four of the largest. A large body waits for room before it is read.
MAX_BUFFERED_BYTES = 4 * MAX_BODY_BYTES
PARSES = 2                   # bodies parsed (and prompts tokenised) at once, on worker threads
RETRY_AFTER_S = 1
WRITE_STALL_S = 30.0         # a client that reads nothing of a response for this long is cut off
LARGE_BODY_BYTES = 1 << 20   # after one, freed memory is handed back to the system
DISCONNECT_POLL_S = 0.05     # how often a waiting plain request checks that its client is still there
HEAD_TIMEOUT_S = 10.0        # from a request's first byte to the end of its headers
BODY_TIMEOUT_S = 60.0        # for the whole body (16 MiB at a slow 2 Mbit/s)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
CLOSED = 499                 # nginx's "client closed request", for the log: nobody reads the reply


def _error(e: protocol.BadRequest) -> JSONResponse:
    # A refused body may still be arriving (a timeout, too large, busy): close rather than read it all.
    headers = {"Connection": "close"} if e.status in (408, 413, 503) else {}
    if e.code == "server_busy":
        headers["Retry-After"] = str(RETRY_AFTER_S)
    return JSONResponse(e.body(), status_code=e.status, headers=headers or None)


@dataclass(frozen=True)
class Served:
    """The model that answers new requests, with what /v1/models says of it: its file's name, and
    in "diffuse" its facts, so that a client can show the served model's defaults (diffuse.remote)."""
    model: object
    id: str
    created: int

    @classmethod
    def of(cls, model) -> Served:
        path = Path(model.path)
        try:
            created = int(path.stat().st_mtime)
        except OSError:        # the file went after the model was loaded: it still runs from memory
            created = int(time.time())
        return cls(model, path.stem, created)

    def entry(self) -> dict:
        m = self.model
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "diffuse",
                "diffuse": {"arch": m.arch, "family": m.family, "n_ctx_train": m.n_ctx_train, "recipe": m.recipe,
                            "n_expert": m.n_expert, "eos_ids": sorted(m.tokenizer.eos_token_ids)}}


def create_app(served: Callable[[], Served], batcher: Batcher, api_key: str | None = None,
               hosts: Callable[[dict], bool] | None = None, cors_origins: tuple[str, ...] = (),
               body_timeout: float = BODY_TIMEOUT_S, log: Callable[[dict], None] | None = None,
               metrics: Metrics | None = None):
    """The ASGI app. served() is the model that answers a request arriving now (read once per
    request: a switch leaves the requests already accepted on their model); hosts(scope) says
    whether the request's Host header names this server (None: any); cors_origins are the web
    origins allowed to use it ("*": every one); log gets one entry per request, refused ones
    included, but for successful /health checks; metrics counts them all for GET /metrics."""
    metrics = metrics or Metrics()
    large_bodies = [0]      # being parsed now
    budget = _Budget(MAX_BUFFERED_BYTES)
    parsing = asyncio.Semaphore(PARSES)

    def authorise(request: HTTPRequest) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise protocol.BadRequest("incorrect or missing API key: send Authorization: Bearer <key>",
                                      code="invalid_api_key", status=401)

    async def models(request: HTTPRequest) -> Response:
        try:
            authorise(request)
        except protocol.BadRequest as e:
            return _error(e)
        return JSONResponse({"object": "list", "data": [served().entry()]})

    async def model_info(request: HTTPRequest) -> Response:
        now = served()
        try:
            authorise(request)
            if request.path_params["model_id"] != now.id:
                raise protocol.BadRequest(f"The model '{request.path_params['model_id'][:200]}' does not exist "
                                          f"(this server has one: '{now.id}')", param="model",
                                          code="model_not_found", status=404)
        except protocol.BadRequest as e:
            return _error(e)
        return JSONResponse(now.entry())

    async def health(request: HTTPRequest) -> Response:
        """For a proxy's or an orchestrator's checks: no key needed, nothing about the model."""
        waiting, running = batcher.load()
        status = "shutting_down" if batcher.closed else "ok"
        return JSONResponse({"status": status, "waiting": waiting, "running": running,
                             "max_batch": batcher.max_batch}, status_code=503 if batcher.closed else 200)

    async def metrics_text(request: HTTPRequest) -> Response:
        try:
            authorise(request)
        except protocol.BadRequest as e:
            return _error(e)
        return Response(metrics.render(*batcher.load(), batcher.max_batch),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def completions(request: HTTPRequest, kind: str) -> Response:
        now = served()     # the model that answers this request, whatever is served by the time it runs
        try:
            authorise(request)
            media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
            if media_type != "application/json":
                raise protocol.BadRequest(f"the body must be JSON sent as Content-Type: application/json (got "
                                          f"{json.dumps(media_type or None)[:60]})",
                                          code="unsupported_media_type", status=415)
            held = await _reserve(request, budget, body_timeout)
            try:
                raw = await _body(request, body_timeout)
                large = len(raw) >= LARGE_BODY_BYTES
                large_bodies[0] += large
                try:    # off the event loop: JSON parsing and tokenising (bounded by the context) take time
                    async with parsing:
                        parsed = await run_in_threadpool(protocol.parse, raw, kind, now.model, batcher.max_batch)
                finally:
                    raw = None
                    large_bodies[0] -= large
                    if large and not large_bodies[0]:     # the last large body being parsed is done
                        await run_in_threadpool(_release_memory)
            finally:
                await budget.release(held)
            job = Job(parsed, asyncio.get_running_loop(), now.model)
            batcher.submit(job)
        except protocol.BadRequest as e:
            request.scope["diffuse.error"] = e.message
            return _error(e)
        except ClientDisconnect:     # gone in the middle of its body: nothing to answer, nothing to trace
            return Response(status_code=CLOSED)
        request.scope["diffuse.job"] = job
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        if parsed.stream:
            # X-Accel-Buffering: nginx, when it proxies, passes each event on as it comes.
            return StreamingResponse(_stream(job, kind, rid, created, now.id), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _collect(request, job, kind, rid, created, now.id)

    async def chat(request: HTTPRequest) -> Response:
        return await completions(request, "chat")

    async def text(request: HTTPRequest) -> Response:
        return await completions(request, "completion")

    async def http_error(request: HTTPRequest, exc: HTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(protocol.error_body(f"{request.method} {request.url.path}: {exc.detail}", kind),
                            status_code=exc.status_code)

    async def server_error(request: HTTPRequest, exc: Exception) -> Response:
        # A bug of ours: still an OpenAI error body (uvicorn logs the traceback); the server goes on.
        return JSONResponse(protocol.error_body(INTERNAL_ERROR, "server_error"), status_code=500)

    app = Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                            Route("/v1/models/{model_id:path}", model_info, methods=["GET"]),
                            Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/completions", text, methods=["POST"]),
                            Route("/health", health, methods=["GET"]),
                            Route("/metrics", metrics_text, methods=["GET"])],
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    if cors_origins:
        # Every request header, for the origins the operator allowed: the SDKs send their own
        # (the JS SDK's x-stainless-*, openai-organization, ...), more with each version.
        app = CORSMiddleware(app, allow_origins=cors_origins, allow_methods=("GET", "POST"), allow_headers=("*",))
    return _Front(app, hosts, cors_origins, log, metrics, lambda: batcher.closed)


class _Front:
    """The ASGI app's front: refuses foreign Host and Origin headers, logs and counts every request,
    and ends cleanly a request that the server's shutdown cancels."""

    def __init__(self, app, hosts: Callable[[dict], bool] | None, cors_origins: tuple[str, ...],
                 log: Callable[[dict], None] | None, metrics: Metrics, closing: Callable[[], bool]):
        self.app, self.hosts, self.cors_origins, self.log = app, hosts, cors_origins, log
        self.metrics, self.closing = metrics, closing

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status, streaming, complete = time.perf_counter(), None, False, False

        async def logged(message) -> None:
            nonlocal status, streaming, complete
            if message["type"] == "http.response.start":
                status = message["status"]
                streaming = dict(message.get("headers", ())).get(b"content-type", b"").startswith(
                    b"text/event-stream")
            elif message["type"] == "http.response.body":
                complete = not message.get("more_body", False)
            await send(message)
        self.metrics.started()
        try:
            if (refusal := self.refusal(scope)) is not None:
                scope["diffuse.error"] = refusal.message
                await _error(refusal)(scope, receive, logged)
            else:
                await self.app(scope, receive, logged)
        except asyncio.CancelledError:
            # uvicorn cancels what is still running when its graceful shutdown times out (an engine
            # step longer than that): the answer is the shutdown's error, not a traceback and a 500.
            if not self.closing() or complete:
                status = status or 500
                raise
            scope["diffuse.error"] = "the server is shutting down"
            if status is None:
                await _error(protocol.shutting_down())(scope, receive, logged)
            elif streaming:
                await logged({"type": "http.response.body", "body": _closing_events(protocol.shutting_down()).encode(),
                              "more_body": False})
        except BaseException:
            status = status or 500
            raise
        finally:
            self.metrics.ended(scope["path"], status or CLOSED)
            # A proxy's health checks come every few seconds (8,640 lines a day at 10 s): the ones
            # that pass are counted in /metrics only; a failing one is logged like any request.
            if self.log is not None and not (scope["path"] == "/health" and status == 200):
                self.log(_log_entry(scope, status, started))

    def refusal(self, scope) -> protocol.BadRequest | None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is not None and self.hosts is not None and not self.hosts(scope):
            return protocol.BadRequest(f"the Host header {json.dumps(host)[:80]} does not name this server; "
                                       "start it with --allowed-hosts NAME to accept that name",
                                       code="invalid_host", status=400)
        origin = headers.get("origin")
        if origin is None or "*" in self.cors_origins or origin in self.cors_origins:
            return None
        if host is not None and urlsplit(origin).netloc.lower() == host.lower():
            return None     # same origin (this server's own address)
        return protocol.BadRequest(f"requests from the web page origin {json.dumps(origin)[:80]} are not allowed; "
                                   "start the server with --cors-origin ORIGIN to allow them",
                                   code="forbidden_origin", status=403)


def _log_entry(scope, status: int | None, started: float) -> dict:
    """A request's log line: method, path, status, time and, once it ran, the batcher's entry."""
    job: Job | None = scope.get("diffuse.job")
    entry = job.entry if job is not None else None
    client = scope.get("client")
    return {"method": scope["method"], "path": scope["path"], "status": status or CLOSED,
            "ms": round((time.perf_counter() - started) * 1000, 1),
            "client": f"{client[0]}:{client[1]}" if client else None,
            "prompt_tokens": entry["prompt_tokens"] if entry else None,
            "completion_tokens": entry["completion_tokens"] if entry else None,
            "request": entry, "error": scope.get("diffuse.error") or (job.error if job is not None else None),
            "cut_off": bool(scope.get("diffuse.cut_off"))}


def host_check(bound_host: str, allowed: tuple[str, ...]) -> Callable[[dict], bool] | None:
    """Whether a request's Host header names this server: localhost, the address it listens on, the
    address the client reached (one of this machine's own), or a name in `allowed` ("*": any)."""
    if "*" in allowed:
        return None
    names = {*LOCAL_HOSTS, *(name.lower().rstrip(".") for name in allowed)}
    if bound_host not in WILDCARDS:
        names.add(bound_host.lower().rstrip("."))

    def check(scope) -> bool:
        reached = (scope.get("server") or ("",))[0]
        return _host_name(Headers(scope=scope).get("host", "")) in names | {reached.lower()}
    return check


def _host_name(value: str) -> str:
    """The name in a Host header: "Example.COM.:8080" -> "example.com", "[::1]:8080" -> "::1"."""
    value = value.strip().lower()
    if value.startswith("["):
        name = value[1:value.find("]")] if "]" in value else value
    else:
        name = value.rpartition(":")[0] if value.count(":") == 1 else value
    return name.rstrip(".")


def _release_memory() -> None:
    """Hand the memory of large bodies back to the system. A refused request's exception keeps the
    frames that hold its token ids (millions of ints) in reference cycles, which the collector,
    counting container allocations only, may not visit for a long time; then glibc keeps the freed
    blocks in its per-thread arenas. 4 prompts of 4 MB tokenised at once held 2.1 GB without this."""
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim     # glibc; elsewhere the allocator's own policy rules
except (AttributeError, OSError):
    _malloc_trim = None


class _Budget:
    """Bytes that large bodies may hold at once: each reserves its size before it is read, and
    waits while the others hold the rest (its sender waits too: the socket is not read)."""

    def __init__(self, total: int):
        self.total, self.used = total, 0
        self._cond = asyncio.Condition()

    async def reserve(self, n: int) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.used + n <= self.total)
            self.used += n

    async def release(self, n: int) -> None:
        if n:
            async with self._cond:
                self.used -= n
                self._cond.notify_all()


async def _reserve(request: HTTPRequest, budget: _Budget, timeout: float) -> int:
    """Room in the budget for a large body (its Content-Length; the most a body may be when it is
    sent in chunks); a small one needs none. Returns the bytes reserved."""
    length = int(request.headers.get("content-length", MAX_BODY_BYTES))   # h11 has checked it is a number
    if length > MAX_BODY_BYTES:
        raise protocol.BadRequest(f"the body is larger than {MAX_BODY_BYTES >> 20} MiB", status=413)
    if length < LARGE_BODY_BYTES:
        return 0
    try:
        await asyncio.wait_for(budget.reserve(length), timeout)
    except asyncio.TimeoutError:
        raise protocol.BadRequest(f"the server was busy reading other large requests for {timeout:g} s; retry "
                                  "shortly", code="server_busy", status=503, type="server_error") from None
    return length


async def _body(request: HTTPRequest, timeout: float) -> bytearray:
    too_large = protocol.BadRequest(f"the body is larger than {MAX_BODY_BYTES >> 20} MiB", status=413)
    over = 0       # bytes past the limit, read and dropped

    async def read() -> bytearray:
        nonlocal over
        body = bytearray()
        async for chunk in request.stream():    # as long as its Content-Length (h11 checks), or chunked
            if over or len(body) + len(chunk) > MAX_BODY_BYTES:
                # A chunked body too large is read on, up to as much again, and dropped: a client
                # still sending when the 413 and the close came got a reset instead of the answer.
                # The buffer goes at once (an exception's frames keep it until the cycle collector).
                body.clear()
                over += len(chunk)
                if over > MAX_BODY_BYTES:
                    break
                continue
            body += chunk
        if over:
            raise too_large
        return body
    try:
        return await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        if over:
            raise too_large from None
        raise protocol.BadRequest(f"the body did not arrive within {timeout:g} s", code="request_timeout",
                                  status=408) from None


async def _collect(request: HTTPRequest, job: Job, kind: str, rid: str, created: int, model_id: str) -> Response:
    texts = [""] * job.request.n_sequences
    reasons: list[str | None] = [None] * job.request.n_sequences
    next_check = time.monotonic() + DISCONNECT_POLL_S
    while True:
        try:
            item = await asyncio.wait_for(job.next_event(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            item = None
        if time.monotonic() >= next_check:     # on a clock, not only when idle: text may come every step
            next_check = time.monotonic() + DISCONNECT_POLL_S
            if await request.is_disconnected():
                job.cancel()
                return Response(status_code=499)   # nobody reads it; uvicorn drops it
        if item is None:
            continue
        if item[0] == "text":
            texts[item[1]] += item[2]
        elif item[0] == "finish":
            reasons[item[1]] = item[2:]
        elif item[0] == "error":
            return _error(item[1])
        elif item[0] == "end":
            choices = [protocol.choice(kind, i, t, *r) for i, (t, r) in enumerate(zip(texts, reasons))]
            return JSONResponse(protocol.envelope(kind, rid, created, model_id, choices, False, usage=item[1],
                                                  seed=job.request.seed))


async def _stream(job: Job, kind: str, rid: str, created: int, model_id: str):
    """Server-sent events: chunks as text becomes final, optional step events, [DONE] (after an
    error event if the request failed). The first chunk carries the seed.

    Starlette cancels this generator when the client disconnects; `finally` then cancels the job,
    which the engine sees at the sequence's next step."""
    seed = [job.request.seed]

    def sse(choices: list[dict], step: str | None = None, **extra) -> str:
        if seed:
            extra["seed"] = seed.pop()
        text = json.dumps(protocol.envelope(kind, rid, created, model_id, choices, True, **extra))
        if step is not None:      # a step event, made JSON on the engine's thread: the envelope's last field
            text = f'{text[:-1]}, "diffusion": {step}}}'
        return f"data: {text}\n\n"
    try:
        if kind == "chat":
            yield "".join(sse([protocol.delta(kind, i, "", role=True)]) for i in range(job.request.n_sequences))
        while True:
            item = await job.next_event()
            if item[0] == "text":
                yield sse([protocol.delta(kind, item[1], item[2])])
            elif item[0] == "step":
                yield sse([], step=item[2])
            elif item[0] == "finish":
                yield sse([protocol.delta(kind, item[1], None, item[2], stop_reason=item[3])])
            elif item[0] == "error":     # an error event, then the stream's usual end
                yield _closing_events(item[1])
                return
            elif item[0] == "end":
                if job.request.include_usage:
                    yield sse([], usage=item[1])
                yield "data: [DONE]\n\n"
                return
    finally:
        job.cancel()


def _closing_events(e: protocol.BadRequest) -> str:
    return f"data: {json.dumps(e.body())}\n\ndata: [DONE]\n\n"


class _H11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head (uvicorn closes a keep-alive
    connection that sends nothing, but not one that sends its headers a byte a second), and one for
    a client that stops reading its response: while the socket's buffers are full, the response
    waits, holding its request's memory; after write_stall seconds the connection is cut (which
    cancels the request)."""

    def __init__(self, *args, head_timeout: float, write_stall: float, log: Callable[[dict], None] | None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self._head_timeout, self._write_stall, self._log = head_timeout, write_stall, log
        self._head_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._head_started = 0.0

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self._write_stall, self._stalled)

    def resume_writing(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        super().resume_writing()

    def shutdown(self) -> None:
        """The server is stopping: a response its client is not reading could only end by uvicorn's
        timeout (a logged error); cut it now."""
        if self.flow is not None and self.flow.write_paused:
            self.transport.abort()
        else:
            super().shutdown()

    def _stalled(self) -> None:
        self._stall_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.scope["diffuse.error"] = f"the client read nothing for {self._write_stall:g} s"
            self.cycle.scope["diffuse.cut_off"] = True     # after its status went out: the log says so
        # A reset, not a close: a close would leave what the kernel still holds for this client to
        # trickle out to it, and the client with a stream cut without a word; a reset drops it and says so.
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()    # connection_lost: the response's sends end, the request is cancelled

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()      # a connection that sends nothing at all is closed too

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of a head
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()

    def on_response_complete(self) -> None:
        self._disarm()   # until the next request's first byte: uvicorn's keep-alive timeout rules
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_started = time.perf_counter()
        self._head_timer = self.loop.call_later(self._head_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse (or headers over its size limit): OpenAI's error body, a log line."""
        body = json.dumps(protocol.error_body(f"malformed HTTP request: {msg}", "invalid_request_error")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
        self._disarm()
        self._logged(400, msg)

    def _logged(self, status: int, message: str) -> None:
        if self._log is not None:
            self._log({"method": None, "path": None, "status": status,
                       "ms": round((time.perf_counter() - self._head_started) * 1000, 1),
                       "client": "%s:%d" % self.client if self.client else None,
                       "prompt_tokens": None, "completion_tokens": None, "request": None, "error": message,
                       "cut_off": False})

    def _timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        message = f"the request's headers did not arrive within {self._head_timeout:g} s"
        body = json.dumps(protocol.error_body(message, "invalid_request_error", code="request_timeout")).encode()
        # No request to answer as far as h11 knows: the reply is written as is, then the connection closed.
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                             b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        self.transport.close()
        self._logged(408, message)


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, remembering a Ctrl-C (SIGINT). uvicorn shuts down gracefully, then raises
    the signal again for the default handler; where SIGINT was ignored when the process started (a
    background job of a non-interactive shell, some CI runners) that raise does nothing and run()
    returns as if nothing happened. Server.serve() then raises KeyboardInterrupt itself.

    On SIGINT or SIGTERM, on_exit runs at once: the requests in flight are cancelled at their next
    step and answered with the shutdown's error while uvicorn waits for their connections."""
    interrupted = False
    on_exit: Callable[[], None] = staticmethod(lambda: None)

    def handle_exit(self, sig: int, frame) -> None:
        self.interrupted = self.interrupted or sig == signal.SIGINT
        super().handle_exit(sig, frame)
        self.on_exit()


class Server:
    """The app on uvicorn with its batcher. The socket is bound here, so a taken port or a bad host
    fails at once (DiffuseError) and clients may connect as soon as this returns; `serve()` runs
    in the calling thread, `start()` on a background one.

    allowed_hosts: names accepted in the Host header beside this machine's (localhost, the listening
    address, the address reached), "*" for any; cors_origins: web page origins that may use the
    server ("*": every one), none by default; request_listeners: called with every request's log
    entry (from the event loop's thread)."""

    def __init__(self, model, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
                 max_batch: int = 8, allowed_hosts: tuple[str, ...] = (), cors_origins: tuple[str, ...] = (),
                 head_timeout: float = HEAD_TIMEOUT_S, body_timeout: float = BODY_TIMEOUT_S,
                 write_stall: float = WRITE_STALL_S):
        if max_batch < 1:
            raise DiffuseError(f"max_batch must be at least 1 (got {max_batch})")
        model.tokenizer   # a file without a usable tokenizer is refused now, not at the first request
        self._served = Served.of(model)
        self.batcher = Batcher(max_batch)
        self.metrics = Metrics()
        self.batcher.step_listeners.append(lambda job, index, ev: self.metrics.step(ev.total_ms / 1000))
        self.batcher.listeners.append(self.metrics.finished)
        self.request_listeners: list[Callable[[dict], None]] = []
        self.app = create_app(lambda: self._served, self.batcher, api_key=api_key,
                              hosts=host_check(host, tuple(allowed_hosts)), cors_origins=tuple(cors_origins),
                              body_timeout=body_timeout, log=self._logged, metrics=self.metrics)
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.socket = socket.create_server((host, port), family=family)
        except (OSError, OverflowError) as e:
            raise DiffuseError(f"cannot listen on {host}:{port}: {e}") from None
        self.host, self.port = host, self.socket.getsockname()[1]
        # No logging configuration: the server may run inside the Studio or a test process. The
        # protocol and loop are named, not "auto", so every install (and the bundle) runs the same ones.
        http = functools.partial(_H11, head_timeout=head_timeout, write_stall=write_stall, log=self._logged)
        self._uvicorn = _Uvicorn(uvicorn.Config(self.app, http=http, loop="asyncio", ws="none",
                                                lifespan="off", log_config=None, access_log=False,
                                                timeout_graceful_shutdown=5))
        self._uvicorn.on_exit = functools.partial(self.batcher.close, timeout=0)
        self._thread: threading.Thread | None = None

    def _logged(self, entry: dict) -> None:
        for listener in list(self.request_listeners):
            try:     # a listener's bug must not turn a served request into a traceback
                listener(entry)
            except Exception:
                logger.exception("a request log listener failed")

    @property
    def model(self):
        """The model that answers new requests."""
        return self._served.model

    @property
    def model_id(self) -> str:
        """What /v1/models lists (the file's name); any name is accepted in requests."""
        return self._served.id

    def switch_model(self, model) -> None:
        """Serve `model` from the next request on, without a restart (no connection is refused):
        the requests already accepted finish on the model they were accepted for, whose stream
        takes no new ones; the new model's starts once it has ended. A model whose tokenizer cannot
        be loaded raises DiffuseError, and the server serves on as before."""
        model.tokenizer   # loaded now: refused here, not at the first request
        self._served = Served.of(model)

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/v1"

    def serve(self) -> None:
        """Serve until stop() (or Ctrl-C, when called on the main thread)."""
        self.batcher.start()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self.batcher.close()
            self.socket.close()
        if self._uvicorn.interrupted:
            raise KeyboardInterrupt

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve, name="diffuse-serve", daemon=True)
        self._thread.start()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, wait: float | None = 10.0) -> None:
        """Cancel every request (each stops at its next step) and close; wait=0 returns at once."""
        self.batcher.close(timeout=0)
        self._uvicorn.should_exit = True
        if self._thread is not None and wait != 0:
            self._thread.join(wait)
