"""Record a run's event stream to one file and play it back.

A recording holds everything a listener saw: every `StepEvent`, the `GenerateResult`, the prompt,
the options, a few facts about the model and the text of every token id that occurs, so a replay
needs neither the model nor its tokenizer. Used by Diffuse Studio (auto-saved runs, replay slider,
tests) and the CLI (`--record`).

File format: one NumPy ``.npz`` archive (zip, deflate), written atomically. With S steps and
N = prompt + generated positions:

    meta                 uint8, UTF-8 JSON: format, prompt, options, model, pieces, result scalars
    step_<field>         (S,) one array per scalar field of StepEvent (step, block, ..., total_ms)
    step_scheduled       (S,) the count the schedule asked for; absent in recordings made before
                         events carried it (loaded as -1: unknown)
    tokens               int32 (S, N)
    mask                 bool  (S, N)
    entropy, confidence  float32 (S, N), NaN where not evaluated
    <ragged>_values      int32 (sum of lengths,) for unmasked, active, cached, edited ...
    <ragged>_offsets     int64 (S + 1,) ... event k owns values[offsets[k]:offsets[k + 1]];
                         edited is absent in recordings made before events carried it (loaded
                         as no edits)
    experts_values       int16, MoE runs only: every event's experts (n_layer, n_active, k), flat
    experts_offsets      int64 (S + 1,), experts_dims int32 (S, 2): (n_layer, k), (0, 0) = none
    draft_values, draft_offsets, redrawn_values, redrawn_offsets, step_entropy_cut
                         uniform-state runs (DiffusionGemma) only: each event's argmax draft
                         (token ids), re-drawn positions and entropy cut
    spec_draft_values, spec_draft_offsets
                         self-speculation runs only: each event's drafted block (token ids;
                         none: an event without a draft, the prefill); step_spec_accepted (S,)
                         the drafts kept (-1: none; absent in older recordings)
    window_order_values, window_order_offsets, committed_values, committed_offsets
                         WeDLM runs only: each event's window in pass order and the positions
                         it committed (none: an event without a window)
    result_<array>       the result's arrays (tokens, prompt_tokens, step_ms, ...)
"""
from __future__ import annotations

import errno
import io
import json
import math
import os
import stat
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from diffuse._core import DiffuseError
from diffuse.events import GenerateResult, StepEvent
from diffuse.generation import OPTION_NAMES

FORMAT = "diffuse-recording"
VERSION = 1

_SCALARS = ("step", "block", "n_blocks", "steps_allowed", "prompt_length", "block_start",
            "block_end", "forward_ms", "sample_ms", "total_ms")
_DENSE = ("tokens", "mask", "entropy", "confidence")
_DENSE_DTYPES = {"tokens": np.int32, "mask": np.bool_, "entropy": np.float32,
                 "confidence": np.float32}
_RAGGED = ("unmasked", "active", "cached", "edited")
_OPTIONAL_RAGGED = ("edited",)           # absent in recordings made before it was kept: none
_RESULT_ARRAYS = ("tokens", "prompt_tokens", "step_ms", "forward_ms", "sample_ms", "decided_step")
# name -> its value in recordings made before it was kept (and, for spec_accepted, in other modes)
_OPTIONAL_SCALARS = {"scheduled": -1, "spec_accepted": -1}
_EXPERTS = {"experts_values": (np.int16, 1), "experts_offsets": (np.int64, 1), "experts_dims": (np.int32, 2)}
_MAX_EXPERT = 4096      # the engine's bound on experts per layer
# Uniform-state diffusion (DiffusionGemma): all of them or none.
_UNIFORM = {"draft_values": (np.int32, 1), "draft_offsets": (np.int64, 1), "redrawn_values": (np.int32, 1),
            "redrawn_offsets": (np.int64, 1), "step_entropy_cut": (np.float64, 1)}
# Decoding over a causal cache, each group only in the runs that have it: self-speculation's drafts,
# WeDLM's window (pass order and commits); an event without one holds no values.
_CAUSAL = {f"{name}_{part}": (np.int32 if part == "values" else np.int64, 1)
           for name in ("spec_draft", "window_order", "committed") for part in ("values", "offsets")}
