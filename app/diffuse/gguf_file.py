"""Read any GGUF file's metadata and tensor table, and write GGUF files one tensor at a time.

Reading goes through ``diffuse._core.read_gguf`` (ggml's own parser), so Python sees a file exactly
as the engine does. Writing uses the ``gguf`` package's writer with every key's original type.
"""
from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from diffuse import _core
from diffuse._core import DiffuseError

# The three dialects (see docs/ARCHITECTURE.md). "other": a GGUF that is no diffusion model.
DIALECT_OURS = "diffuse"
DIALECT_LLAMA_CPP = "llama.cpp"
DIALECT_DIFFUSE_CPP = "diffuse-cpp"
DIALECT_OTHER = "other"
FAMILIES = ("llada", "dream", "sdar", "fast-dllm-v2", "nemotron-diffusion", "wedlm")
# general.architecture -> family: LLaDA-MoE runs as the LLaDA family (schedules, chat, no shift).
# LLaDA2 is block diffusion with SDAR's rules and defaults.
ARCH_FAMILIES = {"llada": "llada", "dream": "dream", "llada-moe": "llada", "sdar": "sdar",
                 "fast-dllm-v2": "fast-dllm-v2", "llada2": "sdar", "diffusion-gemma": "diffusion-gemma",
                 "nemotron-diffusion": "nemotron-diffusion", "wedlm": "wedlm", "wedlm-qwen2": "wedlm"}

