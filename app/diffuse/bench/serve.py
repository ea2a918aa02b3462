"""`python -m diffuse.bench.serve MODEL --clients 1,4,8`: the server under concurrent clients.

For each --max-batch (8: concurrent requests share forward passes; 1: one request at a time) a
server runs in this process on a free local port; for each client count C, C threads each send
--requests chat completions back to back (a closed loop, as editors and scripts do). Reported:
requests/s over the whole load, latency p50/p95 per request, and the mean batch: per request, the
most sequences that shared one forward pass with it.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request

import numpy as np

from diffuse.bench.batch import PROMPTS


def _client(url: str, body: dict, n: int, latencies: list[float], start: threading.Barrier) -> None:
    start.wait()
    for _ in range(n):
        data = json.dumps(body).encode()
        request = urllib.request.Request(url + "/chat/completions", data=data,
                                         headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as r:
            json.loads(r.read())
        latencies.append(time.perf_counter() - t0)


def load(server, clients: int, requests: int, options: dict) -> dict:
    """`clients` threads x `requests` each against a running server: throughput and latency."""
    before = len(server.batcher.log)
    latencies: list[float] = []
    start = threading.Barrier(clients + 1)
    threads = [threading.Thread(target=_client, args=(server.url, {
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], **options}, requests, latencies, start))
        for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if len(latencies) != clients * requests:
        raise RuntimeError(f"{clients * requests - len(latencies)} requests failed")
    batches = [e["batch"] for e in list(server.batcher.log)[before:]]
    return {"clients": clients, "requests": len(latencies), "requests_per_s": len(latencies) / wall,
            "p50_s": float(np.percentile(latencies, 50)), "p95_s": float(np.percentile(latencies, 95)),
            "mean_batch": float(np.mean(batches))}


def run(path: str, clients: list[int], max_batches: list[int], requests: int, options: dict,
        threads: int | None = None, log=print) -> list[dict]:
    import diffuse
    from diffuse.serve import Server

    model = diffuse.load(path, threads=threads)
    servers = {b: Server(model, port=0, max_batch=b) for b in max_batches}
    rows = []
    try:
        for server in servers.values():
            server.start()
            load(server, 1, 1, options)     # warm-up: contexts and compute buffers
        # Modes alternate at each client count, so that a change in the machine's load between
        # measurements does not favour one of them.
        for c in clients:
            for max_batch, server in servers.items():
                row = {"max_batch": max_batch, **load(server, c, requests, options)}
                log(f"max_batch {max_batch}, {c} clients: {row['requests_per_s']:.2f} req/s, "
                    f"p50 {row['p50_s']:.2f} s, p95 {row['p95_s']:.2f} s, mean batch {row['mean_batch']:.1f}")
                rows.append(row)
    finally:
        for server in servers.values():
            server.stop()
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| max batch | clients | requests | req/s | p50 (s) | p95 (s) | mean batch |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['max_batch']} | {r['clients']} | {r['requests']} | {r['requests_per_s']:.2f} | "
              f"{r['p50_s']:.2f} | {r['p95_s']:.2f} | {r['mean_batch']:.1f} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diffuse.bench.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="GGUF model file")
    p.add_argument("--clients", default="1,4,8", help="concurrent client counts (default 1,4,8)")
    p.add_argument("--max-batch", default="8,1", help="server --max-batch values to compare (default 8,1)")
    p.add_argument("--requests", type=int, default=4, help="requests per client (default 4)")
    p.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each request (default 32)")
    p.add_argument("--steps", type=int, default=16, help="denoising steps of each request (default 16)")
    p.add_argument("--threads", type=int, help="engine threads (default: the physical cores)")
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    ints = lambda text: [int(x) for x in text.split(",")]   # noqa: E731
    options = {"max_tokens": args.max_tokens, "steps": args.steps, "temperature": 0.0}
    rows = run(args.model, ints(args.clients), ints(args.max_batch), args.requests, options, args.threads)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "options": options, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
