"""Hostile recordings: every crafted .npz is refused by Recording.load with a DiffuseError that
names the file, quickly and without allocating in proportion to any number the file declares.

The cases start from a real recorded run (tests/fixtures/runs/blocks_cache.npz) and break one
thing each; CASES groups them by class (container, sizes, dtypes, metadata, arrays).
"""
from __future__ import annotations

import io
import json
import os
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from diffuse import DiffuseError
from diffuse.recording import MAX_BYTES, Recording

BASE = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "blocks_cache.npz"
PEAK_BYTES = 32 * 2**20     # far below any size the cases declare
SECONDS = 5.0


def base_members() -> dict[str, bytes]:
    with zipfile.ZipFile(BASE) as z:
        return {name: z.read(name) for name in z.namelist()}


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=True)
    return buf.getvalue()


def header_only(descr: str, shape: tuple, version=(1, 0), fortran=False) -> bytes:
    """A .npy member that declares `shape` but carries 16 bytes of data."""
    buf = io.BytesIO()
    d = {"descr": descr, "fortran_order": fortran, "shape": shape}
    if version == (1, 0):
        np.lib.format.write_array_header_1_0(buf, d)
    else:
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue() + bytes(16)


def array(name: str) -> np.ndarray:
    return np.lib.format.read_array(io.BytesIO(base_members()[f"{name}.npy"]))


def meta() -> dict:
    return json.loads(bytes(array("meta")).decode())


