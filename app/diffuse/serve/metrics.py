"""The server's counters, in Prometheus' text exposition format (GET /metrics).

Written from the event loop (requests) and the engine's thread (steps, finished requests), read at
a scrape: one lock. No client library: a handful of counters and one histogram.
"""
from __future__ import annotations

import threading

# Routes a request is counted under; any other path is "other" (the path is the client's to
# choose: as a label it would let anyone grow the scrape without bound).
ROUTES = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/health", "/metrics")
MODEL_ROUTE = "/v1/models/{id}"
# Seconds of one step of one answer: a few ms for a small model, seconds for a large one on few cores.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def route_of(path: str) -> str:
    if path in ROUTES:
        return path
    return MODEL_ROUTE if path.startswith("/v1/models/") else "other"


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, int], int] = {}
        self._in_flight = 0
        self._steps = 0
        self._step_counts = [0] * len(STEP_BUCKETS)     # per bucket, not cumulative (render sums them)
        self._step_seconds = 0.0
        self._tokens = {"prompt": 0, "completion": 0}
        self._answers: dict[str, int] = {}

    def started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def ended(self, path: str, status: int) -> None:
        key = (route_of(path), status)
        with self._lock:
            self._in_flight -= 1
            self._requests[key] = self._requests.get(key, 0) + 1

    def step(self, seconds: float) -> None:
        with self._lock:
            self._steps += 1
            self._step_seconds += seconds
            for i, bound in enumerate(STEP_BUCKETS):
                if seconds <= bound:
                    self._step_counts[i] += 1
                    break

    def finished(self, entry: dict) -> None:
        """A request's batcher log entry: its tokens and how it ended."""
        with self._lock:
            self._tokens["prompt"] += entry["prompt_tokens"]
            self._tokens["completion"] += entry["completion_tokens"]
            self._answers[entry["status"]] = self._answers.get(entry["status"], 0) + 1

    def render(self, waiting: int, running: int, max_batch: int) -> str:
        with self._lock:
            lines = ["# HELP diffuse_requests_total HTTP requests answered, by route and status.",
                     "# TYPE diffuse_requests_total counter"]
            lines += [f'diffuse_requests_total{{route="{route}",status="{status}"}} {n}'
                      for (route, status), n in sorted(self._requests.items())]
            lines += ["# HELP diffuse_requests_in_flight HTTP requests being answered now.",
                      "# TYPE diffuse_requests_in_flight gauge", f"diffuse_requests_in_flight {self._in_flight}",
                      "# HELP diffuse_queue_depth Requests waiting for room in the batch.",
                      "# TYPE diffuse_queue_depth gauge", f"diffuse_queue_depth {waiting}",
                      "# HELP diffuse_running_sequences Answers being denoised now.",
                      "# TYPE diffuse_running_sequences gauge", f"diffuse_running_sequences {running}",
                      "# HELP diffuse_max_batch Most answers denoised together (--max-batch).",
                      "# TYPE diffuse_max_batch gauge", f"diffuse_max_batch {max_batch}",
                      "# HELP diffuse_answers_total Requests run by the engine, by how they ended.",
                      "# TYPE diffuse_answers_total counter"]
            lines += [f'diffuse_answers_total{{status="{s}"}} {n}' for s, n in sorted(self._answers.items())]
            lines += ["# HELP diffuse_prompt_tokens_total Prompt tokens of the requests run.",
                      "# TYPE diffuse_prompt_tokens_total counter",
                      f"diffuse_prompt_tokens_total {self._tokens['prompt']}",
                      "# HELP diffuse_generated_tokens_total Answer tokens sent (to end-of-text or a stop string).",
                      "# TYPE diffuse_generated_tokens_total counter",
                      f"diffuse_generated_tokens_total {self._tokens['completion']}",
                      "# HELP diffuse_step_seconds Time of one denoising step of one answer (a forward pass "
                      "shared by the batch, and its sampling); its _count is every step of every answer.",
                      "# TYPE diffuse_step_seconds histogram"]
            total = 0
            for bound, n in zip(STEP_BUCKETS, self._step_counts):
                total += n
                lines.append(f'diffuse_step_seconds_bucket{{le="{bound}"}} {total}')
            lines += [f'diffuse_step_seconds_bucket{{le="+Inf"}} {self._steps}',
                      f"diffuse_step_seconds_sum {self._step_seconds:.6f}",
                      f"diffuse_step_seconds_count {self._steps}"]
        return "\n".join(lines) + "\n"
