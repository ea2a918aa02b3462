"""Hugging Face -> GGUF conversion: keys, tokenizer, tensor names/types/shapes/data, errors,
atomic output, cancel, progress and the CLI."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures.tiny_models import (DREAM_CHAT_TEMPLATE, DREAM_SPECIALS, LLADA_CHAT_TEMPLATE, LLADA_SPECIALS, TEXT,
                                  VOCAB_SIZE, train_tokenizer, write_dream, write_llada)
from gguf import GGMLQuantizationType as T
from gguf import TokenType
from gguf.quants import dequantize
from reference.forward import forward as reference_forward
from reference.forward import load as reference_load
from tokenizers import Tokenizer

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.cli import main as cli_main
from diffuse.convert import convert_hf, hf_to_gguf
from diffuse.convert.families import DREAM, LLADA, qk_row_order
from diffuse.convert.vocab import LLAMA3_SPLIT, QWEN2_SPLIT

FAMILIES = {"llada": LLADA, "dream": DREAM}
SPECIALS = {"llada": LLADA_SPECIALS, "dream": DREAM_SPECIALS}


def hf_dir_of(request, family):
    return request.getfixturevalue(f"tiny_hf_{family}")


def hf_names(family: str, n_layer: int) -> dict[str, str]:
    """GGUF tensor name -> Hugging Face name."""
    return {p.format(i=i): h.format(i=i) for p, h in FAMILIES[family].tensors.items() for i in range(n_layer)}


def tensor_array(t: gguf_file.TensorInfo) -> np.ndarray:
    """Float32 (rows, cols) in numpy order."""
    return dequantize(np.asarray(t.raw()), T(t.type)).reshape(t.shape[::-1]).astype(np.float32)


# ---- metadata and tokenizer ----

@pytest.mark.parametrize("family", ["llada", "dream"])
def test_hyperparameters_and_diffusion_keys(family, tiny_gguf, request):
    config = json.loads((hf_dir_of(request, family) / "config.json").read_text())
    kv = gguf_file.read(tiny_gguf(family, "f32")).kv
    a = family
    llada = family == "llada"
    assert kv["general.architecture"] == a
    assert kv["diffuse.format_version"] == 1
    assert kv["general.file_type"] == 0
    assert kv[f"{a}.block_count"] == config["n_layers" if llada else "num_hidden_layers"]
    assert kv[f"{a}.embedding_length"] == config["d_model" if llada else "hidden_size"]
    assert kv[f"{a}.feed_forward_length"] == config["mlp_hidden_size" if llada else "intermediate_size"]
    assert kv[f"{a}.attention.head_count"] == config["n_heads" if llada else "num_attention_heads"]
    assert kv[f"{a}.attention.head_count_kv"] == config["n_kv_heads" if llada else "num_key_value_heads"]
    assert kv[f"{a}.context_length"] == config["max_sequence_length" if llada else "max_position_embeddings"]
    assert kv[f"{a}.rope.freq_base"] == config["rope_theta"]
    assert kv[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(config["rms_norm_eps"])
    assert kv[f"{a}.rope.dimension_count"] == kv[f"{a}.embedding_length"] // kv[f"{a}.attention.head_count"]
    assert kv[f"{a}.vocab_size"] == VOCAB_SIZE
    assert kv[f"{a}.attention.causal"] is False
    assert kv["diffusion.shift_logits"] is (family == "dream")
    assert kv["tokenizer.ggml.mask_token_id"] == config["mask_token_id"]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_tokenizer_is_embedded_both_ways(family, tiny_gguf, request):
    hf_dir = hf_dir_of(request, family)
    kv = gguf_file.read(tiny_gguf(family, "f32")).kv
    trained = train_tokenizer(LLAMA3_SPLIT if family == "llada" else QWEN2_SPLIT, SPECIALS[family])

    # The original tokenizer.json (LLaDA: byte for byte; Dream: built from vocab.json + merges.txt).
    embedded = Tokenizer.from_str(kv["tokenizer.huggingface.json"])
    if family == "llada":
        assert kv["tokenizer.huggingface.json"] == (hf_dir / "tokenizer.json").read_text()
    assert embedded.encode(TEXT).ids == trained.encode(TEXT).ids
    assert kv["tokenizer.chat_template"] == (LLADA_CHAT_TEMPLATE if family == "llada" else DREAM_CHAT_TEMPLATE)

    # llama.cpp's arrays: one token per embedding row.
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert kv["tokenizer.ggml.pre"] == ("llama-bpe" if family == "llada" else "qwen2")
    tokens, types = list(kv["tokenizer.ggml.tokens"]), list(kv["tokenizer.ggml.token_type"])
    n = trained.get_vocab_size()
    assert len(tokens) == len(types) == VOCAB_SIZE
    assert tokens[:n] == [trained.id_to_token(i) for i in range(n)]
    assert tokens[n:] == [f"[PAD{i}]" for i in range(n, VOCAB_SIZE)]
    specials = dict(SPECIALS[family])
    for i in range(VOCAB_SIZE):
        want = (TokenType.UNUSED if i >= n else TokenType.NORMAL if tokens[i] not in specials
                else TokenType.CONTROL if specials[tokens[i]] else TokenType.USER_DEFINED)
        assert types[i] == want, tokens[i]
    merges = json.loads(trained.to_str())["model"]["merges"]
    assert list(kv["tokenizer.ggml.merges"]) == [" ".join(m) for m in merges]

    ids = {c: trained.token_to_id(c) for c, _ in SPECIALS[family]}
    if family == "llada":
        want = {"bos": "<|startoftext|>", "eos": "<|endoftext|>", "padding": "<|endoftext|>", "eot": "<|eot_id|>",
                "mask": "<|mdm_mask|>"}
    else:
        want = {"bos": "<|beginoftext|>", "eos": "<|endoftext|>", "padding": "<|endoftext|>", "eot": "<|im_end|>",
                "mask": "<|mask|>"}
    assert {k: kv[f"tokenizer.ggml.{k}_token_id"] for k in want} == {k: ids[v] for k, v in want.items()}


# ---- tensors ----

@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_tensor_names_types_shapes(family, outtype, tiny_gguf, request):
    _, weights = reference_load(str(hf_dir_of(request, family)))
    info = gguf_file.read(tiny_gguf(family, outtype))
    n_layer = info.kv[f"{family}.block_count"]
    want = [p.format(i=i) for p in FAMILIES[family].tensors for i in (range(n_layer) if "{i}" in p else [None])]
    assert [t.name for t in info.tensors] == want
    hf = hf_names(family, n_layer)
    matrix = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0}[outtype]
    for t in info.tensors:
        hf_shape = weights[hf[t.name]].shape
        assert t.shape == hf_shape[::-1], t.name            # ggml order: (in, out)
        assert t.type == (matrix if len(hf_shape) == 2 else T.F32), t.name
    assert info.kv["general.file_type"] == {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}[outtype]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_tensor_data(family, tiny_gguf, request):
    """F32 holds the checkpoint's values exactly; LLaDA's q/k rows are permuted for NORM rope."""
    _, weights = reference_load(str(hf_dir_of(request, family)))
    info = gguf_file.read(tiny_gguf(family, "f32"))
    heads = {"attn_q": info.kv[f"{family}.attention.head_count"], "attn_k": info.kv[f"{family}.attention.head_count_kv"]}
    hf = hf_names(family, info.kv[f"{family}.block_count"])
    for t in info.tensors:
        want = weights[hf[t.name]]
        kind = t.name.split(".")[-2]
        if family == "llada" and kind in heads:
            want = want[qk_row_order(len(want), heads[kind])]
        np.testing.assert_array_equal(tensor_array(t), want, err_msg=t.name)


def test_llada_permutation_is_llama_cpps():
    """Within each head, rows (2, d/2) become (d/2, 2): rows j and j + d/2 become neighbours."""
    order = qk_row_order(8, 2)   # 2 heads of 4
    assert order.tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_bf16_checkpoint_to_bf16_is_exact(tiny_gguf, tiny_hf_llada):
    _, weights = reference_load(str(tiny_hf_llada))
    t = gguf_file.read(tiny_gguf("llada", "bf16")).tensor("token_embd.weight")
    np.testing.assert_array_equal(tensor_array(t), weights[LLADA.tensors["token_embd.weight"]])


def test_q8_0_is_close(tiny_gguf, tiny_hf_dream):
    _, weights = reference_load(str(tiny_hf_dream))
    info = gguf_file.read(tiny_gguf("dream", "q8_0"))
    hf = hf_names("dream", info.kv["dream.block_count"])
    for t in info.tensors:
        if t.type == T.Q8_0:
            want = weights[hf[t.name]]
            err = np.abs(tensor_array(t) - want).max(axis=1) / np.abs(want).max(axis=1)
            assert err.max() < 1 / 127, t.name   # half a step of 8-bit blocks, at worst a whole one


def test_small_chunks_write_the_same_file(tiny_hf_llada, tiny_gguf, tmp_path, monkeypatch):
    """Row chunks (and the q/k permutation across chunk edges) do not change a byte."""
    monkeypatch.setattr(hf_to_gguf, "CHUNK_FLOATS", 3 * 256)
    for outtype in ("f32", "q8_0"):
        out = convert_hf(tiny_hf_llada, tmp_path / f"{outtype}.gguf", outtype)
        assert out.read_bytes() == tiny_gguf("llada", outtype).read_bytes()


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_checkpoint_variants(family, dtype, tmp_path):
    """Any stored dtype, a single model.safetensors, tied embeddings: same logits as the reference."""
    write = write_llada if family == "llada" else write_dream
    hf_dir = write(tmp_path / "hf", dtype=dtype, n_shards=1, n_layers=1, tied=True)
    assert (hf_dir / "model.safetensors").is_file()
    path = convert_hf(hf_dir, tmp_path / "m.gguf", "f32")
    info = gguf_file.read(path)
    assert info.tensor("output.weight") is None
    ids = [1, 2, 3, 50, 200, 399]
    want = reference_forward(hf_dir, ids)
    got = diffuse.load(path, threads=1, kv_f16=False).forward(ids)   # F32 cache: exact arithmetic
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


# ---- errors: each names the file and leaves nothing behind ----

def broken_copy(src, dst, change):
    shutil.copytree(src, dst)
    change(dst)
    return dst


def set_config(**values):
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(values)
        (folder / "config.json").write_text(json.dumps(config))
    return change


def shard(folder):
    return sorted(folder.glob("model-*.safetensors"))[0]


def truncate(folder):
    with open(shard(folder), "r+b") as f:
        f.truncate(shard(folder).stat().st_size - 100)


def garbage(folder):
    shard(folder).write_bytes(b"\xff" * 64)


def drop_config(folder):
    (folder / "config.json").unlink()


def drop_shard(folder):
    shard(folder).unlink()


def drop_tokenizer(folder):
    (folder / "tokenizer.json").unlink()


def config_without(key):
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        del config[key]
        (folder / "config.json").write_text(json.dumps(config))
    return change


@pytest.mark.parametrize("change, message", [
    (drop_config, "no config.json"),
    (set_config(architectures=["LlamaForCausalLM"]), "unsupported architecture"),
    (set_config(include_qkv_bias=True), "include_qkv_bias"),
    (config_without("d_model"), "missing 'd_model'"),
    (set_config(n_heads=5), "head"),
    (truncate, "truncated"),
    (garbage, "model-00001-of-00002.safetensors: not a safetensors file"),
    (drop_shard, "shard model-00001-of-00002.safetensors is missing"),
    (drop_tokenizer, "no tokenizer.json"),
])
def test_bad_folder(tiny_hf_llada, tmp_path, change, message):
    folder = broken_copy(tiny_hf_llada, tmp_path / "hf", change)
    out = tmp_path / "out.gguf"
    with pytest.raises(DiffuseError, match=message):
        convert_hf(folder, out)
    assert list(tmp_path.glob("out.gguf*")) == []


def delete(name):
    return lambda tensors: tensors.pop(name)


def reshape(name):
    return lambda tensors: tensors.update({name: tensors[name][:-1]})


def add(name):
    return lambda tensors: tensors.update({name: np.zeros(4, np.float32)})


@pytest.mark.parametrize("edit, message", [
    (delete("model.transformer.blocks.1.up_proj.weight"), "missing tensor model.transformer.blocks.1.up_proj.weight"),
    (delete("model.transformer.ff_out.weight"), "missing tensor model.transformer.ff_out.weight"),
    (reshape("model.transformer.blocks.0.k_proj.weight"), r"k_proj.weight has shape \[255, 256\], expected \[256, 256\]"),
    (add("model.transformer.blocks.0.q_proj.bias"), "unexpected tensor model.transformer.blocks.0.q_proj.bias"),
])
def test_bad_tensors(tmp_path, edit, message):
    folder = write_llada(tmp_path / "hf", edit=edit)
    with pytest.raises(DiffuseError, match=message):
        convert_hf(folder, tmp_path / "out.gguf")
    assert list(tmp_path.glob("out.gguf*")) == []


def test_unknown_outtype(tiny_hf_dream, tmp_path):
    with pytest.raises(DiffuseError, match="unknown output type 'q4_k'"):
        convert_hf(tiny_hf_dream, tmp_path / "out.gguf", "q4_k")


# ---- progress, cancel, atomic output ----

def test_progress_once_per_tensor(tiny_hf_dream, tiny_gguf, tmp_path):
    calls = []
    convert_hf(tiny_hf_dream, tmp_path / "out.gguf", "f32", progress=lambda *a: calls.append(a))
    names = [t.name for t in gguf_file.read(tiny_gguf("dream", "f32")).tensors]
    assert calls == [(i, len(names), name) for i, name in enumerate(names, 1)]


def test_cancel_leaves_nothing(tiny_hf_dream, tmp_path):
    asked = []

    def cancel():
        asked.append(1)
        return len(asked) > 5

    assert convert_hf(tiny_hf_dream, tmp_path / "out.gguf", "q8_0", cancel=cancel) is None
    assert list(tmp_path.iterdir()) == []


def test_failure_keeps_the_previous_file(tiny_hf_dream, tmp_path):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"previous model")

    def progress(done, total, name):
        if done == 7:
            raise RuntimeError("disk full (simulated)")

    with pytest.raises(RuntimeError, match="simulated"):
        convert_hf(tiny_hf_dream, out, "f16", progress=progress)
    assert out.read_bytes() == b"previous model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf"]


# ---- CLI ----

def test_cli_convert(tiny_hf_llada, tmp_path, capsys):
    out = tmp_path / "llada.gguf"
    assert cli_main(["convert", str(tiny_hf_llada), "-o", str(out), "--outtype", "q8_0"]) == 0
    assert f"wrote {out} (q8_0" in capsys.readouterr().out
    assert gguf_file.read(out).kv["general.file_type"] == 7


def test_cli_convert_error(tmp_path, capsys):
    assert cli_main(["convert", str(tmp_path), "-o", str(tmp_path / "x.gguf")]) == 1
    assert "no config.json" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak from /proc (Linux)")
def test_conversion_streams(tmp_path):
    """Peak memory grows by a few tensors, not by the checkpoint: 31 MiB for 164 MiB of float32."""
    hf_dir = write_llada(tmp_path / "hf", dtype="f32", n_layers=4, d_model=1024)
    size = sum(p.stat().st_size for p in hf_dir.glob("*.safetensors"))
    code = (
        "import sys\n"
        "from diffuse.convert import convert_hf\n"
        "def peak():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) * 1024\n"
        "before = peak()\n"
        "convert_hf(sys.argv[1], sys.argv[2], 'f16')\n"
        "print(peak() - before)\n")
    run = subprocess.run([sys.executable, "-c", code, str(hf_dir), str(tmp_path / "out.gguf")],
                         capture_output=True, text=True, check=True)
    growth = int(run.stdout)
    assert growth < size / 2.5, f"peak memory grew by {growth / 2**20:.0f} MiB for {size / 2**20:.0f} MiB of weights"
