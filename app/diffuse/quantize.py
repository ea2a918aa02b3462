"""GGUF -> GGUF in another weight type, with llama.cpp's per-tensor mixtures (Q4_K_M, Q5_K_M).

Every tensor is read through a memory map, dequantised to float32 chunk by chunk and quantised with
ggml (diffuse._core.quantize_rows, which releases the GIL, so chunks run on several threads). Only
one output tensor is held in memory at a time.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from diffuse import _core, gguf_file
from diffuse._core import DiffuseError
from diffuse.model import load
from diffuse.tokenizer import template_beside


@dataclass(frozen=True)
class QType:
    ftype: int      # llama_ftype, written to general.file_type
    default: T      # type of every matrix that no rule below changes
    k_mix: bool     # the _M mixtures: more bits for attn_v and ffn_down on selected layers


QTYPES = {
    "F16": QType(1, T.F16, False),
    "BF16": QType(32, T.BF16, False),
    "Q8_0": QType(7, T.Q8_0, False),
    "Q4_0": QType(2, T.Q4_0, False),
    "Q4_K_M": QType(15, T.Q4_K, True),
    "Q5_K_M": QType(17, T.Q5_K, True),
    "Q6_K": QType(18, T.Q6_K, False),
}

_FLOAT_TYPES = (T.F32, T.F16, T.BF16)

# Types to fall back to when a row length is not a multiple of the block size (llama.cpp's
# tensor_type_fallback): the 256-wide K-quants drop to a 32-wide type of similar size; a 32-wide
# type that does not fit either becomes F16.
_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}

_LAYER = re.compile(r"^blk\.(\d+)\.")
LORA_SUFFIXES = (".lora_a", ".lora_b")   # an adapter's tensors, llama.cpp's names (diffuse.convert.draft_lora)


def _block(t: T) -> int:
    return _core.type_info(int(t))["block_size"]


def _use_more_bits(layer: int, n_layer: int) -> bool:
    # llama.cpp's use_more_bits: the first and last eighth of the layers, and every third in between.
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def tensor_type(name: str, shape: tuple, qtype: str, n_layer: int, has_output: bool, n_expert: int = 0) -> T:
    """The output type of one tensor (shape in ggml order), following llama.cpp's
    llama_tensor_get_type for the roles our models have (src/llama-quant.cpp):

    - 1-D tensors (norms, Dream's q/k/v biases), norm weights and the MoE router (ffn_gate_inp,
      which llama.cpp never quantises: a rounded router flips expert choices) stay F32;
    - F16/BF16: every matrix in that type;
    - output.weight (or token_embd.weight when tied to the output) goes to Q6_K, except Q8_0 stays
      Q8_0, and a row length that is no multiple of the default type's block gives Q8_0;
    - Q4_K_M / Q5_K_M: attn_v and ffn_down (the 3-D ffn_down_exps of MoE too) go to Q6_K on the
      layers use_more_bits selects; 3-D expert tensors are quantised row by row like any matrix;
    - the fused attn_qkv (LLaDA2) goes one step up on every layer: Q4_K_M -> Q5_K, Q5_K_M -> Q6_K;
    - models of exactly 8 experts (llama.cpp's rule for Mixtral-like MoE): attn_v and attn_k go to
      Q8_0, and with Q4_K_M attn_output to Q5_K (LLaDA-MoE has 64, LLaDA2 256: no change);
    - everything else takes the default type; then the block-size fallback applies.
    """
    if len(shape) < 2 or not name.endswith("weight") or name.endswith(("_norm.weight", "ffn_gate_inp.weight")):
        return T.F32
    q = QTYPES[qtype]
    if q.default in _FLOAT_TYPES:
        return q.default
    ncols = shape[0]
    t = q.default
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        if ncols % _block(q.default) != 0:
            t = T.Q8_0
        elif q.default != T.Q8_0:
            t = T.Q6_K
    elif q.k_mix and (m := _LAYER.match(name)) and (".attn_v." in name or ".ffn_down" in name):
        if _use_more_bits(int(m.group(1)), n_layer):
            t = T.Q6_K
    elif q.k_mix and ".attn_qkv." in name:
        t = T.Q5_K if qtype == "Q4_K_M" else T.Q6_K
    if n_expert == 8 and (".attn_v." in name or ".attn_k." in name):
        t = T.Q8_0
    elif n_expert == 8 and qtype == "Q4_K_M" and ".attn_output." in name:
        t = T.Q5_K
    if ncols % _block(t) != 0:
        t = _FALLBACK.get(t, t)
        if ncols % _block(t) != 0:
            t = T.F16
    return t


def plan(info: gguf_file.GGUFInfo, qtype: str) -> list[gguf_file.OutTensor]:
    """Output name, type and shape of every tensor of `info` for `qtype`."""
    layers = [int(m.group(1)) for t in info.tensors if (m := _LAYER.match(t.name))]
    n_layer = max(layers) + 1 if layers else 0
    has_output = info.tensor("output.weight") is not None
    n_expert = info.kv.get(f"{info.architecture}.expert_count", 0)
    # The draft LoRA (blk.N.attn_output.weight.lora_a/_b) stays as converted: a few MB, F16 at most,
    # which self_spec's draft passes read as they are (docs/self_speculation.md)
    return [gguf_file.OutTensor(t.name, t.type if t.name.endswith(LORA_SUFFIXES) else
                                int(tensor_type(t.name, t.shape, qtype, n_layer, has_output, n_expert)), t.shape)
            for t in info.tensors]


def quantize_file(in_path: str | os.PathLike, out_path: str | os.PathLike, qtype: str,
                  progress: Callable[[int, int, str], None] | None = None,
                  cancel: Callable[[], bool] | None = None, threads: int | None = None,
                  warn: Callable[[str], None] | None = None) -> Path | None:
    """Write `in_path` (any GGUF model, any weight types) to `out_path` in `qtype`
    (F16, BF16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K).

    progress(done_bytes, total_bytes, tensor_name) counts the output file's tensor bytes as they are
    made, chunk by chunk (each tensor is written once made); warn(text) gets
    what the user should know about the result (a re-quantised input, a tokenizer carried along).
    Returns the output path, or None when cancel() returned True (nothing is left behind). The file
    appears under its name only when complete.
    """
    qtype = qtype.upper()
    if qtype not in QTYPES:
        raise DiffuseError(f"unknown quantisation type '{qtype}'; choose one of {', '.join(QTYPES)}")
    if threads is not None and threads < 1:
        raise DiffuseError(f"threads must be at least 1 (got {threads})")
    warn = warn or (lambda text: None)
    in_path, out_path = Path(in_path), Path(out_path)
    gguf_file.refuse_overwrite(out_path, [in_path])
    load(in_path, threads=1)   # the engine's own checks (family, shapes, types, truncation); cheap: a mmap
    info = gguf_file.read(in_path)

    out_tensors = plan(info, qtype)
    default = QTYPES[qtype].default
    if default not in _FLOAT_TYPES and all(t.type != default for t in out_tensors):
        # A file labelled Q6_K that holds only the fallback types would misinform every reader.
        held = sorted({T(t.type).name for t in out_tensors if len(t.shape) > 1})
        fits = [n for n, q in QTYPES.items() if q.default in _FLOAT_TYPES or _block(q.default) < _block(default)]
        raise DiffuseError(f"{qtype}: no tensor of {in_path} can be stored as {default.name} (its rows are not a "
                           f"multiple of {_block(default)} values); the file would hold only {', '.join(held)}. "
                           f"Choose one of {', '.join(fits)}")
    requantised = sorted({T(s.type).name for s, d in zip(info.tensors, out_tensors)
                          if s.type not in _FLOAT_TYPES and d.type not in _FLOAT_TYPES and s.type != d.type})
    if requantised:
        warn(f"{in_path} is already quantised ({', '.join(requantised)}): those weights are dequantised and "
             f"quantised again, which loses more quality than quantising the F16/F32 original")
    kv, kv_types = dict(info.kv), dict(info.kv_types)
    _carry_tokenizer(in_path, kv, kv_types, warn)
    kv["general.file_type"], kv_types["general.file_type"] = QTYPES[qtype].ftype, "u32"
    if QTYPES[qtype].default not in _FLOAT_TYPES:
        kv["general.quantization_version"], kv_types["general.quantization_version"] = 2, "u32"

    total = sum(t.nbytes for t in out_tensors)   # output bytes: the percentage follows the file
    done = 0

    def report(n: int, name: str) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total, name)
        if cancel and cancel():
            raise _Cancelled

    pool = ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1)   # not generation: all logical CPUs
    try:
        data = (_convert(src, dst, pool, report) for src, dst in zip(info.tensors, out_tensors))
        gguf_file.write(out_path, kv, kv_types, out_tensors, data)
    except _Cancelled:
        return None
    finally:
        pool.shutdown(cancel_futures=True)   # after a cancel or an error, queued chunks never start
    return out_path


def _carry_tokenizer(in_path: Path, kv: dict, kv_types: dict, warn: Callable[[str], None]) -> None:
    """Embed the tokenizer.json that sits beside a file carrying none (diffuse-cpp), as our dialect
    stores it, so the output works wherever it is moved (Tokenizer.for_model reads the embedded one)."""
    beside = in_path.parent / "tokenizer.json"
    if isinstance(kv.get("tokenizer.huggingface.json"), str) or "tokenizer.ggml.tokens" in kv or not beside.is_file():
        return
    try:
        text = beside.read_text(encoding="utf-8")
        json.loads(text)
    except (OSError, ValueError) as e:
        raise DiffuseError(f"{beside}: not a valid tokenizer.json: {e}") from e
    kv["tokenizer.huggingface.json"], kv_types["tokenizer.huggingface.json"] = text, "str"
    template = template_beside(beside)
    if template and not isinstance(kv.get("tokenizer.chat_template"), str):
        kv["tokenizer.chat_template"], kv_types["tokenizer.chat_template"] = template, "str"
    warn(f"{in_path} carries no tokenizer: embedding {beside} in the output")


class _Cancelled(Exception):
    pass


# Rows per work item: about 4 MB of float32, so every thread has work and memory stays small.
_CHUNK_FLOATS = 1 << 20


def _convert(src: gguf_file.TensorInfo, dst: gguf_file.OutTensor, pool: ThreadPoolExecutor,
             report: Callable[[int, str], None]) -> np.ndarray:
    """One tensor in its output type: uint8 (rows, bytes per row); report(n, name) counts its
    output bytes as they are made."""
    raw = src.raw()                                   # uint8 (rows, bytes per row), memory-mapped
    if src.type == dst.type:
        report(dst.nbytes, src.name)
        return raw
    src_type = T(src.type)   # the engine accepted the file, so a type gguf-py decodes
    rows, cols = raw.shape[0], src.shape[0]
    out_row_bytes = dst.nbytes // rows
    out = np.empty((rows, out_row_bytes), dtype=np.uint8)
    step = max(1, _CHUNK_FLOATS // max(cols, 1))

    def work(r0: int) -> int:
        r1 = min(rows, r0 + step)
        f32 = dequantize(np.asarray(raw[r0:r1]), src_type).reshape(r1 - r0, cols).astype(np.float32, copy=False)
        out[r0:r1] = _core.quantize_rows(f32, int(dst.type))
        return r1 - r0

    # Results in order, so that progress and cancellation advance as chunks finish.
    for n in pool.map(work, range(0, rows, step)):
        report(n * out_row_bytes, src.name)
    return out