_RESULT_SCALARS = ("text", "steps", "steps_allowed", "stop_reason", "total_ms", "gen_length",
                   "useful_length", "forward_passes")
_RESULT_LATER = {"forward_passes"}     # result fields a recording made before they were kept lacks

# What `save` writes: member -> (dtype, dimensions). Anything else in an archive is refused.
_SCHEMA = ({"meta": (np.uint8, 1)}
           | {f"step_{n}": (np.float64, 1) for n in (*_SCALARS, *_OPTIONAL_SCALARS)}
           | {n: (_DENSE_DTYPES[n], 2) for n in _DENSE}
           | {f"{n}_values": (np.int32, 1) for n in _RAGGED}
           | {f"{n}_offsets": (np.int64, 1) for n in _RAGGED}
           | {f"result_{n}": (np.float64 if n.endswith("_ms") else np.int32, 1)
              for n in _RESULT_ARRAYS}
           | _EXPERTS      # optional: only runs of MoE models have them
           | _UNIFORM      # optional: only uniform-state runs have them
           | _CAUSAL)      # optional: only self-speculation and WeDLM runs have them
MAX_BYTES = 256 * 2**20     # the most a recording may hold, loaded (a long real run is ~50 MB)
# A replay's view keeps four float32 and one int8 per allowed step and position
# (studio.run_state): steps_allowed is bounded so that this fits in MAX_BYTES too.
_VIEW_BYTES_PER_CELL = 17
_INT_MAX = 2**31 - 1


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the new one.

    The bytes go to a temporary file in the same folder (which must exist), are flushed to disk,
    then renamed over `path` (a rename within one file system is atomic). The file gets the mode
    any new file of the user's gets (0666 less the umask), not mkstemp's private 0600.
    """
    from diffuse.gguf_file import replace_durably

    path = Path(path)
    if not path.parent.is_dir():
        raise DiffuseError(f"{path}: the folder {path.parent} does not exist")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o666 & ~_UMASK)
        replace_durably(Path(tmp), path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):   # a full disk, a read-only folder: one line, not a traceback
            why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else f"cannot write: {e.strerror or e}"
            raise DiffuseError(f"{path}: {why}; nothing was written") from None
        raise


_UMASK = os.umask(0)   # read once, at import: os.umask can only be read by setting it
os.umask(_UMASK)


@dataclass
class Recording:
    """A run as its listeners saw it. Pass `rec.add` as `on_step`, then call `rec.finish`."""

    prompt: str = ""
    # The options that ran, as resolve_options gave them to the engine: the seed a run drew when
    # none was given is here, so that the recording says how to repeat it.
    options: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)       # e.g. name, arch, path, n_vocab
    events: list[StepEvent] = field(default_factory=list)
    result: GenerateResult | None = None
    pieces: dict[int, str] = field(default_factory=dict)   # token id -> its text
    created: float = field(default_factory=time.time)
    # The prompt is the model's templated input (a served request: the server keeps token ids, not
    # the client's messages), not text a user typed: running it again would template it twice.
    templated: bool = False

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
        """Every distinct token id in the events (drafts too: a rejected draft's token may occur nowhere
        else) and the result, sorted."""
        arrays = [a for e in self.events for a in (e.tokens, e.spec_draft, e.draft) if a is not None]
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
        for name in (*_SCALARS, *_OPTIONAL_SCALARS):
            arrays[f"step_{name}"] = np.array([getattr(e, name) for e in ev], np.float64)
        n_total = ev[0].tokens.shape[0] if ev else 0
        for name in _DENSE:
            rows = [np.asarray(getattr(e, name), _DENSE_DTYPES[name]) for e in ev]
            arrays[name] = (np.stack(rows) if rows
                            else np.zeros((0, n_total), _DENSE_DTYPES[name]))
        for name in _RAGGED:
            arrays.update(_ragged(name, [getattr(e, name) for e in ev]))
        if any(e.experts is not None for e in ev):
            arrays.update(_experts_arrays(ev))
        if ev and ev[0].draft is not None:
            for name in ("draft", "redrawn"):
                arrays.update(_ragged(name, [getattr(e, name) for e in ev]))
            arrays["step_entropy_cut"] = np.array([e.entropy_cut for e in ev], np.float64)
        for group in (("spec_draft",), ("window_order", "committed")):
            if any(getattr(e, group[0]) is not None for e in ev):
                for name in group:
                    arrays.update(_ragged(name, [getattr(e, name) for e in ev]))
        result = None
        if self.result is not None:
            result = {name: getattr(self.result, name) for name in _RESULT_SCALARS}
            for name in _RESULT_ARRAYS:
                arrays[f"result_{name}"] = np.asarray(getattr(self.result, name))
        meta = {"format": FORMAT, "version": VERSION, "prompt": self.prompt,
                "options": self.options, "model": self.model, "created": self.created,
                "pieces": {str(k): v for k, v in self.pieces.items()}, "result": result,
                "templated": self.templated}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        write_atomic(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Recording:
        """Read a recording written by `save`; DiffuseError if the file is not one.

        Every member's declared size is checked before its data is read, and the metadata's
        numbers against the arrays, so a hostile file costs at most MAX_BYTES of memory."""
        try:
            data = _read_members(path)
        except FileNotFoundError:
            raise DiffuseError(f"{path}: no such recording") from None
        except (OSError, ValueError, zipfile.BadZipFile, zlib.error, EOFError, RuntimeError,
                NotImplementedError) as e:
            raise DiffuseError(f"{path}: not a diffuse recording ({e})") from None
        try:
            meta = _check(data)
            events = _events_from(data)
        except (KeyError, ValueError, TypeError, IndexError, RecursionError) as e:
            raise DiffuseError(f"{path}: damaged diffuse recording ({e})") from None
        result = None
        if meta["result"] is not None:
            result = GenerateResult(**meta["result"], options=_engine_options(meta["options"]),
                                    **{n: data[f"result_{n}"] for n in _RESULT_ARRAYS})
        return cls(prompt=meta["prompt"], options=meta["options"], model=meta["model"],
                   events=events, result=result, created=meta.get("created", 0.0),
                   pieces={int(k): v for k, v in meta["pieces"].items()},
                   templated=meta.get("templated", False))   # absent in recordings made before it

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
            decided_step=decided, options=_engine_options(self.options))


def _engine_options(options: dict) -> dict:
    """A recording's options less what is not the engine's (the Studio keeps `chat` and `threads`
    there too): a result's options."""
    return {k: v for k, v in options.items() if k in OPTION_NAMES}


