"""`diffuse serve`: the loaded model behind an OpenAI-compatible HTTP API (extra `diffuse[serve]`).

protocol.py: request bodies -> engine work, OpenAI JSON; batcher.py: the queue and the thread that
runs requests in one generate_stream; app.py: routes and the uvicorn server; metrics.py: the
counters of GET /metrics. docs/serving.md: behind a reverse proxy.
"""
from diffuse.serve.app import Server, create_app

__all__ = ["Server", "create_app"]
