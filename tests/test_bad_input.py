"""Bad files and bad calls: every one is a DiffuseError naming the file and the problem, never a crash."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.info import describe
from diffuse.quantize import quantize_file
from diffuse.tokenizer import Tokenizer

_KV_TYPE = {str: "str", bool: "bool", int: "i32", float: "f32"}


def rewrite(src: Path, dst: Path, kv: dict | None = None, drop=(), types: dict | None = None,
            tensors: dict | None = None) -> Path:
    """A copy of a GGUF file with metadata set (kv; types default from the Python type), keys
    dropped, and tensors replaced: tensors[name] = (ggml type, shape in ggml order, array) or None
    to remove it."""
    info = gguf_file.read(src)
    kv_out = {k: v for k, v in info.kv.items() if k not in drop}
    kv_types = dict(info.kv_types)
    for k, v in (kv or {}).items():
        kv_out[k] = v
        kv_types[k] = (types or {}).get(k) or _KV_TYPE[type(v)]
    tensors = tensors or {}
    out, data = [], []
    for t in info.tensors:
        if t.name not in tensors:
            out.append(gguf_file.OutTensor(t.name, t.type, t.shape))
            data.append(t.raw())
        elif tensors[t.name] is not None:
            ttype, shape, array = tensors[t.name]
            out.append(gguf_file.OutTensor(t.name, ttype, shape))
            data.append(array)
    gguf_file.write(dst, kv_out, kv_types, out, data)
    return dst


def assert_refused(path: Path, match: str) -> None:
    """Loading fails with a DiffuseError naming the file and matching `match`; `info` still
    describes the file or refuses it the same way; quantize refuses it."""
    with pytest.raises(DiffuseError, match=match) as e:
        diffuse.load(path, threads=1)
    assert path.name in str(e.value)
    try:
        d = describe(path)
        assert d["hparams"] is None and path.name in d["load_error"]
    except DiffuseError as err:
        assert path.name in str(err)
    with pytest.raises(DiffuseError):
        quantize_file(path, path.with_suffix(".q.gguf"), "Q8_0")
    assert not path.with_suffix(".q.gguf").exists()


@pytest.fixture(scope="module")
def llada(tiny_gguf) -> Path:
    return tiny_gguf("llada", "f32")


@pytest.fixture(scope="module")
def dream(tiny_gguf) -> Path:
    return tiny_gguf("dream", "q8_0")


# ---- damaged bytes ----

def test_truncated_files(llada, tmp_path):
    data = llada.read_bytes()
    start = gguf_file.read(llada).data_offset
    cuts = {"empty": 0, "tiny": 10, "header": 20, "kv": 4000, "kv_end": start // 2,
            "tensor_infos": start - 50, "data_start": start, "data": start + 1000, "last_byte": len(data) - 1}
    for what, cut in cuts.items():
        path = tmp_path / f"cut_{what}.gguf"
        path.write_bytes(data[:cut])
        assert_refused(path, "too small|not a valid GGUF|past the end")


def test_bad_magic_and_version(llada, tmp_path):
    data = bytearray(llada.read_bytes())
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGUX" + data[4:])
    assert_refused(bad, "not a valid GGUF")
    bad = tmp_path / "version.gguf"
    bad.write_bytes(data[:4] + struct.pack("<I", 99) + data[8:])
    assert_refused(bad, "not a valid GGUF")


@pytest.mark.parametrize("offset,what", [(8, "tensors"), (16, "kvs")])
def test_absurd_header_counts(llada, tmp_path, offset, what):
    data = bytearray(llada.read_bytes())
    for count in (2**63 - 1, 2**40, 10**6):
        data[offset:offset + 8] = struct.pack("<Q", count)
        bad = tmp_path / f"count_{what}.gguf"
        bad.write_bytes(bytes(data))
        assert_refused(bad, "not a valid GGUF")


def test_huge_string_length(llada, tmp_path):
    """The first key's length field (right after the 24-byte header) claims 2^62 bytes."""
    data = bytearray(llada.read_bytes())
    data[24:32] = struct.pack("<Q", 2**62)
    bad = tmp_path / "strlen.gguf"
    bad.write_bytes(bytes(data))
    assert_refused(bad, "not a valid GGUF")


