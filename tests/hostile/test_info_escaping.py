"""`diffuse info` on GGUF files with hostile strings: nothing it prints (text, --tensors, --json)
holds a raw control character, escape sequence or bidi override, and long strings are cut.

Hostile inputs: general.name 14, other strings (architecture, pre-tokenizer, token text, chat
template, tensor name, path) 6 (20 in all), each shown in 3 output modes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffuse import gguf_file
from diffuse.cli import main
from diffuse.info import escaped

TIMEOUT_S = 60
MODES = [[], ["--tensors"], ["--json"]]

NAMES = {
    "osc_title": "\x1b]0;pwned\x07model",
    "clear_screen": "\x1b[2J\x1b[Hmodel",
    "csi_color": "\x1b[31mred\x1b[0m",
    "c1_csi": "\x9b31mmodel",
    "c1_osc": "\x9d0;pwned\x9c",
    "del": "mo\x7fdel",
    "bidi_override": "model\u202egguf.exe",
    "bidi_isolate": "\u2067model\u2069",
    "carriage_return": "model\rfile          /etc/passwd",
    "newline": "model\nhyper-parameters faked",
    "nul": "mo\x00del",
    "line_separator": "mo\u2028del",
    "tag_chars": "model\U000e0041\U000e0042",
    "long": "A" * 1_000_000,
}


def hostile_copy(src: Path, dst: Path, kv: dict | None = None, drop=(), rename: dict | None = None) -> Path:
    """A copy of a GGUF file with string keys set (kv), keys dropped, and tensors renamed."""
    info = gguf_file.read(src)
    kv_out = {k: v for k, v in info.kv.items() if k not in drop}
    types = dict(info.kv_types)
    for k, v in (kv or {}).items():
        kv_out[k] = v
        types[k] = info.kv_types.get(k, "str")
    rename = rename or {}
    tensors = [gguf_file.OutTensor(rename.get(t.name, t.name), t.type, t.shape) for t in info.tensors]
    gguf_file.write(dst, kv_out, types, tensors, (t.raw() for t in info.tensors))
    return dst


def llama_cpp_dialect(src: Path, dst: Path, kv: dict) -> Path:
    """Without the embedded tokenizer.json, info reads the token texts from tokenizer.ggml.tokens."""
    return hostile_copy(src, dst, kv, drop=["diffuse.format_version", "tokenizer.huggingface.json"])


def with_token(text: str):
    def make(src: Path, dst: Path) -> Path:
        info = gguf_file.read(src)
        tokens = list(info.kv["tokenizer.ggml.tokens"])
        tokens[info.kv["tokenizer.ggml.mask_token_id"]] = text
        return llama_cpp_dialect(src, dst, {"tokenizer.ggml.tokens": tokens})
    return make


def assert_harmless(text: str) -> None:
    bad = sorted({c for c in text if not c.isprintable() and c != "\n"})
    assert not bad, f"raw control characters printed: {bad!r}"
    assert max(map(len, text.splitlines()), default=0) < 8000, "a long string was not cut"


def run_info(path: Path, capsys) -> dict[str, str]:
    """Every output mode's stdout + stderr; --json must still be valid JSON."""
    outputs = {}
    for mode in MODES:
        rc = main(["info", str(path), *mode])
        captured = capsys.readouterr()
        if mode == ["--json"] and rc == 0:
            json.loads(captured.out)
        outputs[" ".join(mode) or "text"] = captured.out + captured.err
    return outputs


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
def test_hostile_name(tiny_gguf, tmp_path, capsys, name):
    path = hostile_copy(tiny_gguf("llada", "f32"), tmp_path / "m.gguf", {"general.name": name})
    outputs = run_info(path, capsys)
    for text in outputs.values():
        assert_harmless(text)
    # The file reader stops a string at NUL, as C does.
    assert f"name          {escaped(name.split(chr(0))[0])}\n" in outputs["text"]


ESC = "\x1b]0;pwned\x07\x1b[2J\u202e\x9b"
OTHERS = {
    "architecture": lambda src, dst: hostile_copy(src, dst, {"general.architecture": "llada" + ESC}),
    "pre_tokenizer": lambda src, dst: llama_cpp_dialect(src, dst, {"tokenizer.ggml.pre": "qwen2" + ESC}),
    "token_text": with_token("<mask>" + ESC),
    "chat_template": lambda src, dst: hostile_copy(src, dst, {"tokenizer.chat_template": ESC * 1000}),
    "tensor_name": lambda src, dst: hostile_copy(src, dst, rename={"blk.0.attn_q.weight": "blk.0" + ESC}),
    "file_name": lambda src, dst: hostile_copy(src, dst.with_name("m" + ESC + ".gguf")),
}


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("make", OTHERS.values(), ids=OTHERS.keys())
def test_hostile_strings(tiny_gguf, tmp_path, capsys, make):
    path = make(tiny_gguf("dream", "f32"), tmp_path / "m.gguf")
    for text in run_info(path, capsys).values():
        assert_harmless(text)


@pytest.mark.parametrize("name", ["\x1b]0;pwned\x07.gguf", "evil\x1b[2J\u202e.gguf"])
def test_error_messages_are_escaped(tmp_path, capsys, name):
    """Every CLI error quotes names from outside (here a missing file's): none reaches the terminal raw."""
    assert main(["info", str(tmp_path / name)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("diffuse: error:") and "\x1b" not in err and "\u202e" not in err
    assert "\\x1b" in err
