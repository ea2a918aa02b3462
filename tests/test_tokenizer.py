"""Tokenizer: every source gives the ids the `tokenizers` library gives on the original tokenizer.json;
special tokens' strings in text from users are text, in chats only the template makes special tokens."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from test_bad_input import rewrite
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    " Hello, World!  ",
    "I've been 'told he's there, 'RE you sure? We'Ve a'lL",
    "Äpfel, naïve café, Ελληνικά, нещо на Български",
    "我想在apple工作1314151天～ こんにちは 한국어",
    "🦙🚀 (emoji) 😶\u200d🌫️ ✅ 👍🏽",
    "3 33 333 3333 33333 3.3 3..3 ------======= !!!!!!?????",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \nend",
    "line one\r\nline two\ttab",
    "e\u0301 decomposed accent",
    "<|im_start|>user\nHi<|im_end|>\n",
]

VOCAB_NAMES = ["qwen2", "llama-bpe", "gpt-2"]


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory) -> Path:
    """llama.cpp's vocab-only GGUFs and their test vectors, taken from the llama-cpp-python sdist
    that the engine build caches (cmake/fetch_ggml.py; `pip install .` fills the cache)."""
    spec = importlib.util.spec_from_file_location("fetch_ggml", Path(__file__).parents[1] / "cmake" / "fetch_ggml.py")
    fetch_ggml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch_ggml)
    cache = Path(os.environ.get("DIFFUSE_CACHE", Path.home() / ".cache" / "diffuse"))   # as CMakeLists.txt
    sdist = Path(os.environ.get("DIFFUSE_GGML_SDIST") or cache / fetch_ggml.SDIST_NAME)
    if not sdist.exists():
        pytest.skip(f"{sdist} not present (the engine build downloads it)")
    assert fetch_ggml.sha256(sdist) == fetch_ggml.SDIST_SHA256
    folder = fetch_ggml.GGML_PREFIX.replace("/ggml/", "/models/")
    wanted = {f"{folder}ggml-vocab-{n}.gguf{ext}" for n in VOCAB_NAMES for ext in ("", ".inp", ".out")}
    out = tmp_path_factory.mktemp("vocab")
    with tarfile.open(sdist) as tar:
        for member in tar:
            if member.name in wanted:
                (out / Path(member.name).name).write_bytes(tar.extractfile(member).read())
    assert len(list(out.iterdir())) == len(wanted)
    return out

# The pre-tokenizer regexes exactly as the models' own tokenizer.json files write them; the
# tokenizer rebuilt from llama.cpp arrays uses llama.cpp's adapted forms, so these tests check
# that the two agree.
HF_REGEX = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|mask|>"]


def check_ids(tok: Tokenizer, original: HFTokenizer, text: str) -> None:
    """tok gives the library's ids for `text`: encode with special tokens' strings as text,
    encode_with_special_tokens with them as the tokens."""
    assert tok.encode_with_special_tokens(text) == original.encode(text, add_special_tokens=False).ids, text
    original.encode_special_tokens = True
    try:
        assert tok.encode(text) == original.encode(text, add_special_tokens=False).ids, text
    finally:
        original.encode_special_tokens = False


def train_tokenizer(pre: str) -> HFTokenizer:
    """A small byte-level BPE in the layout of Qwen2's (pre="qwen2") or Llama 3's tokenizer.json."""
    tok = HFTokenizer(models.BPE(ignore_merges=pre == "llama-bpe"))
    if pre == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(HF_REGEX[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 20 + ["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    return tok


def write_arrays_gguf(hf: HFTokenizer, path: Path, pre: str, arch: str = "dream") -> Path:
    """A GGUF holding only llama.cpp's tokenizer.ggml.* arrays for `hf` (as llama.cpp's converter writes them)."""
    j = json.loads(hf.to_str())
    vocab = hf.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in j["added_tokens"] if a["special"]}
    merges = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    kv = {"general.architecture": arch, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [3 if t in special else 1 for t in tokens],
          "tokenizer.ggml.merges": merges}
    kv_types = {"general.architecture": "str", "tokenizer.ggml.model": "str", "tokenizer.ggml.pre": "str",
                "tokenizer.ggml.tokens": "array[str]", "tokenizer.ggml.token_type": "array[i32]",
                "tokenizer.ggml.merges": "array[str]"}
    gguf_file.write(path, kv, kv_types, [], [])
    return path


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe"])
def test_llama_cpp_arrays_match_original(tmp_path, pre):
    hf = train_tokenizer(pre)
    tok = Tokenizer.for_model(write_arrays_gguf(hf, tmp_path / "m.gguf", pre))
    assert tok.source.startswith("llama.cpp vocabulary")
    for text in TEXTS:
        check_ids(tok, hf, text)
        want = hf.encode(text, add_special_tokens=False).ids
        assert tok.decode(want) == hf.decode(want, skip_special_tokens=False)
    assert tok.vocab_size == hf.get_vocab_size()
    assert set(tok.special_tokens.values()) == set(SPECIALS)


def test_unicode_round_trip(tmp_path):
    tok = Tokenizer.for_model(write_arrays_gguf(train_tokenizer("llama-bpe"), tmp_path / "m.gguf", "llama-bpe"))
    for text in TEXTS:   # no NFC in this layout, so decoding gives back every text exactly
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("name", VOCAB_NAMES)
def test_llama_cpp_vocab_test_vectors(vocab_dir, name):
    """llama.cpp's vocab-only GGUFs ship inputs (.inp) and the ids Hugging Face gives (.out)."""
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    tok = Tokenizer.for_model(path)
    inputs = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    outputs = path.with_name(path.name + ".out").read_text(encoding="utf-8").splitlines()
    if inputs[-1] == "":
        inputs.pop()
    assert len(inputs) == len(outputs) > 20
    for text, ids in zip(inputs, outputs):
        assert tok.encode_with_special_tokens(text) == [int(i) for i in ids.split()], text