# ---- wrong metadata ----

def test_unknown_architecture(llada, tmp_path):
    assert_refused(rewrite(llada, tmp_path / "llama.gguf", {"general.architecture": "llama"}),
                   "unsupported architecture 'llama'")
    assert_refused(rewrite(llada, tmp_path / "none.gguf", drop=["general.architecture"]), "no general.architecture")
    assert_refused(rewrite(llada, tmp_path / "dcpp.gguf", {"general.architecture": "diffuse",
                                                          "diffuse.model_type": "gpt"}), "unknown diffuse.model_type")


@pytest.mark.parametrize("key,value,match", [
    ("llada.block_count", 10**9, "block_count = 1000000000 is outside"),
    ("llada.block_count", 0, "block_count = 0 is outside"),
    ("llada.feed_forward_length", -512, "feed_forward_length = -512 is outside"),
    ("llada.embedding_length", -1, "embedding_length = -1 is outside"),
    ("llada.context_length", -4096, "context_length = -4096 is outside"),
    ("llada.attention.head_count", 3, "not a multiple of the head count"),
    ("llada.attention.head_count", 0, "head_count = 0 is outside"),
    ("llada.attention.head_count_kv", 3, "not a multiple of the KV head count"),
    ("llada.rope.freq_base", -1.0, "freq_base must be a positive number"),
    ("llada.rope.freq_base", float("nan"), "freq_base must be a positive number"),
    ("llada.attention.layer_norm_rms_epsilon", 5.0, "must be in \\(0, 1\\)"),
    ("tokenizer.ggml.mask_token_id", 10**6, "mask token id 1000000 is outside the vocabulary"),
    ("tokenizer.ggml.mask_token_id", -3, "mask_token_id = -3 is outside"),
])
def test_absurd_hyper_parameters(llada, tmp_path, key, value, match):
    assert_refused(rewrite(llada, tmp_path / "hp.gguf", {key: value}), match)


@pytest.mark.parametrize("key,value,match", [
    ("llada.block_count", "2", "block_count should be an integer but has type str"),
    ("llada.attention.head_count", 4.0, "head_count should be an integer but has type f32"),
    ("general.architecture", 7, "general.architecture should be a string"),
    ("tokenizer.ggml.mask_token_id", "402", "mask_token_id should be an integer"),
    ("diffusion.shift_logits", "no", "shift_logits should be an integer"),
])
def test_wrong_typed_keys(llada, tmp_path, key, value, match):
    assert_refused(rewrite(llada, tmp_path / "typed.gguf", {key: value}), match)


# ---- wrong tensors ----

def test_missing_tensor(llada, dream, tmp_path):
    assert_refused(rewrite(llada, tmp_path / "m1.gguf", tensors={"blk.1.ffn_up.weight": None}),
                   "missing tensor blk.1.ffn_up.weight")
    assert_refused(rewrite(dream, tmp_path / "m2.gguf", tensors={"blk.0.attn_k.bias": None}),
                   "missing tensor blk.0.attn_k.bias")
    assert_refused(rewrite(llada, tmp_path / "m3.gguf", tensors={"token_embd.weight": None}),
                   "missing tensor token_embd.weight")


