"""Streaming reader for a Hugging Face checkpoint folder (one or many .safetensors shards).

Only the JSON headers are parsed up front; a tensor's bytes are memory-mapped when it is read,
rows at a time, so a 16 GB checkpoint never sits in memory.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from diffuse._core import DiffuseError

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

    def __init__(self, hf_dir: str | Path):
        hf_dir = Path(hf_dir)
        index = hf_dir / INDEX_NAME
        if index.is_file():
            shards = _shards_from_index(index)
        elif (hf_dir / SINGLE_NAME).is_file():
            shards = {SINGLE_NAME: None}
        else:
            raise DiffuseError(f"{hf_dir}: no {SINGLE_NAME} or {INDEX_NAME} (not a safetensors checkpoint)")

        self.tensors: dict[str, TensorEntry] = {}
        for shard, names in shards.items():
            path = hf_dir / shard
            if not path.is_file():
                raise DiffuseError(f"{index}: shard {shard} is missing from the folder")
            entries = _read_header(path)
            for name in names if names is not None else entries:
                if name not in entries:
                    raise DiffuseError(f"{path}: tensor {name} listed in {INDEX_NAME} is not in this shard")
                self.tensors[name] = entries[name]

    def read(self, name: str, rows=None) -> np.ndarray:
        """Tensor `name` as float32; for a matrix, only `rows` (a slice or an index array)."""
        e = self.tensors[name]
        try:
            mm = np.memmap(e.path, dtype=DTYPES[e.dtype], mode="r", offset=e.offset, shape=e.shape)
        except OSError as err:
            raise DiffuseError(f"{e.path}: cannot read tensor {name}: {err.strerror or err}") from err
        raw = mm if rows is None else mm[rows]
        if e.dtype == "BF16":
            # bf16 is the top half of a float32.
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)


def _shards_from_index(index: Path) -> dict[str, list[str]]:
    """shard file -> the tensor names the index places in it."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DiffuseError(f"{index}: unreadable index ({err})") from err
    if not isinstance(weight_map, dict):
        raise DiffuseError(f"{index}: weight_map is not an object")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise DiffuseError(f"{index}: bad shard name {shard!r} for {name}")
        shards.setdefault(shard, []).append(name)
    return shards


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
            header = json.loads(f.read(n))
    except OSError as err:
        raise DiffuseError(f"{path}: cannot read: {err.strerror or err}") from err
    except ValueError as err:
        raise DiffuseError(f"{path}: corrupt safetensors header ({err})") from err
    if not isinstance(header, dict):
        raise DiffuseError(f"{path}: corrupt safetensors header (not an object)")

    data_start = 8 + n
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if not all(isinstance(d, int) and d >= 0 for d in shape) or not (0 <= begin <= end):
                raise ValueError
        except (KeyError, TypeError, ValueError) as err:
            raise DiffuseError(f"{path}: corrupt header entry for {name}") from err
        if dtype not in DTYPES:
            raise DiffuseError(f"{path}: tensor {name} has dtype {dtype}; only BF16, F16 and F32 are supported")
        if end - begin != int(np.prod(shape)) * DTYPES[dtype].itemsize:
            raise DiffuseError(f"{path}: tensor {name} has {end - begin} bytes for shape {list(shape)} {dtype}")
        if data_start + end > size:
            raise DiffuseError(f"{path}: truncated: tensor {name} ends at byte {data_start + end} "
                               f"but the file has {size} bytes (incomplete download?)")
        entries[name] = TensorEntry(path, dtype, shape, data_start + begin)
    return entries