def test_qwen2_vocab_specials_and_template(vocab_dir):
    path = vocab_dir / "ggml-vocab-qwen2.gguf"
    tok = Tokenizer.for_model(path, hparams={"arch": "dream", "mask_token_id": 151666})
    assert [tok.id_to_token(i) for i in tok.eos_token_ids] == ["<|endoftext|>", "<|im_end|>"]
    assert tok.mask_token_id == 151666
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode_chat("Hi")
    assert ids[0] == tok.token_to_id("<|im_start|>")
    assert ids[-3:] == [tok.token_to_id("<|im_start|>"), tok.token_to_id("assistant"), tok.token_to_id("Ċ")]


def test_tokenizer_json_beside_and_explicit(tmp_path):
    hf = train_tokenizer("qwen2")
    model = write_arrays_gguf(hf, tmp_path / "m.gguf", "qwen2")
    (tmp_path / "tokenizer.json").write_text(hf.to_str(), encoding="utf-8")
    beside = Tokenizer.for_model(model)
    assert beside.source == str(tmp_path / "tokenizer.json")
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(tmp_path / "tokenizer.json", other / "tokenizer.json")
    (other / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}!"}))
    explicit = Tokenizer.for_model(model, other)   # a folder: its tokenizer.json and chat template
    assert explicit.source == str(other / "tokenizer.json")
    assert explicit.apply_chat_template([{"role": "user", "content": "Hi"}]) == "Hi!"
    for text in TEXTS:
        check_ids(beside, hf, text)
        check_ids(explicit, hf, text)


def test_missing_tokenizer_says_how_to_fix(tmp_path):
    path = tmp_path / "bare.gguf"
    gguf_file.write(path, {"general.architecture": "diffuse", "diffuse.model_type": "llada"},
                    {"general.architecture": "str", "diffuse.model_type": "str"}, [], [])
    with pytest.raises(DiffuseError, match=r"bare\.gguf.*no tokenizer.*tokenizer\.json"):
        Tokenizer.for_model(path)
    with pytest.raises(DiffuseError, match="no such tokenizer file"):
        Tokenizer.for_model(path, tmp_path / "missing.json")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DiffuseError, match="not a valid tokenizer.json"):
        Tokenizer.for_model(path)


def test_unknown_pre_tokenizer_is_an_error(tmp_path):
    path = write_arrays_gguf(train_tokenizer("qwen2"), tmp_path / "m.gguf", "no-such-pre")
    with pytest.raises(DiffuseError, match="unknown llama.cpp pre-tokenizer 'no-such-pre'"):
        Tokenizer.for_model(path)


