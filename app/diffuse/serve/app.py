"""The HTTP side: OpenAI routes on Starlette, served by uvicorn on a socket bound up front."""
from __future__ import annotations

import asyncio
import hmac
import json
import socket
import threading
import time
import uuid
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from diffuse import DiffuseError
from diffuse.serve import protocol
from diffuse.serve.batcher import Batcher, Job

MAX_BODY_BYTES = 16 << 20
DISCONNECT_POLL_S = 0.05     # how often a waiting plain request checks that its client is still there


def _error(e: protocol.BadRequest) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def create_app(model, batcher: Batcher, model_id: str, api_key: str | None = None) -> Starlette:
    created = int(Path(model.path).stat().st_mtime)

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
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": created, "owned_by": "diffuse"}]})

    async def completions(request: HTTPRequest, kind: str) -> Response:
        try:
            authorise(request)
            raw = await _body(request)
            parsed = await run_in_threadpool(protocol.parse, raw, kind, model, batcher.max_batch)
            job = Job(parsed, asyncio.get_running_loop(), model)
            batcher.submit(job)
        except protocol.BadRequest as e:
            return _error(e)
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        now = int(time.time())
        if parsed.stream:
            return StreamingResponse(_stream(job, kind, rid, now, model_id), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _collect(request, job, kind, rid, now, model_id)

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
        return JSONResponse(protocol.error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"),
                            status_code=500)

    return Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                             Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/completions", text, methods=["POST"])],
                     exception_handlers={HTTPException: http_error, Exception: server_error})


async def _body(request: HTTPRequest) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise protocol.BadRequest(f"the body is larger than {MAX_BODY_BYTES >> 20} MiB", status=413)
    return bytes(body)


async def _collect(request: HTTPRequest, job: Job, kind: str, rid: str, created: int, model_id: str) -> Response:
    texts = [""] * job.request.n_sequences
    reasons: list[str | None] = [None] * job.request.n_sequences
    next_check = time.monotonic() + DISCONNECT_POLL_S
    while True:
        try:
            item = await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_S)
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
            reasons[item[1]] = item[2]
        elif item[0] == "error":
            return JSONResponse(protocol.error_body(item[1], "server_error"), status_code=500)
        elif item[0] == "end":
            choices = [protocol.choice(kind, i, t, r) for i, (t, r) in enumerate(zip(texts, reasons))]
            return JSONResponse(protocol.envelope(kind, rid, created, model_id, choices, False, usage=item[1]))


async def _stream(job: Job, kind: str, rid: str, created: int, model_id: str):
    """Server-sent events: chunks as text becomes final, optional step events, [DONE] (after an
    error event if the request failed).

    Starlette cancels this generator when the client disconnects; `finally` then cancels the job,
    which the engine sees at the sequence's next step."""
    def sse(choices: list[dict], **extra) -> str:
        return f"data: {json.dumps(protocol.envelope(kind, rid, created, model_id, choices, True, **extra))}\n\n"
    try:
        if kind == "chat":
            yield "".join(sse([protocol.delta(kind, i, "", role=True)]) for i in range(job.request.n_sequences))
        while True:
            item = await job.events.get()
            if item[0] == "text":
                yield sse([protocol.delta(kind, item[1], item[2])])
            elif item[0] == "step":
                yield sse([], diffusion=item[2])
            elif item[0] == "finish":
                yield sse([protocol.delta(kind, item[1], None, item[2])])
            elif item[0] == "error":     # an error event, then the stream's usual end
                yield f"data: {json.dumps(protocol.error_body(item[1], 'server_error'))}\n\ndata: [DONE]\n\n"
                return
            elif item[0] == "end":
                if job.request.include_usage:
                    yield sse([], usage=item[1])
                yield "data: [DONE]\n\n"
                return
    finally:
        job.cancel()


class Server:
    """The app on uvicorn with its batcher. The socket is bound here, so a taken port or a bad host
    fails at once (DiffuseError) and clients may connect as soon as this returns; `serve()` runs
    in the calling thread, `start()` on a background one."""

    def __init__(self, model, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
                 max_batch: int = 8):
        if max_batch < 1:
            raise DiffuseError(f"max_batch must be at least 1 (got {max_batch})")
        self.batcher = Batcher(model, max_batch)
        self.model_id = Path(model.path).stem     # what /v1/models lists; any name is accepted in requests
        self.app = create_app(model, self.batcher, self.model_id, api_key=api_key)
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.socket = socket.create_server((host, port), family=family)
        except (OSError, OverflowError) as e:
            raise DiffuseError(f"cannot listen on {host}:{port}: {e}") from None
        self.host, self.port = host, self.socket.getsockname()[1]
        # No logging configuration: the server may run inside the Studio or a test process. The
        # protocol and loop are named, not "auto", so every install (and the bundle) runs the same ones.
        self._uvicorn = uvicorn.Server(uvicorn.Config(self.app, http="h11", loop="asyncio", ws="none",
                                                      lifespan="off", log_config=None, access_log=False,
                                                      timeout_graceful_shutdown=5))
        self._thread: threading.Thread | None = None

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
