"""Hostile Hugging Face folders: every bad config.json value, safetensors header and index gives one
DiffuseError naming the file and the problem, before any tensor is converted (no OverflowError,
struct.error, TypeError or silent truncation).

Hostile inputs per class: config.json values 128, config.json files 9, tokenizer_config.json 6,
safetensors headers 28, index files 11 (182 in all).
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from diffuse import DiffuseError
from diffuse.convert import convert_hf

TIMEOUT_S = 30
BIG = 65 << 20   # past the 64 MB cap on JSON files


@pytest.fixture
def llada(tiny_hf_llada, tmp_path) -> Path:
    """A private copy of the tiny LLaDA folder (bf16 weights in 2 shards, tokenizer.json)."""
    return Path(shutil.copytree(tiny_hf_llada, tmp_path / "hf"))


@pytest.fixture
def dream(tiny_hf_dream, tmp_path) -> Path:
    """A private copy of the tiny Dream folder (added tokens in tokenizer_config.json)."""
    return Path(shutil.copytree(tiny_hf_dream, tmp_path / "hf"))


def refused(folder: Path, match: str) -> str:
    """Conversion fails with a DiffuseError matching `match` and leaves no output behind."""
    out = folder.parent / "out.gguf"
    with pytest.raises(DiffuseError, match=match) as e:
        convert_hf(folder, out, "f32")
    assert list(folder.parent.glob("out.gguf*")) == []
    return str(e.value)


# ---- config.json values ----

def set_raw(path: Path, key: str, raw: str) -> None:
    """Sets config[key] to a raw JSON text: Infinity, NaN and 1e400 are not Python values json writes."""
    config = json.loads(path.read_text())
    config[key] = "@VALUE@"
    path.write_text(json.dumps(config).replace('"@VALUE@"', raw))


NOT_COUNTS = ["Infinity", "-Infinity", "NaN", "1e400", "-1", "0", "1.5", "true", "false", "18446744073709551616",
              "2147483648", '"8"', "[]", "{}"]
COUNT_KEYS = ["d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "max_sequence_length", "vocab_size"]
NOT_IDS = ["Infinity", "NaN", "-1", "126335.5", "true", "1e400", "18446744073709551616", '"126336"']
NOT_POSITIVE_REALS = ["Infinity", "-Infinity", "NaN", "1e400", "-1", "0", "1e39", "true", '"1e4"', "[]"]
NOT_EPS = ["Infinity", "NaN", "0", "-1e-5", "2", "false", '"1e-5"']
NOT_BOOLS = ['"yes"', "1", "0.0", "[]"]
CONFIG_VALUES = ([(key, raw) for key in COUNT_KEYS for raw in NOT_COUNTS]
                 + [("mask_token_id", raw) for raw in NOT_IDS]
                 + [("rope_theta", raw) for raw in NOT_POSITIVE_REALS]
                 + [("rms_norm_eps", raw) for raw in NOT_EPS]
                 + [("weight_tying", raw) for raw in NOT_BOOLS])


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("key, raw", CONFIG_VALUES)
def test_config_value(llada, key, raw):
    set_raw(llada / "config.json", key, raw)
    message = refused(llada, rf"config\.json: {key} = .* is not (an integer from|a number above|true or false)")
    assert "\n" not in message and len(message) < 400


def test_fractional_mask_id_is_not_truncated(llada):
    set_raw(llada / "config.json", "mask_token_id", "126335.5")
    refused(llada, r"mask_token_id = 126335\.5 is not an integer from 0 to 2147483647")


# ---- config.json files ----

def deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("content, message", [
    ("[]", "config.json: not a JSON object"),
    ('"LLaDAModelLM"', "config.json: not a JSON object"),
    ("{not json", r"config\.json: not valid JSON"),
    (b"{\"d_model\": \"\xff\xfe\"}", r"config\.json: not UTF-8"),
    (deep(), r"config\.json: not valid JSON"),
    ('{"architectures": [["LLaDAModelLM"]]}', "unsupported architecture"),
    ('{"architectures": "LLaDAModelLM"}', "unsupported architecture"),
    (BIG, r"config\.json: larger than 64 MB"),
])
def test_config_file(llada, content, message):
    path = llada / "config.json"
    if isinstance(content, int):   # a sparse file: no 65 MB written
        with open(path, "r+b") as f:
            f.truncate(content)
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    refused(llada, message)


def test_long_fixed_value_is_cut(llada):
    set_raw(llada / "config.json", "block_type", json.dumps("\x1b[2J" + "x" * 1_000_000))
    message = refused(llada, "block_type = .* is a llada variant")
    assert len(message) < 400 and "\x1b" not in message


# ---- tokenizer_config.json ----

def write_tok_config(folder: Path, change) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def first_added(config: dict) -> dict:
    return next(iter(config["added_tokens_decoder"].values()))


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("change, message", [
    (lambda c: c["added_tokens_decoder"].update({"151643": "<|endoftext|>"}), "added token 151643 is"),
    (lambda c: c["added_tokens_decoder"].update({"7": {"content": 7}}), "added token 7 is"),
    (lambda c: first_added(c).update(special="yes"), "expected an object with a string content"),
    (lambda c: c.update(added_tokens_decoder=["x"]), "bad added_tokens_decoder"),
    (lambda c: c.update(added_tokens_decoder={"1e400": {}}), "bad added_tokens_decoder"),
])
def test_dream_tokenizer_config(dream, change, message):
    write_tok_config(dream, change)
    refused(dream, message)


@pytest.mark.timeout(TIMEOUT_S)
def test_tokenizer_config_not_an_object(llada):
    (llada / "tokenizer_config.json").write_text("[1, 2]")
    refused(llada, r"tokenizer_config\.json: not a JSON object")


# ---- safetensors headers ----

def first_shard(folder: Path) -> Path:
    return sorted(folder.glob("model-*.safetensors"))[0]


def read_shard(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_shard(path: Path, header: bytes, body: bytes, length: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + body)


def edit_header(change):
    """A shard edit: change(header) -> the new header (an object, or raw bytes)."""
    def apply(path: Path) -> None:
        header, body = read_shard(path)
        new = change(header)
        write_shard(path, new if isinstance(new, bytes) else json.dumps(new).encode(), body)
    return apply


def raw_header(text: bytes):
    return lambda path: write_shard(path, text, read_shard(path)[1])


def header_length(length: int):
    return lambda path: write_shard(path, b"{}", b"", length)


def matrix(header: dict) -> str:
    return next(name for name, e in header.items() if name != "__metadata__" and len(e["shape"]) == 2)


def set_field(field: str, value):
    def change(header):
        header[matrix(header)][field] = value
        return header
    return edit_header(change)


def set_entry(value):
    def change(header):
        header[matrix(header)] = value
        return header
    return edit_header(change)


def shifted_past_end(header):
    """A tensor whose bytes lie after the end of the file."""
    e = header[matrix(header)]
    e["data_offsets"] = [o + (1 << 40) for o in e["data_offsets"]]
    return header


def overlapping(header):
    """Two same-sized tensors on the same bytes."""
    alike = {}
    for name, e in header.items():
        if name != "__metadata__":
            alike.setdefault((e["dtype"], tuple(e["shape"])), []).append(name)
    a, b = next(names for names in alike.values() if len(names) > 1)[:2]
    header[b]["data_offsets"] = header[a]["data_offsets"]
    return header


def duplicate_name(header):
    """Two entries under one name (json.loads would keep the last)."""
    name = matrix(header)
    text = json.dumps(header)
    entry = json.dumps({name: header[name]})[1:-1]
    return (text[:-1] + ", " + entry + "}").encode()


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("edit, message", [
    (header_length(2**63), "not a safetensors file"),
    (header_length(2**64 - 1), "not a safetensors file"),
    (header_length(1 << 30), "not a safetensors file"),
    (raw_header(b"{not json"), "corrupt safetensors header"),
    (raw_header(b"[1, 2]"), r"corrupt safetensors header \(not an object\)"),
    (raw_header(b'{"a": "\xff\xfe"}'), "corrupt safetensors header"),
    (raw_header(deep(50_000).encode()), "corrupt safetensors header"),
    (edit_header(duplicate_name), "corrupt safetensors header .*appears twice"),
    (set_entry(5), "corrupt header entry"),
    (set_entry({"dtype": "F32", "shape": [1]}), "corrupt header entry"),
    (set_field("dtype", "F64"), "has dtype 'F64'"),
    (set_field("dtype", "Q4_K"), "has dtype 'Q4_K'"),
    (set_field("dtype", ["BF16"]), r"has dtype \['BF16'\]"),
    (set_field("shape", "abc"), "has shape 'abc'"),
    (set_field("shape", 448), "has shape 448"),
    (set_field("shape", [448, -256]), r"has shape \[448, -256\]"),
    (set_field("shape", [448.0, 256]), "has shape"),
    (set_field("shape", [True, 256]), "has shape"),
    (set_field("shape", [2**40, 2**40, 2**40]), "bytes for shape"),
    (set_field("shape", [2**64, 2**64]), "bytes for shape"),
    (set_field("data_offsets", [0.0, 4.0]), "has data_offsets"),
    (set_field("data_offsets", [-4, 0]), "has data_offsets"),
    (set_field("data_offsets", [8, 4]), "has data_offsets"),
    (set_field("data_offsets", "ab"), "has data_offsets"),
    (set_field("data_offsets", [0, 4, 8]), "has data_offsets"),
    (set_field("data_offsets", [0, 4]), "has 4 bytes for shape"),
    (edit_header(shifted_past_end), "truncated: tensor"),
    (edit_header(overlapping), "overlap"),
])
def test_safetensors_header(llada, edit, message):
    edit(first_shard(llada))
    assert first_shard(llada).name in refused(llada, message)


# ---- model.safetensors.index.json ----

def set_index(change):
    def apply(folder: Path) -> None:
        path = folder / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        new = change(index)
        path.write_text(new if isinstance(new, str) else json.dumps(new))
    return apply


def point_first(shard):
    def change(index):
        name = next(iter(index["weight_map"]))
        index["weight_map"][name] = shard
        return index
    return set_index(change)


def stored_twice(folder: Path) -> None:
    """The second shard also holds (under a renamed entry) a tensor the index places in the first."""
    shards = sorted(folder.glob("model-*.safetensors"))
    theirs = set(read_shard(shards[0])[0]) - {"__metadata__"}

    def change(header):
        mine = matrix(header)
        header[sorted(theirs)[0]] = header.pop(mine)
        return header
    edit_header(change)(shards[1])


def big_index(folder: Path) -> None:
    with open(folder / "model.safetensors.index.json", "r+b") as f:
        f.truncate(BIG)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("edit, message", [
    (point_first("../../etc/passwd"), r"shard '\.\./\.\./etc/passwd' .* is not a file name inside the folder"),
    (point_first("/etc/passwd"), "not a file name inside the folder"),
    (point_first(".."), "not a file name inside the folder"),
    (point_first(""), "not a file name inside the folder"),
    (point_first(5), "shard 5 .* not a file name inside the folder"),
    (point_first("model-00009-of-00009.safetensors"), "shard model-00009-of-00009.safetensors is missing"),
    (set_index(lambda index: {"weight_map": list(index["weight_map"])}), "weight_map is missing or not an object"),
    (set_index(lambda index: "[1]"), "weight_map is missing or not an object"),
    (set_index(lambda index: "{oops"), r"index\.json: not valid JSON"),
    (big_index, r"index\.json: larger than 64 MB"),
    (stored_twice, "is also in model-00001-of-00002.safetensors"),
])
def test_index(llada, edit, message):
    edit(llada)
    refused(llada, message)