def test_family_chat_templates(tmp_path):
    hf = train_tokenizer("llama-bpe")
    hf.add_special_tokens(["<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>"])
    (tmp_path / "tokenizer.json").write_text(hf.to_str(), encoding="utf-8")
    path = tmp_path / "m.gguf"
    gguf_file.write(path, {"general.architecture": "llada"}, {"general.architecture": "str"}, [], [])
    llada = Tokenizer.for_model(path)
    assert llada.bos_token_id == hf.token_to_id("<|startoftext|>")
    chat = [{"role": "user", "content": " What is 2+2? "}]
    assert llada.apply_chat_template(chat) == (
        "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = llada.encode_chat(" What is 2+2? ")
    assert ids[0] == llada.bos_token_id and hf.token_to_id("<|eot_id|>") in ids
    assert llada.eos_token_ids == tuple(sorted([hf.token_to_id("<|endoftext|>"), hf.token_to_id("<|eot_id|>"),
                                                hf.token_to_id("<|im_end|>")]))

    gguf_file.write(path, {"general.architecture": "dream"}, {"general.architecture": "str"}, [], [])
    dream = Tokenizer.for_model(path, hparams={"arch": "dream", "mask_token_id": hf.token_to_id("<|mask|>")})
    assert dream.apply_chat_template(chat, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n What is 2+2? <|im_end|>\n")
    assert dream.mask_token_id == hf.token_to_id("<|mask|>")


def test_chat_template_is_sandboxed(tmp_path):
    hf = train_tokenizer("qwen2")
    (tmp_path / "tokenizer.json").write_text(hf.to_str(), encoding="utf-8")
    path = tmp_path / "m.gguf"
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    gguf_file.write(path, {"general.architecture": "dream", "tokenizer.chat_template": evil},
                    {"general.architecture": "str", "tokenizer.chat_template": "str"}, [], [])
    tok = Tokenizer.for_model(path)
    with pytest.raises(DiffuseError, match="chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_decode_rejects_negative_ids(tmp_path):
    tok = Tokenizer.for_model(write_arrays_gguf(train_tokenizer("qwen2"), tmp_path / "m.gguf", "qwen2"))
    with pytest.raises(DiffuseError, match="token ids"):
        tok.decode([1, -5])
    assert tok.decode([tok.vocab_size + 100]) == ""   # padding rows of the output decode to nothing


# ---- the three sources of a converted model ----

@pytest.fixture(scope="module", params=["llada", "dream"])
def family_sources(request, tiny_gguf, tmp_path_factory):
    """(original tokenizer, {source: model path}) for one family."""
    family = request.param
    model = tiny_gguf(family, "f32")
    original = HFTokenizer.from_str(gguf_file.read(model).kv["tokenizer.huggingface.json"])
    if family == "llada":   # the checkpoint's own tokenizer.json is what was embedded
        hf_dir = request.getfixturevalue("tiny_hf_llada")
        assert original.to_str() == HFTokenizer.from_file(str(hf_dir / "tokenizer.json")).to_str()
    tmp = tmp_path_factory.mktemp(f"tok_{family}")
    arrays = rewrite(model, tmp / "arrays.gguf", drop=["tokenizer.huggingface.json"])
    (tmp / "beside").mkdir()
    keys = gguf_file.read(model).kv   # the engine still needs the mask id
    beside = rewrite(model, tmp / "beside" / "model.gguf",
                     drop=[k for k in keys if k.startswith("tokenizer.") and k != "tokenizer.ggml.mask_token_id"])
    (tmp / "beside" / "tokenizer.json").write_text(original.to_str(), encoding="utf-8")
    return family, original, {"embedded": model, "arrays": arrays, "beside": beside}


@pytest.mark.parametrize("source", ["embedded", "arrays", "beside"])
def test_model_tokenizer_matches_original(family_sources, source):
    family, original, paths = family_sources
    tok = diffuse.load(paths[source], threads=1).tokenizer
    assert {"embedded": "embedded tokenizer.json", "arrays": "llama.cpp vocabulary",
            "beside": str(paths["beside"].parent / "tokenizer.json")}[source] in tok.source
    for text in TEXTS:
        check_ids(tok, original, text)
        want = original.encode(text, add_special_tokens=False).ids
        assert tok.decode(want) == original.decode(want, skip_special_tokens=False)
    names = {"llada": ["<|endoftext|>", "<|eot_id|>"], "dream": ["<|endoftext|>", "<|im_end|>"]}[family]
    assert tok.eos_token_ids == tuple(sorted(original.token_to_id(n) for n in names))
    mask = {"llada": "<|mdm_mask|>", "dream": "<|mask|>"}[family]
    assert tok.mask_token_id == original.token_to_id(mask)
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    head = {"llada": "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
            "dream": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"}
    assert chat.startswith(head[family])
    assert tok.encode_chat("Hi") == original.encode(chat, add_special_tokens=False).ids
