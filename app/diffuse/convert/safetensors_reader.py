"""Streaming reader for a Hugging Face checkpoint folder (one or many .safetensors shards).

Only the JSON headers are parsed up front; a tensor's bytes are memory-mapped when it is read,
rows at a time, so a 16 GB checkpoint never sits in memory.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from diffuse._core import DiffuseError
from diffuse.convert.families import read_json, shown

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER_BYTES = 100 << 20   # real headers are a few hundred KB

# safetensors dtype -> numpy dtype of the stored values (BF16 is kept as raw uint16 bits).
DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


@dataclass(frozen=True)
class TensorEntry:
    path: Path
    dtype: str              # "BF16" | "F16" | "F32"
    shape: tuple[int, ...]  # numpy order: (out, in) for a linear layer
    offset: int             # absolute byte offset of the data in the shard


class Checkpoint:
    """The tensors of a checkpoint folder, by Hugging Face name."""

    def __init__(self, hf_dir: str | Path, single: str = SINGLE_NAME):
        """single: the one-file checkpoint's name (a PEFT adapter's: adapter_model.safetensors)."""
        hf_dir = Path(hf_dir)
        index = hf_dir / INDEX_NAME
        if index.is_file() and single == SINGLE_NAME:
            shards = _shards_from_index(index)
        elif (hf_dir / single).is_file():
            shards = {single: None}
        else:
            raise DiffuseError(f"{hf_dir}: no {single} or {INDEX_NAME} (not a safetensors checkpoint)")

        self.tensors: dict[str, TensorEntry] = {}
        owner = {name: shard for shard, names in shards.items() for name in names or ()}
        for shard, names in shards.items():
            path = hf_dir / shard
            if not path.is_file():
                raise DiffuseError(f"{index}: shard {shard} is missing from the folder")
            entries = _read_header(path)
            for name in entries:
                # a tensor stored twice would convert from whichever shard came last
                if owner.get(name, shard) != shard:
                    raise DiffuseError(f"{path}: tensor {shown(name)} is also in {owner[name]} "
                                       f"(where {INDEX_NAME} places it)")
            for name in names if names is not None else entries:
                if name not in entries:
                    raise DiffuseError(f"{path}: tensor {shown(name)} listed in {INDEX_NAME} is not in this shard")
                self.tensors[name] = entries[name]

    def read(self, name: str, rows=None, expert: int | None = None) -> np.ndarray:
        """Tensor `name` as float32; for a matrix, only `rows` (a slice or an index array); for a
        3-D (experts, out, in) tensor, those rows of matrix `expert`."""
        e = self.tensors[name]
        try:
            mm = np.memmap(e.path, dtype=DTYPES[e.dtype], mode="r", offset=e.offset, shape=e.shape)
        except OSError as err:
            raise DiffuseError(f"{e.path}: cannot read tensor {name}: {err.strerror or err}") from err
        if expert is not None:
            mm = mm[expert]
        raw = mm if rows is None else mm[rows]
        if e.dtype == "BF16":
            # bf16 is the top half of a float32.
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)


def _shards_from_index(index: Path) -> dict[str, list[str]]:
    """shard file -> the tensor names the index places in it."""
    data = read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise DiffuseError(f"{index}: weight_map is missing or not an object")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        # a plain file name: "../../etc/passwd" or "/etc/passwd" would read outside the folder
        if not isinstance(shard, str) or shard in ("", "..") or Path(shard).name != shard:
            raise DiffuseError(f"{index}: shard {shown(shard)} for tensor {shown(name)} is not a file "
                               "name inside the folder")
        shards.setdefault(shard, []).append(name)
    return shards


def _unique_keys(pairs: list) -> dict:
    """json.loads keeps the last of two equal keys; a header naming a tensor twice is corrupt."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"{shown(key)} appears twice")
        seen.add(key)
    return dict(pairs)


def _read_header(path: Path) -> dict[str, TensorEntry]:
    """Parses a shard's header: u64 little-endian length, then JSON {name: {dtype, shape, data_offsets}}."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DiffuseError(f"{path}: truncated safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise DiffuseError(f"{path}: not a safetensors file (header length {n}, file size {size})")
            header = json.loads(f.read(n), object_pairs_hook=_unique_keys)
    except OSError as err:
        raise DiffuseError(f"{path}: cannot read: {err.strerror or err}") from err
    except (ValueError, RecursionError) as err:   # RecursionError: nesting too deep
        raise DiffuseError(f"{path}: corrupt safetensors header ({shown(str(err))})") from err
    if not isinstance(header, dict):
        raise DiffuseError(f"{path}: corrupt safetensors header (not an object)")

    data_start = 8 + n
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {shown(name)}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise DiffuseError(f"{where}: corrupt header entry (needs dtype, shape and data_offsets)")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise DiffuseError(f"{where} has dtype {shown(dtype)}; only BF16, F16 and F32 are supported")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise DiffuseError(f"{where} has shape {shown(shape)}; expected a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
                and offsets[0] <= offsets[1]):
            raise DiffuseError(f"{where} has data_offsets {shown(offsets)}; expected [begin, end] with "
                               "0 <= begin <= end")
        begin, end = offsets
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize   # Python ints: no overflow
        if end - begin != nbytes:
            raise DiffuseError(f"{where} has {end - begin} bytes for shape {shown(shape)} {dtype} "
                               f"(expected {shown(nbytes)})")
        if data_start + end > size:
            raise DiffuseError(f"{path}: truncated: tensor {shown(name)} ends at byte {data_start + end} "
                               f"but the file has {size} bytes (incomplete download?)")
        entries[name] = TensorEntry(path, dtype, tuple(shape), data_start + begin)
    _check_overlaps(path, entries)
    return entries


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_overlaps(path: Path, entries: dict[str, TensorEntry]) -> None:
    """Two tensors sharing bytes would both be read from the same data."""
    spans = sorted((e.offset, e.offset + math.prod(e.shape) * DTYPES[e.dtype].itemsize, name)
                   for name, e in entries.items())
    for (_, end, name), (begin, _, other) in zip(spans, spans[1:]):
        if begin < end:
            raise DiffuseError(f"{path}: tensors {shown(name)} and {shown(other)} overlap in the file")