def _events_from(data: dict[str, np.ndarray]) -> list[StepEvent]:
    n = data["tokens"].shape[0]
    events = []
    for k in range(n):
        kw = {}
        for name in _SCALARS:
            v = data[f"step_{name}"][k]
            kw[name] = float(v) if name.endswith("_ms") else int(v)
        for name, unknown in _OPTIONAL_SCALARS.items():
            kw[name] = int(data[f"step_{name}"][k]) if f"step_{name}" in data else unknown
        for name in _DENSE:
            kw[name] = data[name][k]
        for name in _RAGGED:
            if f"{name}_offsets" not in data:      # an optional one, from an older recording
                kw[name] = np.zeros(0, np.int32)
                continue
            off = data[f"{name}_offsets"]
            kw[name] = data[f"{name}_values"][off[k]:off[k + 1]]
        if "draft_offsets" in data:
            for name in ("draft", "redrawn"):
                off = data[f"{name}_offsets"]
                kw[name] = data[f"{name}_values"][off[k]:off[k + 1]]
            kw["entropy_cut"] = float(data["step_entropy_cut"][k])
        for name in ("spec_draft", "window_order", "committed"):
            if f"{name}_offsets" in data:
                off = data[f"{name}_offsets"]
                kw[name] = data[f"{name}_values"][off[k]:off[k + 1]]
        # a draft or a window is never empty: none held means the event had none (its commits go with its window)
        for name in ("spec_draft", "window_order"):
            if name in kw and not kw[name].size:
                kw[name] = None
        if kw.get("window_order") is None:
            kw.pop("committed", None)
        if "experts_dims" in data and data["experts_dims"][k, 0] > 0:
            off, (n_layer, used) = data["experts_offsets"], data["experts_dims"][k]
            kw["experts"] = data["experts_values"][off[k]:off[k + 1]].astype(np.int32).reshape(
                n_layer, len(kw["active"]), used)
        events.append(StepEvent(**kw))
    return events


