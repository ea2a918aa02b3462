"""`diffuse serve`: the model behind an OpenAI-compatible HTTP API on this machine."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diffuse import DiffuseError, load
from diffuse.cli.generate import add_threads_option


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
                                   "events). Concurrent requests are denoised together in one forward pass "
                                   "per step. Diffusion options go in the body as extra fields.")
    p.add_argument("-m", "--model", required=True, help="GGUF model file")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=_port, default=8080, help="TCP port (default 8080; 0 picks a free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request")
    p.add_argument("--max-batch", type=_positive, default=8,
                   help="most sequences denoised together (default 8); 1 serves one request at a time")
    p.add_argument("--tokenizer", help="tokenizer.json for model files that carry none")
    add_threads_option(p)
    return p


def _log(entry: dict) -> None:
    print(f"request {entry['id']} {entry['kind']}: {entry['status']}, {entry['sequences']} of a batch of "
          f"{entry['batch']}, {entry['prompt_tokens']}+{entry['completion_tokens']} tokens, {entry['steps']} steps, "
          f"queued {entry['queued_ms']:.0f} ms, ran {entry['run_ms']:.0f} ms", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        from diffuse.serve import Server
    except ImportError as e:
        raise DiffuseError(f"diffuse serve needs the serve extra: pip install 'diffuse[serve]' ({e})") from None
    model = load(args.model, threads=args.threads, tokenizer=args.tokenizer)
    model.tokenizer   # a file without a usable tokenizer is refused now, not at the first request
    server = Server(model, host=args.host, port=args.port, api_key=args.api_key, max_batch=args.max_batch)
    server.batcher.listeners.append(_log)
    print(f"serving {Path(args.model).name} ({model.arch}) at {server.url}, batches of up to {args.max_batch} "
          f"sequences{', API key required' if args.api_key else ''}; Ctrl-C stops", file=sys.stderr, flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"warning: listening on {args.host} without --api-key: anyone who can reach this machine "
              "can use the model", file=sys.stderr, flush=True)
    server.serve()
    return 0
