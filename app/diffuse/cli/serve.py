"""`diffuse serve`: the model behind an OpenAI-compatible HTTP API on this machine."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from diffuse import DiffuseError, load
from diffuse.cli.generate import add_threads_option
from diffuse.info import escaped

KEY_VARIABLE = "DIFFUSE_API_KEY"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (got {text!r})")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 65535] (got {text!r})")
    return value


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve a model with the OpenAI API (chat, completions, streaming)",
                       description="Serve a model over HTTP with OpenAI's API: GET /v1/models, POST "
                                   "/v1/chat/completions and /v1/completions (stream: true for server-sent "
                                   "events); GET /health and /metrics (Prometheus) for a proxy and monitoring. "
                                   "Concurrent requests are denoised together in one forward pass "
                                   "per step. Diffusion options go in the body as extra fields. "
                                   "See docs/serving.md to put it behind a reverse proxy.")
    p.add_argument("-m", "--model", required=True, help="GGUF model file")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=_port, default=8080, help="TCP port (default 8080; 0 picks a free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request (other users "
                                     f"of this machine can see it in ps: prefer --api-key-file or {KEY_VARIABLE})")
    p.add_argument("--api-key-file", metavar="FILE", help="read the API key from the first line of FILE")
    p.add_argument("--allowed-hosts", metavar="NAMES", action="append", default=[],
                   help="comma-separated names clients may use in the Host header, beside localhost and the "
                        "addresses it listens on ('*': any, e.g. behind a proxy that checks them)")
    p.add_argument("--cors-origin", metavar="ORIGIN", action="append", default=[],
                   help="let web pages of ORIGIN (e.g. http://localhost:3000; '*' for every one) use the server "
                        "from a browser; may be repeated. Without it, requests from web pages are refused")
    p.add_argument("--max-batch", type=_positive, default=8,
                   help="most sequences denoised together (default 8); 1 serves one request at a time")
    p.add_argument("--tokenizer", help="tokenizer.json for model files that carry none")
    add_threads_option(p)
    return p


def _log(entry: dict) -> None:
    """One line per request: client, method, path, status, time, then its tokens or why it failed.
    A client cut off for reading nothing is said first: its status went out before the cut, and
    its run's own status (ok: every token made) is not what the client got."""
    where = f"{entry['client'] or '-'} {entry['method'] or '-'} {escaped(entry['path'] or '-')}"
    cut = entry["cut_off"]
    if cut:
        line = f"{where} cut off after {entry['ms']:.0f} ms, {escaped(entry['error'])} ({entry['status']} already sent)"
    else:
        line = f"{where} {entry['status']} {entry['ms']:.0f} ms"
    if (run := entry["request"]) is not None:
        outcome = "made, not all delivered" if cut and run["status"] == "ok" else run["status"]
        line += f", {run['prompt_tokens']}+{run['completion_tokens']} tokens, {run['sequences']} of a batch of " \
                f"{run['batch']}, {run['steps']} steps, seed {run['seed']}, queued {run['queued_ms']:.0f} ms " \
                f"({outcome})"
    if entry["error"] and not cut:
        line += f": {escaped(entry['error'])}"
    print(line, file=sys.stderr, flush=True)


def _api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or $DIFFUSE_API_KEY (empty: none), checked so that
    a client can send it in a header."""
    if args.api_key is not None and args.api_key_file is not None:
        raise DiffuseError("give --api-key or --api-key-file, not both")
    key, where = args.api_key, "--api-key"
    if args.api_key_file is not None:
        where = f"--api-key-file {args.api_key_file}"
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.readline(4096).strip()
        except (OSError, UnicodeError) as e:
            raise DiffuseError(f"{where}: cannot read the key: {e.strerror if isinstance(e, OSError) else e}") from None
        if not key:
            raise DiffuseError(f"{where}: the file's first line is empty")
    elif key is None:
        key, where = os.environ.get(KEY_VARIABLE) or None, f"${KEY_VARIABLE}"
    if key is not None and not all("!" <= c <= "~" for c in key):
        raise DiffuseError(f"{where}: the API key must be printable ASCII without spaces (a client sends it in "
                           "an HTTP header)")
    return key


def _origins(values: list[str]) -> tuple[str, ...]:
    """--cors-origin values as browsers send them: scheme://host[:port], nothing after."""
    for value in values:
        parts = urlsplit(value)
        if value != "*" and (parts.scheme not in ("http", "https") or not parts.netloc
                             or value != f"{parts.scheme}://{parts.netloc}"):
            raise DiffuseError(f"--cors-origin {escaped(value)}: an origin is scheme://host[:port] with nothing "
                               "after it (e.g. http://localhost:3000), or '*'")
    return tuple(values)


def run(args: argparse.Namespace) -> int:
    try:
        from diffuse.serve import Server
    except ImportError as e:
        raise DiffuseError(f"diffuse serve needs the serve extra: pip install 'diffuse[serve]' ({e})") from None
    api_key, origins = _api_key(args), _origins(args.cors_origin)
    hosts = tuple(name.strip() for names in args.allowed_hosts for name in names.split(",") if name.strip())
    model = load(args.model, threads=args.threads, tokenizer=args.tokenizer)
    server = Server(model, host=args.host, port=args.port, api_key=api_key, max_batch=args.max_batch,
                    allowed_hosts=hosts, cors_origins=origins)
    server.request_listeners.append(_log)
    print(f"serving {Path(args.model).name} ({model.arch}) at {server.url}, batches of up to {args.max_batch} "
          f"sequences{', API key required' if api_key else ''}; Ctrl-C stops", file=sys.stderr, flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(f"warning: listening on {args.host} without --api-key: anyone who can reach this machine "
              "can use the model", file=sys.stderr, flush=True)
    server.serve()
    return 0