# ggml's names for GGUF value types (gguf_type_name), as read_gguf reports them in kv_types.
_VALUE_TYPES = {
    "u8": GGUFValueType.UINT8, "i8": GGUFValueType.INT8, "u16": GGUFValueType.UINT16,
    "i16": GGUFValueType.INT16, "u32": GGUFValueType.UINT32, "i32": GGUFValueType.INT32,
    "u64": GGUFValueType.UINT64, "i64": GGUFValueType.INT64, "f32": GGUFValueType.FLOAT32,
    "f64": GGUFValueType.FLOAT64, "bool": GGUFValueType.BOOL, "str": GGUFValueType.STRING,
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: int            # ggml type id
    type_name: str
    shape: tuple         # ggml order: fastest dimension first, e.g. (n_embd, n_vocab)
    offset: int          # absolute offset of the data in the file
    nbytes: int
    path: str

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def rows(self) -> int:
        """Rows of the tensor seen as a matrix (n_elements / shape[0])."""
        return self.n_elements // self.shape[0] if self.shape[0] else 0

    def raw(self) -> np.memmap:
        """The tensor's bytes, memory-mapped read-only: uint8 (rows, bytes per row)."""
        size = os.path.getsize(self.path)
        if self.offset + self.nbytes > size:
            raise DiffuseError(f"{self.path}: tensor {self.name} lies past the end of the file "
                               f"(needs {self.offset + self.nbytes} bytes, file has {size}; truncated download?)")
        rows = max(self.rows, 1)
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.offset,
                         shape=(rows, self.nbytes // rows))


@dataclass
class GGUFInfo:
    path: str
    version: int
    alignment: int
    data_offset: int
    file_size: int
    kv: dict
    kv_types: dict               # key -> ggml type name ("u32", "str", "array[i32]", ...)
    tensors: list[TensorInfo] = field(default_factory=list)

    @property
    def architecture(self) -> str | None:
        arch = self.kv.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def dialect(self) -> str:
        return dialect_of(self.kv)[0]

    @property
    def family(self) -> str | None:
        """llada, dream, or None when the file is no diffusion model."""
        return dialect_of(self.kv)[1]

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


def read(path: str | os.PathLike) -> GGUFInfo:
    """Metadata and tensor table of a GGUF file (raises DiffuseError on a bad file)."""
    path = str(path)
    d = _core.read_gguf(path)
    tensors = [TensorInfo(name=t["name"], type=t["type"], type_name=t["type_name"], shape=tuple(t["shape"]),
                          offset=t["offset"], nbytes=t["nbytes"], path=path) for t in d["tensors"]]
    return GGUFInfo(path=path, version=d["version"], alignment=d["alignment"], data_offset=d["data_offset"],
                    file_size=d["file_size"], kv=dict(d["kv"]), kv_types=dict(d["kv_types"]), tensors=tensors)


def dialect_of(kv: dict) -> tuple[str, str | None]:
    """(dialect, family) from the metadata, by the same rules as the engine's loader."""
    arch = kv.get("general.architecture")
    if arch == "diffuse":
        family = kv.get("diffuse.model_type")
        return DIALECT_DIFFUSE_CPP, family if family in FAMILIES else None
    if arch in ARCH_FAMILIES:
        return (DIALECT_OURS if "diffuse.format_version" in kv else DIALECT_LLAMA_CPP), ARCH_FAMILIES[arch]
    return DIALECT_OTHER, None


# ---- writing ----

@dataclass(frozen=True)
class OutTensor:
    """A tensor to write: name, ggml type and shape in ggml order (fastest dimension first)."""
    name: str
    type: int
    shape: tuple

    @property
    def nbytes(self) -> int:
        info = _core.type_info(self.type)
        n = int(np.prod(self.shape, dtype=np.int64))
        return n // info["block_size"] * info["type_size"]


def write(out_path: str | os.PathLike, kv: dict, kv_types: dict, tensors: list[OutTensor],
          data: Iterable[np.ndarray]) -> None:
    """Write a GGUF file: every key with its original type, then each tensor's bytes as `data` yields them.

    `data` yields one array per tensor, in order (any dtype; its bytes are written as they are), so
    only one tensor is in memory at a time. The file is written to OUT.part (whatever was there is
    removed first: callers make sure with refuse_overwrite() that it is none of their inputs),
    synced to disk and renamed at the end; on any failure (a full disk included) nothing is left
    behind.
    """
    out_path = Path(out_path)
    part = part_path(out_path)
    writer = GGUFWriter(part, arch="")   # an empty arch adds no key: every key is copied below, in order
    try:
        part.unlink(missing_ok=True)   # a stale temporary, or a link that opening would write through
        if "general.alignment" in kv:
            writer.data_alignment = int(kv["general.alignment"])
        for key, value in kv.items():
            _add_kv(writer, key, value, kv_types[key])
        for t in tensors:
            # Declared as raw bytes (numpy order: outermost dimension first); the writer turns the
            # byte shape back into the element shape of the ggml type.
            byte_shape = (*reversed(t.shape[1:]), t.nbytes // max(int(np.prod(t.shape[1:], dtype=np.int64)), 1))
            writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=t.type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t, arr in zip(tensors, data, strict=True):
            arr = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
            if arr.nbytes != t.nbytes:
                raise DiffuseError(f"{out_path}: tensor {t.name} has {arr.nbytes} bytes, expected {t.nbytes}")
            writer.write_tensor_data(arr)
        writer.close()
        replace_durably(part, out_path)
    except OSError as e:
        _close(writer)
        _remove(part)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiffuseError(f"{out_path}: the disk is full; nothing was written") from None
        raise DiffuseError(f"{out_path}: cannot write: {e.strerror or e}; nothing was written") from None
    except BaseException:
        _close(writer)
        _remove(part)
        raise


def part_path(out_path: Path) -> Path:
    """The temporary that write() fills before renaming it to out_path."""
    return out_path.with_name(out_path.name + ".part")


def refuse_overwrite(out_path: str | os.PathLike, inputs: Iterable[str | os.PathLike]) -> None:
    """Raise DiffuseError when writing out_path would overwrite or delete one of `inputs`.

    write() truncates OUT.part and renames it over OUT, so neither may be an input under any
    spelling (a symlink, a hard link, ./x or an absolute path): compared by device and inode.
    """
    out_path = Path(out_path)
    ids = {}
    for p in inputs:
        try:
            st = os.stat(p)
        except OSError:
            continue   # a missing input is the reader's error to report
        ids[st.st_dev, st.st_ino] = p
    for target in (out_path, part_path(out_path)):
        try:
            st = os.stat(target)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in ids:
            raise DiffuseError(f"{out_path}: the output would overwrite the input "
                               f"{ids[st.st_dev, st.st_ino]} (as {target}); choose another output name")


def replace_durably(src: Path, dst: Path) -> None:
    """os.replace(src, dst) that survives a power cut: the data reaches the disk before the rename
    does, and the rename itself is flushed with its directory where the OS allows that."""
    with open(src, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(src, dst)
    try:
        fd = os.open(Path(dst).parent, os.O_RDONLY)
    except OSError:
        return   # Windows cannot open a directory
    try:
        os.fsync(fd)
    except OSError:
        pass     # some file systems refuse to sync a directory; the rename is done all the same
    finally:
        os.close(fd)


def _add_kv(writer: GGUFWriter, key: str, value, type_name: str) -> None:
    if type_name.startswith("array["):
        sub = _VALUE_TYPES.get(type_name[6:-1])
        # Nested arrays (no model key uses them) cannot be copied; GGUF arrays cannot be empty here.
        if sub is None or value is None or len(value) == 0:
            return
        values = value.tolist() if isinstance(value, np.ndarray) else list(value)
        writer.add_key_value(key, values, GGUFValueType.ARRAY, sub_type=sub)
    else:
        writer.add_key_value(key, value, _VALUE_TYPES[type_name])


def _close(writer: GGUFWriter) -> None:
    """Close after a failure: flushing what is buffered fails again on a full disk, and must not
    replace the first error (that was a chained traceback)."""
    try:
        writer.close()
    except OSError:
        for f in writer.fout or []:
            try:
                f.close()
            except OSError:
                pass


def _remove(path: Path) -> None:
    """Best-effort cleanup: must not hide the error that led here."""
    try:
        path.unlink()
    except OSError:
        pass