def _check_uniform(data: dict[str, np.ndarray], s: int, n: int) -> None:
    """Uniform-state members: all present, offsets that split their values, re-drawn positions in
    [0, n), token ids that are not negative, finite cuts."""
    missing = [m for m in _UNIFORM if m not in data]
    if missing:
        raise ValueError(f"missing members {', '.join(missing)}")
    for name, top in (("draft", None), ("redrawn", n)):
        off, values = _shape(data, f"{name}_offsets", (s + 1,)), data[f"{name}_values"]
        if off[0] != 0 or (np.diff(off) < 0).any() or off[-1] != values.shape[0]:
            raise ValueError(f"{name}_offsets do not split {name}_values")
        if values.size and (values.min() < 0 or (top is not None and values.max() >= top)):
            raise ValueError(f"{name}_values out of range")
    if not np.isfinite(_shape(data, "step_entropy_cut", (s,))).all():
        raise ValueError("step_entropy_cut: not finite")


def _check_causal(data: dict[str, np.ndarray], s: int, n: int) -> None:
    """Self-speculation and WeDLM members: both of a name, offsets that split their values, draft
    token ids not negative, kept drafts fewer than the block drafted, window and committed positions
    in [0, n), commits only in events with a window."""
    lengths = {}
    for name in ("spec_draft", "window_order", "committed"):
        parts = (f"{name}_values", f"{name}_offsets")
        if not any(p in data for p in parts):
            continue
        if not all(p in data for p in parts):
            raise ValueError(f"expected both of {', '.join(parts)}")
        off, values = _shape(data, parts[1], (s + 1,)), data[parts[0]]
        if off[0] != 0 or (np.diff(off) < 0).any() or off[-1] != values.shape[0]:
            raise ValueError(f"{parts[1]} do not split {parts[0]}")
        top = None if name == "spec_draft" else n
        if values.size and (values.min() < 0 or (top is not None and values.max() >= top)):
            raise ValueError(f"{parts[0]} out of range")
        lengths[name] = np.diff(off)
    if "committed" in lengths and ("window_order" not in lengths
                                   or ((lengths["committed"] > 0) & (lengths["window_order"] == 0)).any()):
        raise ValueError("committed positions without a window")
    accepted = data.get("step_spec_accepted")
    if accepted is not None and "spec_draft" in lengths:
        drafted = lengths["spec_draft"]
        if ((drafted > 0) & (accepted >= drafted)).any():
            raise ValueError("step_spec_accepted: more drafts kept than drafted")


def _ragged(name: str, parts: list) -> dict[str, np.ndarray]:
    """The <name>_values and <name>_offsets members of per-event int32 arrays (None: none)."""
    parts = [np.zeros(0, np.int32) if p is None else np.asarray(p, np.int32).ravel() for p in parts]
    return {f"{name}_values": np.concatenate(parts) if parts else np.zeros(0, np.int32),
            f"{name}_offsets": np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)}


def _experts_arrays(events: list[StepEvent]) -> dict[str, np.ndarray]:
    """The events' expert routing as the experts_* members (an event without any: dims (0, 0))."""
    parts = [np.zeros(0, np.int16) if e.experts is None else np.asarray(e.experts, np.int16).ravel() for e in events]
    dims = [(0, 0) if e.experts is None else (e.experts.shape[0], e.experts.shape[2]) for e in events]
    return {"experts_values": np.concatenate(parts),
            "experts_offsets": np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64),
            "experts_dims": np.asarray(dims, np.int32).reshape(len(events), 2)}


