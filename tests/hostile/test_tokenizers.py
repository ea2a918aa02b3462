"""Tokenizers from a model file are untrusted: loading one, encoding and decoding with it end
quickly with a result or a DiffuseError naming the file, never a pyo3 PanicException (a
BaseException that would leave the Studio's engine busy for good) or exponential memory.

Hostile inputs: exploding normalizers/decoders 6, backtracking regexes 7 (x2: in a split
pre-tokenizer and in a Replace normalizer), deep or long pipelines 3, invalid JSON 6, wrong types 9,
llama.cpp arrays 6, oversized vocabulary 2, oversized text 1 (47 in all), plus a panic injected
past the load checks; each hostile tokenizer that loads anyway is then fed 5 texts and 3 id lists.
"""
from __future__ import annotations

import json
import time

import pytest
from hostile_models import tiny_tokenizer_json, tokenizer_gguf
from tokenizers import Regex, pre_tokenizers

from diffuse import DiffuseError, tokenizer
from diffuse.tokenizer import MAX_TEXT_CHARS, Tokenizer

TIMEOUT_S = 60
BOUND_S = 10.0   # generous for a loaded two-core machine; the point is "not exponential"
TEXTS = ["hello world", "a" * 40 + "c " + "x" * 40 + "!", "aaaa" * 5000 + "b", "", "\u00e9\u0301 <|im_end|>"]
IDS = [[0, 1, 2], [1 << 31], list(range(40)) * 50]


def with_pipeline(**parts) -> str:
    """The tiny tokenizer.json with normalizer / pre_tokenizer / decoder replaced."""
    spec = json.loads(tiny_tokenizer_json())
    spec.update(parts)
    return json.dumps(spec)


def replace(pattern: dict, content: str) -> dict:
    return {"type": "Replace", "pattern": pattern, "content": content}


def split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


EXPLODING = {
    "doubling_chain": {"normalizer": {"type": "Sequence", "normalizers": [replace({"String": "a"}, "aa")] * 40}},
    "nested_doubling": {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Sequence", "normalizers": [replace({"String": "a"}, "aa")] * 5}] * 5}},
    "regex_every_char": {"normalizer": replace({"Regex": "."}, "x" * 1000)},
    "empty_match": {"normalizer": replace({"Regex": ""}, "y" * 100)},
    "long_prepend": {"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "z" * 64}] * 8}},
    "decoder_doubling": {"decoder": {"type": "Sequence", "decoders": [replace({"String": "a"}, "aaaa")] * 20}},
}
BACKTRACKING = [r"(a+)+b", r"(a|a)*b", r"(.*)*x", r"(\w+\s?)*$", r"(a|aa)+$", r"(?:a*)*b", r"(x+x+)+y"]
PIPELINES = {
    "deep_sequences": {"normalizer": json.loads('{"type": "Sequence", "normalizers": [' * 50 + '{"type": "NFC"}'
                                                + ']}' * 50)},
    "many_normalizers": {"normalizer": {"type": "Sequence", "normalizers": [{"type": "Lowercase"}] * 1000}},
    "many_pre_tokenizers": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(r"\s+")] * 1000}},
}
INVALID_JSON = {
    "not_json": "{not json",
    "truncated": tiny_tokenizer_json()[:-100],
    "array": "[]",
    "null": "null",
    "deeply_nested": "[" * 100000 + "]" * 100000,
    "empty": "",
}
WRONG_TYPES = {
    "model_int": {"model": 5},
    "vocab_list": {"model": {"type": "BPE", "vocab": [1, 2, 3], "merges": []}},
    "unknown_model": {"model": {"type": "Nope"}},
    "normalizer_string": {"normalizer": "NFC"},
    "replace_ints": {"normalizer": {"type": "Replace", "pattern": 5, "content": 7}},
    "bad_regex": {"pre_tokenizer": split("(")},
    "added_tokens_ints": {"added_tokens": [1, 2, 3]},
    "sequence_not_list": {"normalizer": {"type": "Sequence", "normalizers": {"type": "NFC"}}},
    "merges_unknown_tokens": {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["q", "r"]]}},
}


def check(tok: Tokenizer) -> None:
    """Every text and id list gives a result or a DiffuseError, quickly."""
    for text in TEXTS:
        start = time.monotonic()
        try:
            assert all(isinstance(i, int) for i in tok.encode(text))
        except DiffuseError as e:
            assert "hostile.gguf" in str(e)
        assert time.monotonic() - start < BOUND_S
    for ids in IDS:
        try:
            assert isinstance(tok.decode(ids), str)
        except DiffuseError:
            pass


def load_or_refuse(path) -> None:
    start = time.monotonic()
    try:
        tok = Tokenizer.for_model(path)
    except DiffuseError as e:
        assert "hostile.gguf" in str(e)
    else:
        check(tok)
    assert time.monotonic() - start < 4 * BOUND_S


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", EXPLODING)
def test_exploding_steps_are_refused_at_load(tmp_path, name):
    path = tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=with_pipeline(**EXPLODING[name]))
    with pytest.raises(DiffuseError, match=r"hostile\.gguf.*times longer"):
        Tokenizer.for_model(path)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("where", ["pre_tokenizer", "normalizer"])
@pytest.mark.parametrize("regex", BACKTRACKING)
def test_backtracking_regex_is_refused_at_load(tmp_path, regex, where):
    step = split(regex) if where == "pre_tokenizer" else replace({"Regex": regex}, "")
    path = tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=with_pipeline(**{where: step}))
    with pytest.raises(DiffuseError, match=r"hostile\.gguf.*exponential"):
        Tokenizer.for_model(path)