def test_misshaped_tensors(llada, tmp_path):
    f32 = 0
    cases = {
        "blk.0.attn_q.weight": ((256, 128), "blk.0.attn_q.weight has shape \\[256, 128\\], expected \\[256, 256\\]"),
        "output_norm.weight": ((128,), "output_norm.weight has shape"),
        "blk.1.ffn_down.weight": ((512, 256, 2), "ffn_down.weight has too many dimensions"),
        "output.weight": ((256, 447), "output.weight has shape"),
    }
    for name, (shape, match) in cases.items():
        array = np.zeros(shape[::-1], np.float32)
        assert_refused(rewrite(llada, tmp_path / "shape.gguf", tensors={name: (f32, shape, array)}), match)


def test_unsupported_tensor_type(llada, tmp_path):
    i32 = 26
    path = rewrite(llada, tmp_path / "i32.gguf",
                   tensors={"blk.0.attn_k.weight": (i32, (256, 256), np.zeros((256, 256), np.int32))})
    assert_refused(path, "attn_k.weight has unsupported type i32")


def test_nan_weights(llada, dream, tmp_path):
    """The file loads (nothing in its metadata is wrong); the forward pass checks its logits."""
    for src, name in [(llada, "output_norm.weight"), (llada, "blk.1.ffn_gate.weight"), (dream, "blk.2.attn_v.bias")]:
        t = gguf_file.read(src).tensor(name)
        array = np.full(t.shape[::-1], np.nan, np.float32)
        path = rewrite(src, tmp_path / f"nan_{src.stem}.gguf", tensors={name: (0, t.shape, array)})
        m = diffuse.load(path, threads=1)
        with pytest.raises(DiffuseError, match=f"{path.name}.*NaN/Inf logits"):
            m.forward([1, 2, 3, m.mask_token_id])


# ---- bad calls ----

def test_bad_token_lists(llada):
    m = diffuse.load(llada, threads=1)
    cases = {
        "empty": ([], "non-empty"),
        "too big": ([1, m.n_vocab], f"token id {m.n_vocab} at index 1 is outside the vocabulary"),
        "negative": ([-1], "token id -1 at index 0 is outside"),
        "floats": (np.array([1.0, 2.0]), "must be integers"),
        "2-D": ([[1, 2]], "1-D"),
    }
    for what, (ids, match) in cases.items():
        with pytest.raises(DiffuseError, match=match):
            m.forward(ids)
    assert m.forward([1, 2]).shape == (2, m.n_vocab)   # the model still works afterwards


def test_ids_beyond_int32(llada):
    m = diffuse.load(llada, threads=1)
    with pytest.raises(DiffuseError, match="outside"):
        m.forward(np.array([2**32 + 5], dtype=np.int64))


def test_bad_tokenizer_data(llada, tmp_path):
    broken_json = rewrite(llada, tmp_path / "json.gguf", {"tokenizer.huggingface.json": "{not json"})
    with pytest.raises(DiffuseError, match="json.gguf: the embedded tokenizer.json is invalid"):
        diffuse.load(broken_json, threads=1).tokenizer
    arrays = rewrite(llada, tmp_path / "merges.gguf", {"tokenizer.ggml.merges": ["Ġ zzz_not_a_token"]},
                     types={"tokenizer.ggml.merges": "array[str]"}, drop=["tokenizer.huggingface.json"])
    with pytest.raises(DiffuseError, match="merges.gguf: inconsistent tokenizer.ggml vocabulary/merges"):
        Tokenizer.for_model(arrays)
    ints = rewrite(llada, tmp_path / "ints.gguf", {"tokenizer.ggml.tokens": [1, 2, 3]},
                   types={"tokenizer.ggml.tokens": "array[i32]"}, drop=["tokenizer.huggingface.json"])
    with pytest.raises(DiffuseError, match="ints.gguf: malformed tokenizer.ggml"):
        Tokenizer.for_model(ints)
    spm = rewrite(llada, tmp_path / "spm.gguf", {"tokenizer.ggml.model": "llama"}, drop=["tokenizer.huggingface.json"])
    with pytest.raises(DiffuseError, match="spm.gguf: llama.cpp tokenizer model 'llama' is not supported"):
        Tokenizer.for_model(spm)
