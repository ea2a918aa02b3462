"""Record a run's event stream to one file and play it back.

A recording holds everything a listener saw: every `StepEvent`, the `GenerateResult`, the prompt,
the options, a few facts about the model and the text of every token id that occurs, so a replay
needs neither the model nor its tokenizer. Used by Diffuse Studio (auto-saved runs, replay slider,
tests) and the CLI (`--record`).

File format: one NumPy ``.npz`` archive (zip, deflate), written atomically. With S steps and
N = prompt + generated positions:

    meta                 uint8, UTF-8 JSON: format, prompt, options, model, pieces, result scalars
    step_<field>         (S,) one array per scalar field of StepEvent (step, block, ..., total_ms)
    tokens               int32 (S, N)
    mask                 bool  (S, N)
    entropy, confidence  float32 (S, N), NaN where not evaluated
    <ragged>_values      int32 (sum of lengths,) for unmasked, active, cached ...
    <ragged>_offsets     int64 (S + 1,) ... event k owns values[offsets[k]:offsets[k + 1]]
    result_<array>       the result's arrays (tokens, prompt_tokens, step_ms, ...)
"""
from __future__ import annotations

import io
import json
import os
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from diffuse._core import DiffuseError
from diffuse.events import GenerateResult, StepEvent

FORMAT = "diffuse-recording"
VERSION = 1

_SCALARS = ("step", "block", "n_blocks", "steps_allowed", "prompt_length", "block_start",
            "block_end", "forward_ms", "sample_ms", "total_ms")
_DENSE = ("tokens", "mask", "entropy", "confidence")
_DENSE_DTYPES = {"tokens": np.int32, "mask": np.bool_, "entropy": np.float32,
                 "confidence": np.float32}