def _read_members(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The archive's arrays; sizes are checked against MAX_BYTES before any data is read."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")      # a FIFO would block open() forever
    with open(path, "rb") as f, zipfile.ZipFile(f) as zf:
        infos = zf.infolist()
        # Deflate stops at a member's declared size, so declared sizes bound what is read.
        total = sum(i.file_size for i in infos)
        if total > MAX_BYTES:
            raise ValueError(f"its members hold {total} bytes, more than {MAX_BYTES}")
        data = {}
        for info in infos:
            name = info.filename.removesuffix(".npy")
            if name not in _SCHEMA or name in data:
                raise ValueError(f"unexpected member {info.filename!r}")
            with zf.open(info) as fp:
                data[name] = _read_npy(fp, name, info.file_size)
    return data


def _read_npy(fp, name: str, size: int) -> np.ndarray:
    """One .npy member, its header checked against _SCHEMA and `size` before reading data."""
    version = np.lib.format.read_magic(fp)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"{name}: .npy format {version}")
    try:
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(fp)
    except ValueError:     # numpy's own text advises unsafe loading options: not for our users
        raise ValueError(f"{name}: an array header we do not write") from None
    want, ndim = _SCHEMA[name]
    if dtype != np.dtype(want) or len(shape) != ndim or fortran or min(shape, default=0) < 0:
        raise ValueError(f"{name}: {dtype.str} {shape}{' (Fortran order)' if fortran else ''}, "
                         f"expected {np.dtype(want).str} with {ndim} dimension(s)")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > size:
        raise ValueError(f"{name}: declares {nbytes} bytes, the member holds {size}")
    arr = np.empty(shape, dtype)
    if fp.readinto(arr.reshape(-1).view(np.uint8)) != nbytes:
        raise ValueError(f"{name}: truncated")
    return arr