@pytest.mark.timeout(TIMEOUT_S)
def test_library_panic_is_a_diffuse_error(tmp_path):
    """What slips past the load checks still never escapes as a PanicException."""
    path = tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=tiny_tokenizer_json())
    tok = Tokenizer.for_model(path)
    tok._hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"(a+)+b"), behavior="isolated")
    with pytest.raises(DiffuseError, match=r"hostile\.gguf.*encoding failed: PanicException"):
        tok.encode("a" * 40 + "c")


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", PIPELINES)
def test_deep_or_long_pipelines_are_refused(tmp_path, name):
    path = tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=with_pipeline(**PIPELINES[name]))
    with pytest.raises(DiffuseError, match=r"hostile\.gguf.*steps or Sequences nested"):
        Tokenizer.for_model(path)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", INVALID_JSON)
def test_invalid_json(tmp_path, name):
    path = tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=INVALID_JSON[name])
    with pytest.raises(DiffuseError, match=r"hostile\.gguf: the embedded tokenizer.json is invalid"):
        Tokenizer.for_model(path)
    (tmp_path / "beside").mkdir()
    (tmp_path / "beside" / "tokenizer.json").write_text(INVALID_JSON[name], encoding="utf-8")
    with pytest.raises(DiffuseError, match=r"beside/tokenizer\.json: not a valid tokenizer.json"):
        Tokenizer.for_model(tokenizer_gguf(tmp_path / "beside" / "m.gguf"))


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", WRONG_TYPES)
def test_wrong_types(tmp_path, name):
    load_or_refuse(tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=with_pipeline(**WRONG_TYPES[name])))


ARRAYS = {   # llama.cpp's tokenizer.ggml.* arrays: (kv, kv_types)
    "tokens_ints": ({"tokenizer.ggml.tokens": [1, 2], "tokenizer.ggml.merges": ["1 2"]},
                    {"tokenizer.ggml.tokens": "array[i32]", "tokenizer.ggml.merges": "array[str]"}),
    "merges_ints": ({"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": [1]},
                    {"tokenizer.ggml.tokens": "array[str]", "tokenizer.ggml.merges": "array[i32]"}),
    "tokens_string": ({"tokenizer.ggml.tokens": "ab", "tokenizer.ggml.merges": ["a b"]},
                      {"tokenizer.ggml.tokens": "str", "tokenizer.ggml.merges": "array[str]"}),
    "types_mismatch": ({"tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"],
                        "tokenizer.ggml.token_type": [1]},
                       {"tokenizer.ggml.tokens": "array[str]", "tokenizer.ggml.merges": "array[str]",
                        "tokenizer.ggml.token_type": "array[i32]"}),
    "merge_unknown": ({"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": ["q r"]},
                      {"tokenizer.ggml.tokens": "array[str]", "tokenizer.ggml.merges": "array[str]"}),
    "bos_with_spaces": ({"tokenizer.ggml.tokens": ["a b $A", "a", "b", "ab"], "tokenizer.ggml.merges": ["a b"],
                         "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.add_bos_token": True},
                        {"tokenizer.ggml.tokens": "array[str]", "tokenizer.ggml.merges": "array[str]",
                         "tokenizer.ggml.bos_token_id": "u32", "tokenizer.ggml.add_bos_token": "bool"}),
}


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", ARRAYS)
def test_llama_cpp_arrays(tmp_path, name):
    kv, kv_types = ARRAYS[name]
    load_or_refuse(tokenizer_gguf(tmp_path / "hostile.gguf", kv={"tokenizer.ggml.model": "gpt2", **kv},
                                  kv_types={"tokenizer.ggml.model": "str", **kv_types}))


@pytest.mark.timeout(TIMEOUT_S)
def test_oversized_vocabulary(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer, "_MAX_VOCAB", 30)   # the real cap (4M entries) is too slow to build here
    path = tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=tiny_tokenizer_json())
    with pytest.raises(DiffuseError, match=r"hostile\.gguf.*entries in model.vocab"):
        Tokenizer.for_model(path)
    kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(31)],
          "tokenizer.ggml.merges": ["t0 t1"]}
    path = tokenizer_gguf(tmp_path / "arrays.gguf", kv=kv, kv_types={
        "tokenizer.ggml.model": "str", "tokenizer.ggml.tokens": "array[str]", "tokenizer.ggml.merges": "array[str]"})
    with pytest.raises(DiffuseError, match=r"arrays\.gguf: 31 tokens"):
        Tokenizer.for_model(path)


@pytest.mark.timeout(TIMEOUT_S)
def test_oversized_text_and_bad_ids(tmp_path):
    tok = Tokenizer.for_model(tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=tiny_tokenizer_json()))
    with pytest.raises(DiffuseError, match="more than"):
        tok.encode("a" * (MAX_TEXT_CHARS + 1))
    with pytest.raises(DiffuseError, match="expected text"):
        tok.encode(b"bytes")
    with pytest.raises(DiffuseError, match="must be integers"):
        tok.decode(["x"])
    check(tok)


@pytest.mark.timeout(TIMEOUT_S)
def test_benign_pipeline_still_loads(tmp_path):
    """Llama 2 / Gemma style steps stay within the bounds."""
    spec = with_pipeline(
        normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                        replace({"String": " "}, "\u2581")]},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")]},
        decoder={"type": "Sequence", "decoders": [replace({"String": "\u2581"}, " ")]})
    tok = Tokenizer.for_model(tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=spec))
    assert tok.encode("hello")
    check(tok)