_RAGGED = ("unmasked", "active", "cached")
_RESULT_ARRAYS = ("tokens", "prompt_tokens", "step_ms", "forward_ms", "sample_ms", "decided_step")
_RESULT_SCALARS = ("text", "steps", "steps_allowed", "stop_reason", "total_ms", "gen_length",
                   "useful_length")


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the new one.

    The bytes go to a temporary file in the same folder, are flushed to disk, then renamed over
    `path` (a rename within one file system is atomic).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class Recording:
    """A run as its listeners saw it. Pass `rec.add` as `on_step`, then call `rec.finish`."""

    prompt: str = ""
    options: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)       # e.g. name, arch, path, n_vocab
    events: list[StepEvent] = field(default_factory=list)
    result: GenerateResult | None = None
    pieces: dict[int, str] = field(default_factory=dict)   # token id -> its text
    created: float = field(default_factory=time.time)

    def add(self, event: StepEvent) -> bool:
        """The `on_step` callback: keep the event, let the run go on."""
        self.events.append(event)
        return True

    def finish(self, result: GenerateResult | None,
               decode: Callable[[list[int]], str] | None = None) -> Recording:
        """Attach the result and the text of every token id seen (via `decode([id])`)."""
        self.result = result
        if decode is not None:
            for tid in self.token_ids():
                if tid not in self.pieces:
                    self.pieces[tid] = decode([tid])
        return self

    def token_ids(self) -> list[int]:
        """Every distinct token id in the events and the result, sorted."""
        arrays = [e.tokens for e in self.events]
        if self.result is not None:
            arrays += [self.result.tokens, self.result.prompt_tokens]
        if not arrays:
            return []
        return np.unique(np.concatenate([np.asarray(a, np.int64).ravel() for a in arrays])).tolist()

    # -- file ---------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the recording to `path` (.npz), atomically."""
        ev = self.events
        arrays: dict[str, np.ndarray] = {}
        for name in _SCALARS:
            arrays[f"step_{name}"] = np.array([getattr(e, name) for e in ev], np.float64)
        n_total = ev[0].tokens.shape[0] if ev else 0
        for name in _DENSE:
            rows = [np.asarray(getattr(e, name), _DENSE_DTYPES[name]) for e in ev]
            arrays[name] = (np.stack(rows) if rows
                            else np.zeros((0, n_total), _DENSE_DTYPES[name]))
        for name in _RAGGED:
            parts = [np.asarray(getattr(e, name), np.int32).ravel() for e in ev]
            arrays[f"{name}_values"] = (np.concatenate(parts) if parts
                                        else np.zeros(0, np.int32))
            arrays[f"{name}_offsets"] = np.concatenate(
                [[0], np.cumsum([len(p) for p in parts], dtype=np.int64)]).astype(np.int64)
        result = None
        if self.result is not None:
            result = {name: getattr(self.result, name) for name in _RESULT_SCALARS}
            for name in _RESULT_ARRAYS:
                arrays[f"result_{name}"] = np.asarray(getattr(self.result, name))
        meta = {"format": FORMAT, "version": VERSION, "prompt": self.prompt,
                "options": self.options, "model": self.model, "created": self.created,
                "pieces": {str(k): v for k, v in self.pieces.items()}, "result": result}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        write_atomic(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Recording:
        """Read a recording written by `save`; DiffuseError if the file is not one."""
        try:
            # Our own file handle: numpy leaks its handle when the zip is broken.
            with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
        except FileNotFoundError:
            raise DiffuseError(f"{path}: no such recording") from None
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise DiffuseError(f"{path}: not a diffuse recording ({e})") from None
        try:
            meta = json.loads(bytes(data["meta"]).decode("utf-8"))
            if meta.get("format") != FORMAT:
                raise ValueError("wrong format tag")
            if meta.get("version") != VERSION:
                raise ValueError(f"format version {meta.get('version')}, this build reads "
                                 f"{VERSION}")
            events = _events_from(data)
            result = None
            if meta["result"] is not None:
                kw = dict(meta["result"])
                kw.update({n: data[f"result_{n}"] for n in _RESULT_ARRAYS})
                result = GenerateResult(**kw)
        except (KeyError, ValueError, TypeError, IndexError, UnicodeDecodeError) as e:
            raise DiffuseError(f"{path}: damaged diffuse recording ({e})") from None
        return cls(prompt=meta["prompt"], options=meta["options"], model=meta["model"],
                   events=events, result=result, created=meta.get("created", 0.0),
                   pieces={int(k): v for k, v in meta["pieces"].items()})

    # -- playback -----------------------------------------------------------------------------

    def replay(self, on_step: Callable[[StepEvent], bool | None] | None = None,
               delay_s: float = 0.0) -> GenerateResult:
        """Feed the events to `on_step` as `Model.generate` would; False from it cancels.

        delay_s: pause between events (the thread sleeps, so the GIL is free meanwhile).
        Returns the recorded result, or for a cancelled replay a result cut at that step.
        """
        for k, event in enumerate(self.events):
            if delay_s > 0 and k > 0:
                time.sleep(delay_s)
            if on_step is not None and on_step(event) is False:
                return self._cut_result(k + 1)
        if self.result is None:
            return self._cut_result(len(self.events))
        return self.result

    def _cut_result(self, n_steps: int) -> GenerateResult:
        """The result as it stood after the first `n_steps` events, stop reason "cancelled"."""
        ev = self.events[:n_steps]
        last = ev[-1] if ev else None
        p = last.prompt_length if last else 0
        ms = np.array([e.total_ms for e in ev], np.float64)
        gen = last.tokens[p:].astype(np.int32) if last else np.zeros(0, np.int32)
        decided = np.full(gen.shape[0], -1, np.int32)
        for e in ev:
            decided[np.asarray(e.unmasked) - p] = e.step
        # Without the tokenizer the text is the committed tokens' pieces, in order.
        text = "".join(self.pieces.get(int(t), "") for t, d in zip(gen, decided) if d >= 0)
        return GenerateResult(
            text=text, tokens=gen, prompt_tokens=last.tokens[:p].astype(np.int32) if last
            else np.zeros(0, np.int32),
            steps=len(ev), steps_allowed=last.steps_allowed if last else 0,
            stop_reason="cancelled", step_ms=ms,
            forward_ms=np.array([e.forward_ms for e in ev], np.float64),
            sample_ms=np.array([e.sample_ms for e in ev], np.float64),
            total_ms=float(ms.sum()), gen_length=gen.shape[0], useful_length=0,
            decided_step=decided)


def _events_from(data: dict[str, np.ndarray]) -> list[StepEvent]:
    n = data["tokens"].shape[0]
    events = []
    for k in range(n):
        kw = {}
        for name in _SCALARS:
            v = data[f"step_{name}"][k]
            kw[name] = float(v) if name.endswith("_ms") else int(v)
        for name in _DENSE:
            kw[name] = data[name][k]
        for name in _RAGGED:
            off = data[f"{name}_offsets"]
            kw[name] = data[f"{name}_values"][off[k]:off[k + 1]]
        events.append(StepEvent(**kw))
    return events