def _check(data: dict[str, np.ndarray]) -> dict:
    """The metadata, after checking it and the arrays against each other; ValueError if not."""
    meta = json.loads(bytes(data["meta"]).decode("utf-8"))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError("wrong format tag")
    if meta.get("version") != VERSION:
        raise ValueError(f"format version {meta.get('version')!r}, this build reads {VERSION}")
    _want(meta, "prompt", str)
    _want(meta, "options", dict)
    _want(meta, "model", dict)
    _want(meta, "pieces", dict)
    if "created" in meta:
        _number(meta, "created")
    if "templated" in meta:
        _want(meta, "templated", bool)
    for k, v in meta["pieces"].items():
        if not (k.isascii() and k.isdigit() and len(k) < 12 and isinstance(v, str)):
            raise ValueError(f"piece {k[:20]!r}: expected a token id and its text")
    missing = [n for n in _SCHEMA if n not in data and n not in _EXPERTS and n not in _UNIFORM and n not in _CAUSAL
               and n.removeprefix("step_") not in _OPTIONAL_SCALARS
               and n.rsplit("_", 1)[0] not in _OPTIONAL_RAGGED
               and not (n.startswith("result_") and meta.get("result") is None)]
    if missing:
        raise ValueError(f"missing members {', '.join(missing)}")
    s, n = data["tokens"].shape
    for name in _DENSE:
        _shape(data, name, (s, n))
    for name in _SCALARS:
        v = _shape(data, f"step_{name}", (s,))
        if not np.isfinite(v).all():
            raise ValueError(f"step_{name}: not finite")
        if not name.endswith("_ms") and not ((v == np.floor(v)) & (v >= 0) & (v <= _INT_MAX)).all():
            raise ValueError(f"step_{name}: expected counts in [0, {_INT_MAX}]")
    for name, unknown in _OPTIONAL_SCALARS.items():
        if f"step_{name}" in data:
            v = _shape(data, f"step_{name}", (s,))
            if not ((v == np.floor(v)) & (v >= unknown) & (v <= _INT_MAX)).all():
                raise ValueError(f"step_{name}: expected counts in [{unknown}, {_INT_MAX}]")
    steps_cap = MAX_BYTES // (_VIEW_BYTES_PER_CELL * max(n, 1))
    if s and data["step_steps_allowed"].max() > steps_cap:
        raise ValueError(f"steps_allowed {data['step_steps_allowed'].max():.0f} is more than "
                         f"{steps_cap} for {n} positions")
    for name in ("prompt_length", "block_start", "block_end", "n_blocks", "block"):
        if s and data[f"step_{name}"].max() > n:
            raise ValueError(f"step_{name} is past the {n} positions")
    if (data["tokens"] < 0).any():
        raise ValueError("negative token ids")
    for name in _RAGGED:
        if name in _OPTIONAL_RAGGED and f"{name}_offsets" not in data and f"{name}_values" not in data:
            continue
        off = _shape(data, f"{name}_offsets", (s + 1,))
        values = data[f"{name}_values"]
        if off[0] != 0 or (np.diff(off) < 0).any() or off[-1] != values.shape[0]:
            raise ValueError(f"{name}_offsets do not split {name}_values")
        if values.size and (values.min() < 0 or values.max() >= n):
            raise ValueError(f"{name}_values are not positions in [0, {n})")
    if any(name in data for name in _EXPERTS):
        _check_experts(data, s)
    if any(name in data for name in _UNIFORM):
        _check_uniform(data, s, n)
    if any(name in data for name in _CAUSAL):
        _check_causal(data, s, n)
    result = meta.get("result")
    if result is not None:
        if not isinstance(result, dict) or not set(_RESULT_SCALARS) - _RESULT_LATER <= set(result) <= set(_RESULT_SCALARS):
            raise ValueError(f"result: expected the fields {', '.join(_RESULT_SCALARS)}")
        _want(result, "text", str)
        _want(result, "stop_reason", str)
        _number(result, "total_ms")
        for name in ("steps", "steps_allowed", "gen_length", "useful_length", *(_RESULT_LATER & set(result))):
            _want(result, name, int)
            if not 0 <= result[name] <= _INT_MAX:
                raise ValueError(f"result {name} = {result[name]} is out of range")
        if result["steps_allowed"] > steps_cap:
            raise ValueError(f"result steps_allowed {result['steps_allowed']} is more than "
                             f"{steps_cap} for {n} positions")
    return meta


def _check_experts(data: dict[str, np.ndarray], s: int) -> None:
    """Each event's routing fills (n_layer, its active count, k) exactly, with ids in [-1, 4096)."""
    if any(name not in data for name in _EXPERTS):
        raise ValueError(f"expected all of {', '.join(_EXPERTS)}")
    dims, off, values = _shape(data, "experts_dims", (s, 2)), _shape(data, "experts_offsets", (s + 1,)), \
        data["experts_values"]
    active = np.diff(data["active_offsets"])
    size = dims[:, 0].astype(np.int64) * dims[:, 1] * active
    if (dims < 0).any() or (dims > _MAX_EXPERT).any() or off[0] != 0 or (np.diff(off) != size).any() \
            or off[-1] != values.shape[0]:
        raise ValueError("experts_offsets and experts_dims do not split experts_values")
    if values.size and (values.min() < -1 or values.max() >= _MAX_EXPERT):
        raise ValueError(f"experts_values are not expert ids in [-1, {_MAX_EXPERT})")


def _want(d: dict, key: str, kind: type) -> None:
    if type(d.get(key)) is not kind:        # exact: JSON's true is no count
        raise ValueError(f"{key}: expected {kind.__name__}, got {type(d.get(key)).__name__}")


def _number(d: dict, key: str) -> None:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{key}: expected a finite number, got {v!r}")


def _shape(data: dict[str, np.ndarray], name: str, shape: tuple) -> np.ndarray:
    if data[name].shape != shape:
        raise ValueError(f"{name}: shape {data[name].shape}, expected {shape}")
    return data[name]
