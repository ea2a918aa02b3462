"""diffuse convert, quantize and info for the block-diffusion families: SDAR/TraDo (arch sdar) and
Fast-dLLM v2 (arch fast-dllm-v2), on tiny checkpoints in their real layouts."""
from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_models import write_fast_dllm_v2, write_sdar
from reference.forward import load as reference_load

from test_convert import tensor_array

from diffuse import DiffuseError, gguf_file, info
from diffuse.convert import convert_hf
from diffuse.convert.families import FAST_DLLM_V2, SDAR
from diffuse.model import load
from diffuse.quantize import quantize_file

SOURCES = {"sdar": "tiny_hf_sdar", "fast-dllm-v2": "tiny_hf_fast_dllm_v2"}


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
def test_keys(family, tiny_gguf, request):
    kv = gguf_file.read(tiny_gguf(family)).kv
    config, _ = reference_load(str(request.getfixturevalue(SOURCES[family])))
    a = family
    assert kv["general.architecture"] == family
    assert kv["diffuse.format_version"] == 1
    assert (kv[f"{a}.block_count"], kv[f"{a}.embedding_length"], kv[f"{a}.feed_forward_length"]) == \
        (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"])
    assert (kv[f"{a}.attention.head_count"], kv[f"{a}.attention.head_count_kv"]) == (4, 2)
    head_dim = config.get("head_dim") or config["hidden_size"] // 4
    assert kv[f"{a}.attention.key_length"] == kv[f"{a}.attention.value_length"] == head_dim
    assert kv[f"{a}.context_length"] == config["max_position_embeddings"]
    assert kv[f"{a}.rope.freq_base"] == pytest.approx(config["rope_theta"])
    assert kv[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(config["rms_norm_eps"])
    if family == "sdar":
        assert head_dim == 128 != config["hidden_size"] // 4        # Qwen3's own head size
        assert kv["tokenizer.ggml.mask_token_id"] == config["mask_token_id"]
        assert kv["diffusion.shift_logits"] is False
        assert kv["diffusion.block_size"] == config["block_size"] == 4
        assert "diffusion.sub_block_size" not in kv
    else:
        assert kv["diffusion.shift_logits"] is True
        assert kv["diffusion.block_size"] == config["bd_size"] == 32
        assert kv["diffusion.sub_block_size"] == 8
        vocab = kv["tokenizer.ggml.tokens"]
        assert vocab[kv["tokenizer.ggml.mask_token_id"]] == "|<MASK>|"   # no mask id in its config.json
    assert gguf_file.read(tiny_gguf(family)).kv_types["diffusion.block_size"] == "u32"


@pytest.mark.parametrize("family, recipe", [("sdar", SDAR.recipe), ("fast-dllm-v2", FAST_DLLM_V2.recipe)])
def test_recipe_keys(family, recipe, tiny_gguf):
    f = gguf_file.read(tiny_gguf(family))
    got = {k.removeprefix("diffuse.recipe."): v for k, v in f.kv.items() if k.startswith("diffuse.recipe.")}
    assert got.keys() == recipe.keys()
    for name, value in recipe.items():
        kind = {int: "i32", float: "f32", str: "str"}[type(value)]
        assert f.kv_types[f"diffuse.recipe.{name}"] == kind
        assert got[name] == pytest.approx(value) if kind == "f32" else got[name] == value
    assert SDAR.recipe == {"block_length": 4, "steps": 4, "scheduler": "low_confidence_dynamic",
                           "confidence_threshold": 0.85, "temperature": 0.0}


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
def test_tensors(family, tiny_gguf, request):
    f = gguf_file.read(tiny_gguf(family))
    config, weights = reference_load(str(request.getfixturevalue(SOURCES[family])))
    names = {t.name: t for t in f.tensors}
    per_layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down"}
    per_layer |= {"attn_q_norm", "attn_k_norm"} if family == "sdar" else {"attn_q.bias", "attn_k.bias", "attn_v.bias"}
    want = {f"blk.{i}.{p}" + ("" if p.endswith("bias") else ".weight") for i in range(2) for p in per_layer}
    want |= {"token_embd.weight", "output_norm.weight"}
    want |= set() if config["tie_word_embeddings"] else {"output.weight"}
    assert set(names) == want
    if family == "fast-dllm-v2":
        assert config["tie_word_embeddings"]                          # like Fast_dLLM_v2_1.5B: no output tensor
    # q/k not permuted (NEOX RoPE): the rows are the checkpoint's, in order (f32 is exact)
    for name, hf in (("blk.1.attn_q.weight", "q_proj"), ("blk.1.attn_k.weight", "k_proj")):
        np.testing.assert_array_equal(tensor_array(names[name]), weights[f"model.layers.1.self_attn.{hf}.weight"])


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
def test_quantize_keeps_the_block_keys(family, tiny_gguf, tmp_path):
    try:   # quantize first loads the file with the engine, which runs these architectures from issue 20 on
        load(tiny_gguf(family, "f16"), threads=1)
    except DiffuseError as err:
        if "unsupported architecture" in str(err):
            pytest.skip(f"this engine build does not run {family} yet")
        raise
    src = gguf_file.read(tiny_gguf(family, "f16"))
    out = quantize_file(tiny_gguf(family, "f16"), tmp_path / "q.gguf", "Q8_0")
    dst = gguf_file.read(out)
    for key, value in src.kv.items():
        if key.startswith(("diffusion.", "diffuse.recipe.", f"{family}.", "tokenizer.ggml.mask")):
            assert dst.kv[key] == value, key
    types = {t.name: t.type_name for t in dst.tensors}
    assert types["blk.0.attn_q.weight"] == "q8_0"
    norms_and_biases = [n for n in types if "norm" in n or n.endswith("bias")]
    assert norms_and_biases and all(types[n] == "f32" for n in norms_and_biases)


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
def test_info_shows_the_block_size(family, tiny_gguf):
    d = info.describe(tiny_gguf(family))
    diff = d["diffusion"]
    assert diff["block_size"] == (4 if family == "sdar" else 32)
    assert diff["sub_block_size"] == (None if family == "sdar" else 8)
    assert diff["shift_logits"] is (family != "sdar")
    assert d["recipe"]["block_length"] == diff["block_size"]      # the authors' recipe, read by the model
    text = info.format_info(d)
    assert f"trained on blocks of {diff['block_size']}" in text
    assert f"mask id {diff['mask_token_id']}" in text
    assert "recipe" in text and "confidence_threshold" in text


def test_info_of_a_full_attention_model_has_no_block_line(tiny_gguf):
    d = info.describe(tiny_gguf("dream"))
    assert d["diffusion"]["block_size"] is None and not d["recipe"]
    assert "block diffusion" not in info.format_info(d)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied(tmp_path, tied):
    folder = write_sdar(tmp_path / "hf", tied=tied, n_shards=1)
    names = {t.name for t in gguf_file.read(convert_hf(folder, tmp_path / "out.gguf")).tensors}
    assert ("output.weight" in names) is not tied


def test_explicit_block_size_is_recorded(tmp_path):
    """The block size goes into the file, and the authors' recipe decodes that block, one step per
    position as generate.py's defaults do for its block of 4."""
    for bs in (8, 16):
        folder = write_sdar(tmp_path / f"s{bs}", block_size=bs)
        kv = gguf_file.read(convert_hf(folder, tmp_path / f"s{bs}.gguf")).kv
        assert kv["diffusion.block_size"] == bs
        assert (kv["diffuse.recipe.block_length"], kv["diffuse.recipe.steps"]) == (bs, bs)
    folder = write_fast_dllm_v2(tmp_path / "f", config_edit=lambda c: c.pop("bd_size"))
    assert gguf_file.read(convert_hf(folder, tmp_path / "f.gguf")).kv["diffusion.block_size"] == 32


def test_sdar_config_without_block_size_or_mask_id(tmp_path):
    """Some published SDAR config.json copies lack both keys: generate.py's block of 4 and the
    vocabulary's <|MASK|>."""
    folder = write_sdar(tmp_path / "hf", config_edit=lambda c: [c.pop("block_size"), c.pop("mask_token_id")])
    info = gguf_file.read(convert_hf(folder, tmp_path / "out.gguf"))
    vocab = info.kv["tokenizer.ggml.tokens"]
    assert info.kv["diffusion.block_size"] == 4
    assert vocab[info.kv["tokenizer.ggml.mask_token_id"]] == "<|MASK|>"


def set_key(**values):
    return lambda config: config.update(values)


def drop_key(key):
    return lambda config: config.pop(key)


@pytest.mark.parametrize("writer, config_edit, message", [
    (write_sdar, set_key(block_size=0), "block_size = 0 is not an integer from 1"),
    (write_sdar, set_key(block_size=-4), "block_size = -4 is not an integer from 1"),
    (write_sdar, set_key(block_size=2.5), "block_size = 2.5 is not an integer"),
    (write_sdar, set_key(block_size="4"), "block_size = '4' is not an integer"),
    (write_sdar, set_key(block_size=65536), "block_size = 65536 is larger than the context \\(32768 positions\\)"),
    (write_sdar, set_key(mask_token_id=-1), "mask_token_id = -1 is not an integer"),
    (write_sdar, set_key(head_dim=127), "heads of 127 / 2 KV heads do not give an even head size"),
    (write_sdar, set_key(num_key_value_heads=3), "4 heads of 128 / 3 KV heads"),
    (write_sdar, set_key(attention_bias=True), "attention_bias = True is a sdar variant"),
    (write_sdar, set_key(use_sliding_window=True), "use_sliding_window"),
    (write_fast_dllm_v2, set_key(bd_size=0), "bd_size = 0 is not an integer from 1"),
    (write_fast_dllm_v2, set_key(bd_size=12), "bd_size = 12 is not a whole number of the 8-token sub-blocks"),
    (write_fast_dllm_v2, set_key(bd_size=64, max_position_embeddings=32), "bd_size = 64 is larger than the context"),
    (write_fast_dllm_v2, set_key(num_attention_heads=3), "256 is not a whole number of 3 heads"),
])
def test_bad_block_checkpoints(tmp_path, writer, config_edit, message):
    folder = writer(tmp_path / "hf", config_edit=config_edit)
    with pytest.raises(DiffuseError, match=message):
        convert_hf(folder, tmp_path / "out.gguf")
    assert list(tmp_path.glob("out.gguf*")) == []


def test_mask_id_beyond_the_vocabulary(tmp_path):
    folder = write_sdar(tmp_path / "hf", config_edit=set_key(mask_token_id=100000))
    with pytest.raises(DiffuseError, match="no usable mask token id"):
        convert_hf(folder, tmp_path / "out.gguf")


def test_fast_dllm_v2_without_its_mask_token(tmp_path):
    """No mask id in config.json and no |<MASK>| in the tokenizer: the code's 151665 lies beyond a
    tiny vocabulary, which is one clear error."""
    def drop_mask(folder):
        import json
        path = folder / "tokenizer.json"
        spec = json.loads(path.read_text())
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "|<MASK>|"]
        path.write_text(json.dumps(spec))
    folder = write_fast_dllm_v2(tmp_path / "hf")
    drop_mask(folder)
    with pytest.raises(DiffuseError, match="no usable mask token id"):
        convert_hf(folder, tmp_path / "out.gguf")


def test_bf16_weights_stay_exact(tiny_gguf):
    f = gguf_file.read(tiny_gguf("sdar", "bf16"))
    assert {t.type_name for t in f.tensors if len(t.shape) == 2} == {"bf16"}
