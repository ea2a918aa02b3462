"""The same weights in the three GGUF dialects (ours, llama.cpp's, diffuse-cpp's) give the same
logits, hyper-parameters, mask ids and rope modes (see tests/fixtures/dialects.py)."""
from __future__ import annotations

import numpy as np
import pytest
from fixtures.dialects import to_diffuse_cpp, to_llama_cpp

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.convert.families import FAMILIES as CONVERTED
from diffuse.generation import ARCHITECTURES, FAMILIES

IDS = [5, 17, 123, 300, 44, 9, 250, 1, 77, 399, 210, 3]

# Hyper-parameters that every dialect states.
SHARED = ("arch", "n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_ctx_train", "head_dim",
          "rope_theta", "rms_eps", "shift_logits", "mask_token_id")


@pytest.fixture(scope="module", params=["llada", "dream"])
def dialect_files(request, tiny_gguf, tmp_path_factory):
    """(family, {dialect: path}) from the f32 conversion."""
    family = request.param
    ours = tiny_gguf(family, "f32")
    tmp = tmp_path_factory.mktemp(f"dialects_{family}")
    return family, {
        "diffuse": ours,
        "llama.cpp": to_llama_cpp(ours, tmp / "llama_cpp.gguf", keep_mask=True),
        "diffuse-cpp": to_diffuse_cpp(ours, tmp / "diffuse_cpp"),
    }


def test_ours_and_llama_cpp_are_the_same_model(dialect_files):
    family, paths = dialect_files
    ours, theirs = diffuse.load(paths["diffuse"]), diffuse.load(paths["llama.cpp"])
    assert (ours.dialect, theirs.dialect) == ("diffuse", "llama.cpp")
    assert {k: theirs.hparams[k] for k in SHARED} == {k: ours.hparams[k] for k in SHARED}
    assert ours.hparams["rope_mode"] == theirs.hparams["rope_mode"] == ("norm" if family == "llada" else "neox")
    assert ours.hparams["shift_logits"] is (family == "dream")
    np.testing.assert_array_equal(theirs.forward(IDS), ours.forward(IDS))   # same bytes, same graph


def test_diffuse_cpp_is_the_same_model(dialect_files):
    family, paths = dialect_files
    ours, theirs = diffuse.load(paths["diffuse"], kv_f16=False), diffuse.load(paths["diffuse-cpp"], kv_f16=False)
    assert theirs.dialect == "diffuse-cpp"
    assert {k: theirs.hparams[k] for k in SHARED} == {k: ours.hparams[k] for k in SHARED}
    assert theirs.hparams["rope_mode"] == "neox"   # q/k in Hugging Face order
    # Unpermuted q/k with NEOX rope and permuted q/k with NORM rope are the same arithmetic in
    # another order: float32 rounding only.
    got, want = theirs.forward(IDS), ours.forward(IDS)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    assert theirs.tokenizer.encode("the river") == ours.tokenizer.encode("the river")   # tokenizer.json beside


def test_python_reads_each_file_as_the_engine_loads_it(dialect_files):
    """gguf_file's architecture, family and dialect are the loader's own (read_gguf's identity),
    for every dialect: no Python copy of the rules to drift."""
    family, paths = dialect_files
    for dialect, path in paths.items():
        info, model = gguf_file.read(path), diffuse.load(path)
        assert (info.arch, info.family, info.dialect) == (model.arch, model.family, model.dialect) == \
            (family, family, dialect)


def test_the_engines_table_names_every_architecture_the_converter_writes():
    assert {f.arch for f in CONVERTED.values()} <= set(ARCHITECTURES)
    assert set(FAMILIES) == {a["family"] for a in ARCHITECTURES.values()} and set(FAMILIES) <= set(ARCHITECTURES)
    assert {a["loop"] for a in ARCHITECTURES.values()} == {"masked", "uniform-state", "causal"}


def test_a_file_the_engine_does_not_run_has_no_family(tiny_gguf, tmp_path):
    """A diffuse-cpp file of a model type its loader refuses (Python's old copy listed sdar as one)."""
    from test_moe import _set, rewrite
    path = rewrite(to_diffuse_cpp(tiny_gguf("llada", "f32"), tmp_path / "cpp"), tmp_path / "sdar.gguf",
                   _set("diffuse.model_type", "sdar"))
    info = gguf_file.read(path)
    assert (info.architecture, info.arch, info.family, info.dialect) == ("diffuse", None, None, "other")
    with pytest.raises(DiffuseError, match="unknown diffuse.model_type 'sdar'"):
        diffuse.load(path)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_diffuse_cpp_f16_with_f16_norms(family, tiny_gguf, tmp_path):
    """diffuse-cpp's --type f16 stores the norm weights in F16 too."""
    ours = diffuse.load(tiny_gguf(family, "f16"))
    theirs = diffuse.load(to_diffuse_cpp(tiny_gguf(family, "f16"), tmp_path))
    got, want = theirs.forward(IDS), ours.forward(IDS)
    assert np.abs(got - want).max() / np.abs(want).max() < 5e-3   # norm weights rounded to f16


def test_llama_cpp_llada_without_mask_id_falls_back_to_126336(tiny_gguf, tmp_path):
    """llama.cpp's LLaDA converter writes no mask id; readers use LLaDA-8B's 126336, which lies
    outside a tiny vocabulary, so loading must say so rather than crash."""
    path = to_llama_cpp(tiny_gguf("llada", "f32"), tmp_path / "llada.gguf")
    with pytest.raises(DiffuseError, match="126336"):
        diffuse.load(path)


def test_llama_cpp_dream_without_shift_key_shifts(tiny_gguf, tmp_path):
    """llama.cpp's Dream converter writes no diffusion.shift_logits: absent means shifted."""
    model = diffuse.load(to_llama_cpp(tiny_gguf("dream", "f32"), tmp_path / "dream.gguf"))
    assert model.hparams["shift_logits"] is True
    assert model.mask_token_id == diffuse.load(tiny_gguf("dream", "f32")).mask_token_id