def zipped(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def changed(**members) -> bytes:
    """The base run with some members replaced (bytes or arrays) or dropped (None)."""
    out = base_members()
    for name, value in members.items():
        if value is None:
            out.pop(f"{name}.npy")
        else:
            out[f"{name}.npy"] = value if isinstance(value, bytes) else npy(value)
    return zipped(out)


def with_meta(**fields) -> bytes:
    return changed(meta=np.frombuffer(json.dumps(meta() | fields).encode(), np.uint8))


def with_result(**fields) -> bytes:
    return with_meta(result=meta()["result"] | fields)


def with_step(name: str, value) -> bytes:
    v = array(f"step_{name}").copy()
    v[3] = value
    return changed(**{f"step_{name}": v})


def offsets(values) -> np.ndarray:
    return np.asarray(values, np.int64)


def whole() -> bytes:
    return BASE.read_bytes()


def flip_data_byte() -> bytes:
    data = bytearray(whole())
    data[len(data) // 3] ^= 0xFF
    return bytes(data)


def oversized_member_declared_in_zip() -> bytes:
    """A member whose zip entry says it unpacks to more than MAX_BYTES (the data is short)."""
    data = bytearray(changed())
    entry = data.rfind(b"PK\x01\x02")        # the last member's central directory entry
    data[entry + 24:entry + 28] = (MAX_BYTES + 1).to_bytes(4, "little")
    return bytes(data)


n = array("tokens").shape[1]
s = array("tokens").shape[0]
CASES = {
    "container": {
        "empty": lambda: b"",
        "text": lambda: b"just some text\n" * 10,
        "random bytes": lambda: np.random.default_rng(0).bytes(4096),
        "truncated at half": lambda: whole()[:len(whole()) // 2],
        "truncated at 90%": lambda: whole()[:len(whole()) * 9 // 10],
        "corrupt deflate data": flip_data_byte,
        "unknown member": lambda: zipped(base_members() | {"evil.txt": b"hi"}),
        "member without .npy": lambda: zipped(base_members() | {"meta": b"x"}),
        "npy member not npy": lambda: changed(tokens=b"not an npy file at all"),
        "zip declares a huge member": oversized_member_declared_in_zip,
    },
    "sizes": {
        "tokens declare 2^40 rows": lambda: changed(tokens=header_only("<i4", (2**40, n))),
        "meta declares 2^33 bytes": lambda: changed(meta=header_only("|u1", (2**33,))),
        "values declare more than held": lambda: changed(active_values=header_only("<i4", (4096,))),
        "entropy shape past 2^64 bytes": lambda: changed(
            entropy=header_only("<f4", (2**40, 2**40))),
        "negative shape": lambda: changed(cached_values=header_only("<i4", (-5,))),
    },
    "dtypes": {
        "pickled object member": lambda: changed(meta=np.array([{"a": 1}], dtype=object)),
        "meta as float64": lambda: changed(meta=array("meta").astype(np.float64)),
        "tokens as float32": lambda: changed(tokens=array("tokens").astype(np.float32)),
        "mask as int8": lambda: changed(mask=array("mask").astype(np.int8)),
        "offsets as int32": lambda: changed(active_offsets=array("active_offsets").astype(np.int32)),
        "big-endian tokens": lambda: changed(tokens=array("tokens").astype(">i4")),
        "structured dtype": lambda: changed(entropy=np.zeros((s, n), [("a", "<f4")])),
        "fortran order": lambda: changed(tokens=np.asfortranarray(array("tokens"))),
        "npy version 2 with wrong dtype": lambda: changed(
            tokens=header_only("<f8", (s, n), version=(2, 0))),
        "tokens 1-D": lambda: changed(tokens=array("tokens").ravel()),
        "meta 0-d": lambda: changed(meta=np.uint8(7)),
    },
    "metadata": {
        "not JSON": lambda: changed(meta=np.frombuffer(b"{not json", np.uint8)),
        "not UTF-8": lambda: changed(meta=np.frombuffer(b"\xff\xfe\x00", np.uint8)),
        "JSON list": lambda: changed(meta=np.frombuffer(b"[1, 2]", np.uint8)),
        "deeply nested": lambda: changed(meta=np.frombuffer(b"[" * 200_000, np.uint8)),
        "wrong format tag": lambda: with_meta(format="something-else"),
        "future version": lambda: with_meta(version=2),
        "prompt is a number": lambda: with_meta(prompt=5),
        "options is a list": lambda: with_meta(options=[1]),
        "model is a string": lambda: with_meta(model="x"),
        "pieces is a list": lambda: with_meta(pieces=["a"]),
        "piece id not a number": lambda: with_meta(pieces={"x": "a"}),
        "piece id unicode digit": lambda: with_meta(pieces={"\u00b2": "a"}),
        "piece text a number": lambda: with_meta(pieces={"5": 5}),
        "created NaN": lambda: with_meta(created=float("nan")),
        "created a string": lambda: with_meta(created="yesterday"),
        "templated a number": lambda: with_meta(templated=1),
        "result a list": lambda: with_meta(result=[1]),
        "result field missing": lambda: with_meta(
            result={k: v for k, v in meta()["result"].items() if k != "steps"}),
        "result extra field": lambda: with_result(evil=1),
        "result steps a float": lambda: with_result(steps=2.5),
        "result steps a bool": lambda: with_result(steps=True),
        "result steps negative": lambda: with_result(steps=-1),
        "result steps_allowed 5e6": lambda: with_result(steps_allowed=5_000_000),
        "result gen_length 2^40": lambda: with_result(gen_length=2**40),
        "result total_ms a string": lambda: with_result(total_ms="fast"),
        "result text null": lambda: with_result(text=None),
    },
    "arrays": {
        "steps_allowed 5e6": lambda: with_step("steps_allowed", 5e6),
        "steps_allowed 1e300": lambda: with_step("steps_allowed", 1e300),
        "step NaN": lambda: with_step("step", np.nan),
        "block negative": lambda: with_step("block", -1),
        "block fractional": lambda: with_step("block", 0.5),
        "n_blocks 5e9": lambda: with_step("n_blocks", 5e9),
        "prompt_length past the buffer": lambda: with_step("prompt_length", n + 1),
        "total_ms infinite": lambda: with_step("total_ms", np.inf),
        "step scalars short": lambda: changed(step_step=array("step_step")[:-1]),
        "mask shape differs": lambda: changed(mask=array("mask")[:, :-1]),
        "offsets not from 0": lambda: changed(active_offsets=array("active_offsets") + 1),
        "offsets decreasing": lambda: changed(active_offsets=offsets(
            [0] + [10**6] + list(array("active_offsets")[2:]))),
        "offsets past values": lambda: changed(unmasked_offsets=offsets(
            list(array("unmasked_offsets")[:-1]) + [10**9])),
        "offsets short": lambda: changed(cached_offsets=array("cached_offsets")[:-1]),
        "positions past the buffer": lambda: changed(
            unmasked_values=np.full_like(array("unmasked_values"), n)),
        "negative positions": lambda: changed(
            active_values=np.full_like(array("active_values"), -3)),
        "negative token ids": lambda: changed(tokens=np.full_like(array("tokens"), -1)),
        "entropy missing": lambda: changed(entropy=None),
        "result member missing": lambda: changed(result_step_ms=None),
    },
}
FLAT = [(cls, name, make) for cls, cases in CASES.items() for name, make in cases.items()]


def test_case_counts():
    counts = {cls: len(cases) for cls, cases in CASES.items()}
    print("hostile recordings per class:", counts, "total", len(FLAT))
    assert all(c >= 5 for c in counts.values())


def test_base_run_loads(tmp_path):
    """The crafting itself breaks nothing: the base run, rezipped, still loads."""
    path = tmp_path / "base.npz"
    path.write_bytes(changed())
    assert len(Recording.load(path).events) == s and Recording.load(path).result is not None


@pytest.mark.parametrize("cls,name,make", FLAT, ids=[f"{c}: {n}" for c, n, _ in FLAT])
def test_hostile_recording_is_refused(tmp_path, cls, name, make):
    path = tmp_path / "hostile.npz"
    path.write_bytes(make())
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(DiffuseError, match="hostile.npz"):
            Recording.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < SECONDS
    assert peak < PEAK_BYTES, f"{name}: {peak} bytes at peak"


def test_not_a_file_is_refused(tmp_path):
    with pytest.raises(DiffuseError, match="no such recording"):
        Recording.load(tmp_path / "missing.npz")
    with pytest.raises(DiffuseError, match="not a diffuse recording"):
        Recording.load(tmp_path)
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)          # open() would wait for a writer forever
    with pytest.raises(DiffuseError, match="not a regular file"):
        Recording.load(fifo)
