"""The request queue and the one thread that runs the model.

The thread keeps one `Model.generate_stream` going while there are requests: one forward pass per
step over every running sequence. Each job runs on the model it was parsed for: after the server
switches models, the stream of the old one takes no new jobs and ends with its last answer, and the
next stream runs the new one. At each step boundary, waiting requests join the running ones
(in arrival order, while all fit in --max-batch sequences), and a request whose sequences have all
ended leaves at once with its answer. Each step, the text of each answer that has become final is
handed to its request's event-loop queue; a request whose client went away is cancelled at its
next step.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import json
import logging
import threading
import time
from typing import Callable

import numpy as np

from diffuse import DiffuseError
from diffuse.events import GenerateResult
from diffuse.generation import ARCHITECTURES
from diffuse.serve import protocol

LOG_LENGTH = 500    # request log entries kept for late readers (the Studio panel, tests)
# Step events waiting for a stream's client to read them: past this many, or this many bytes, new
# ones are dropped (the `step` numbers show the gap). A client reads as fast as the steps come
# unless it stalls; text, finish and end events are never dropped (an answer's text is bounded by
# its max_tokens). An event of a 1024-position answer is ~25 kB; of a large MoE model without the
# cache, whose every position is recomputed, its experts make it 0.4-0.7 MB (docs/serving.md).
MAX_QUEUED_STEPS = 64
MAX_QUEUED_STEP_BYTES = 8 << 20
INTERNAL_ERROR = "internal error while making this answer (the server's log has the details)"
logger = logging.getLogger("diffuse.serve")


class AnswerText:
    """The final part of one answer as the steps decide it.

    A committed token never changes (with editing, LLaDA2.1's, once its block is finished; with
    uniform-state diffusion, DiffusionGemma's, once its canvas is finished), so the decided prefix of
    the buffer (up to the first masked position, end-of-text or max_tokens) is final. Text that could still turn out to be the start
    of a stop string (the longest end of the text that begins one), or half of a multi-byte
    character, is held back until the next tokens settle.
    """

    def __init__(self, tokenizer, eos_ids, max_tokens: int, stops: list[str]):
        self.tok, self.eos = tokenizer, set(eos_ids)
        self.max_tokens, self.stops = max_tokens, stops
        self.text = ""                      # handed out so far
        self.n_tokens = 0                   # generated tokens behind self.text's final form
        self.finish_reason: str | None = None
        self._settled = -1

    def update(self, tokens: np.ndarray, mask: np.ndarray, final: bool = False) -> str:
        """New final text after a step (`final`: the run is over); sets finish_reason once complete."""
        ids, masked = tokens[:self.max_tokens], mask[:self.max_tokens]
        end = int(np.argmax(masked)) if masked.any() else len(ids)
        eos = [i for i, t in enumerate(ids[:end].tolist()) if t in self.eos]
        end = eos[0] if eos else end
        if end == self._settled and not final:
            return ""
        self._settled = end
        text = self.tok.decode(ids[:end].tolist(), skip_special_tokens=True)
        reason = "stop" if eos else "length" if end == len(ids) or final else None
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            text, reason = text[:min(hits)], "stop"
            self.n_tokens = self._tokens_for(ids[:end].tolist(), len(text))
        else:
            self.n_tokens = end
        if reason is None:
            text = text.rstrip("\ufffd")
            text = text[:len(text) - self._held(text)]
        self.finish_reason = reason
        if not text.startswith(self.text):     # never happens with byte-level BPE; say it rather than garble
            raise DiffuseError("the tokenizer's decoding of a longer prefix changed earlier text")
        new, self.text = text[len(self.text):], text
        return new

    def _held(self, text: str) -> int:
        """Length of the longest end of `text` that a stop string starts with (0 if none)."""
        return max((next((n for n in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:n])), 0)
                    for s in self.stops), default=0)

    def _tokens_for(self, ids: list[int], n_chars: int) -> int:
        """The fewest leading tokens whose text covers n_chars characters (what a stop string leaves)."""
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.tok.decode(ids[:mid], skip_special_tokens=True)) >= n_chars:
                hi = mid
            else:
                lo = mid + 1
        return lo


class Job:
    """One HTTP request's sequences (prompts x n) and the queue its handler reads.

    Items put on `events`: ("text", index, str), ("step", index, JSON text), ("finish", index, reason,
    the engine's stop reason),
    ("end", usage dict) and ("error", protocol.BadRequest). The engine thread writes; the event
    loop reads them with next_event().
    """
    _ids = itertools.count(1)

    def __init__(self, request: protocol.Request, loop: asyncio.AbstractEventLoop, model):
        self.id = next(self._ids)
        self.request, self.loop, self.model = request, loop, model     # the model it was parsed for
        self.events: asyncio.Queue = asyncio.Queue()
        tok = model.tokenizer
        # DiffusionGemma's canvas may re-draw a position it accepted at a later step: only a finished
        # canvas is final (the positions before the current one; the last one in the result)
        self.uniform_state = ARCHITECTURES[model.arch]["loop"] == "uniform-state"
        self.answers = [AnswerText(tok, tok.eos_token_ids, request.max_tokens, request.stop)
                        for _ in range(request.n_sequences)]
        # Per answer, the token ids whose text its client was sent (None: no step event yet)
        self.pieces_sent: list[set[int] | None] = [None] * request.n_sequences
        self.results: list = [None] * request.n_sequences   # GenerateResult or DiffuseError, as each ends
        self.cancelled = False            # the client went away (set from the event loop)
        self.error: str | None = None     # why this job failed (its sequences then stop; the others run on)
        self.entry: dict | None = None    # its request log entry, once it has ended
        self.steps_after_cancel = 0       # steps this job's sequences ran once cancelled
        self.batch = 0                    # most sequences in one forward pass with this job's
        self.queued_at = time.perf_counter()
        self.started_at = 0.0             # when its sequences joined the stream
        self.steps_put = self.step_bytes_put = 0     # step events queued (the engine's thread counts) ...
        self.steps_read = self.step_bytes_read = 0   # ... and read (the event loop's)
        self.steps_dropped = 0            # not queued: its client was not reading

    async def next_event(self) -> tuple:
        item = await self.events.get()
        if item[0] == "step":
            self.steps_read += 1
            self.step_bytes_read += len(item[2])
        return item

    def cancel(self) -> None:
        self.cancelled = True

    def _put(self, *item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:     # the server's event loop has ended: nobody is listening
            pass

    def fail_with(self, e: Exception) -> None:
        """This job's own failure (its sequences stop at their next step; its batch runs on)."""
        if isinstance(e, DiffuseError):
            self.error = self.error or str(e)
        else:     # a bug of ours: the traceback goes to the log, the client hears no internals
            logger.error("request %d failed", self.id, exc_info=e)
            self.error = self.error or INTERNAL_ERROR

    def step(self, index: int, ev) -> bool:
        """One event of sequence `index`; False stops it (cancelled, failed, or its answer is complete)."""
        if self.cancelled:
            self.steps_after_cancel += 1
            return False
        if self.error is not None:
            return False
        if self.request.diffusion_events:
            if (self.steps_put - self.steps_read < MAX_QUEUED_STEPS
                    and self.step_bytes_put - self.step_bytes_read < MAX_QUEUED_STEP_BYTES):
                text = self._step_event(index, ev)
                self.steps_put += 1
                self.step_bytes_put += len(text)
                self._put("step", index, text)
            else:
                self.steps_dropped += 1
        answer = self.answers[index]
        settled = ~ev.gen_mask
        if self.request.options["editing_threshold"] < 1 or self.uniform_state:
            settled[max(ev.block_start - ev.prompt_length, 0):] = False    # the current block may still change
        if new := answer.update(ev.gen_tokens, ~settled):
            self._put("text", index, new)
        return answer.finish_reason is None

    def _step_event(self, index: int, ev) -> str:
        """The wire's step event as JSON (made here, where its size can bound the queue), with the
        texts of the answer's decided and drafted tokens not sent before (also those of steps dropped
        for a slow reader), and the end-of-text ids in the first."""
        tok, sent = self.model.tokenizer, self.pieces_sent[index]
        first = sent is None
        if first:
            sent = self.pieces_sent[index] = set()
        # drafts too (self-speculation's, DiffusionGemma's): a rejected draft token may be decided nowhere
        drafts = [d for d in (ev.spec_draft, ev.draft) if d is not None]
        shown = np.concatenate([ev.gen_tokens[~ev.gen_mask], *drafts])
        new = [t for t in np.unique(shown).tolist() if t not in sent]
        sent.update(new)
        event = protocol.step_event(index, ev, {t: tok.decode([t]) for t in new},
                                    sorted(tok.eos_token_ids) if first else None)
        return json.dumps(event, separators=(",", ":"))

    def finish(self, results: list) -> dict:
        """The last text of each answer; returns the usage, which `end` then hands out."""
        for index, (answer, r) in enumerate(zip(self.answers, results)):
            # a uniform-state canvas has no mask: its tokens may be any id, the mask's too
            masked = np.zeros(len(r.tokens), bool) if self.uniform_state else r.tokens == self.model.mask_token_id
            if new := answer.update(r.tokens, masked, final=True):
                self._put("text", index, new)
            # the engine's own reason, which a client rebuilding the run cannot tell from the steps
            # (a threshold rule may finish early without end-of-text); a run this server cancelled
            # once its text was final ended at end-of-text, unless that was its last step anyway
            reason = r.stop_reason
            if reason == "cancelled" and answer.finish_reason is not None:
                reason = "eos" if r.steps < r.steps_allowed else "done"
            self._put("finish", index, answer.finish_reason, reason)
        n_prompt = sum(len(p) for p in self.request.prompts)   # each prompt once, as OpenAI counts
        return protocol.usage(n_prompt, sum(a.n_tokens for a in self.answers), sum(r.forward_passes for r in results))

    def end(self, usage: dict) -> None:
        self._put("end", usage)

    def fail(self, message: str) -> None:
        self._put("error", protocol.BadRequest(message, status=500, type="server_error"))

    def shut_out(self) -> None:
        """Refused or ended unfinished because the server is shutting down."""
        self._put("error", protocol.shutting_down())


class Batcher:
    """Runs the jobs on their model: one stream that each job joins at a step boundary, while its
    sequences fit beside the running ones in max_batch, and leaves as soon as they have ended. A
    job for another model than the stream's waits for the stream to end (jobs start in order)."""

    def __init__(self, max_batch: int):
        self.max_batch = max_batch
        self.log: collections.deque[dict] = collections.deque(maxlen=LOG_LENGTH)
        self.listeners: list[Callable[[dict], None]] = []             # each finished request's log entry
        self.step_listeners: list[Callable[[Job, int, object], None]] = []   # (job, index, StepEvent), every step
        self._pending: collections.deque[Job] = collections.deque()
        self._running: dict[int, tuple[Job, int]] = {}   # stream sequence -> (job, index in the job)
        self._admitted = 0                                # sequences the current stream numbered
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="diffuse-serve-batcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise protocol.shutting_down()
            self._pending.append(job)
            self._cond.notify()

    @property
    def closed(self) -> bool:
        return self._closed

    def load(self) -> tuple[int, int]:
        """(requests waiting, sequences running)."""
        with self._cond:
            return len(self._pending), len(self._running)

    def close(self, timeout: float | None = None) -> None:
        """Cancel every job (running ones stop at their next step) and end the thread."""
        with self._cond:
            self._closed = True
            for job in [*self._pending, *(job for job, _ in self._running.values())]:
                job.cancel()
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while (model := self._wait()) is not None:
            self._admitted = 0
            try:
                model.generate_stream(functools.partial(self._admit, model), self._finished, on_step=self._step,
                                      chat=False)
            except Exception as e:    # the engine failed (NaN logits, a bug of ours): every job hears it,
                # the waiting ones too: a failure before admitting would otherwise retry them forever
                if isinstance(e, DiffuseError):
                    message = str(e)
                else:
                    logger.error("the engine's stream failed", exc_info=e)
                    message = INTERNAL_ERROR
                with self._cond:
                    failed = dict.fromkeys([*(job for job, _ in self._running.values()), *self._pending])
                    self._running.clear()
                    self._pending.clear()
                for job in failed:
                    self._record(job, None, "error")
                    job.fail(message)

    def _wait(self):
        """Wait for work: the model of the oldest job, which the next stream runs; None once closed
        (every waiting job then told so)."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                for job in self._pending:
                    job.shut_out()
                self._pending.clear()
                return None
            return self._pending[0].model

    def _admit(self, model) -> list[tuple[list[int], dict]]:
        """A step boundary: the waiting jobs that fit beside the running sequences, oldest first
        (a job that does not fit holds back the ones behind it, so none waits forever), while they
        are for the stream's model (one for another holds back the rest until the stream ends)."""
        items = []
        with self._cond:
            while self._pending and not self._closed:
                job = self._pending[0]
                if job.cancelled:        # its client left while it waited
                    self._pending.popleft()
                    job.fail("cancelled")
                    continue
                if job.model is not model or len(self._running) + job.request.n_sequences > self.max_batch:
                    break
                self._pending.popleft()
                job.started_at = time.perf_counter()
                for i in range(job.request.n_sequences):
                    self._running[self._admitted] = (job, i)
                    self._admitted += 1
                    items.append((job.request.prompt_of(i), job.request.options_of(i)))
            for job, _ in self._running.values():
                job.batch = max(job.batch, len(self._running))
        return items

    def _step(self, ev) -> bool:
        job, i = self._running[ev.sequence]
        try:   # an exception here would end the stream: every request in it would fail
            for listener in self.step_listeners:
                listener(job, i, ev)
            return job.step(i, ev)
        except Exception as e:
            job.fail_with(e)
            return False

    def _finished(self, sequence: int, result: GenerateResult | DiffuseError) -> None:
        """A sequence ended: once all of its job's have, the job gets its answer (or its error)."""
        with self._cond:
            job, i = self._running.pop(sequence)
        job.results[i] = result
        if any(r is None for r in job.results):
            return
        # Logged before the client hears the end, so that whoever got an answer finds it in the log.
        if job.cancelled:      # its client left, or the server is stopping
            self._record(job, None, "cancelled")
            if self._closed:
                job.shut_out()
            else:
                job.fail("cancelled")
            return
        try:
            for r in job.results:
                if isinstance(r, DiffuseError):   # refused by the engine (protocol.parse checks first)
                    raise r
            if job.error is None:
                u = job.finish(job.results)
        except Exception as e:     # (on the engine's thread: raised, it would end every job's stream)
            job.fail_with(e)
        if job.error is not None:
            self._record(job, None, "error")
            job.fail(job.error)
            return
        self._record(job, u, "ok")
        job.end(u)

    def _record(self, job: Job, u: dict | None, status: str) -> None:
        steps = max((r.steps for r in job.results if isinstance(r, GenerateResult)), default=0)
        entry = {"id": job.id, "kind": job.request.kind, "sequences": job.request.n_sequences,
                 "batch": job.batch, "status": status, "steps": steps, "seed": job.request.seed,
                 "steps_after_cancel": job.steps_after_cancel, "steps_dropped": job.steps_dropped,
                 "prompt_tokens": u["prompt_tokens"] if u else 0,
                 "completion_tokens": u["completion_tokens"] if u else 0,
                 "queued_ms": round((job.started_at - job.queued_at) * 1000, 1),
                 "run_ms": round((time.perf_counter() - job.started_at) * 1000, 1), "time": time.time()}
        job.entry = entry
        self.log.append(entry)
        for listener in list(self.listeners):
            try:     # on the engine's thread: a listener's bug must not end the stream
                listener(entry)
            except Exception:
                logger.exception("a request log listener failed")
