"""DiffusionGemma: the tiny checkpoint transformers saves (fixtures/tiny_diffusion_gemma.py),
converted to PR #24423's dialect, loaded and run; its canvas logits against transformers 5.24 in
float64 over several denoising steps (self-conditioning chained) and two canvases; bad files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.convert import convert_hf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.diffusion_gemma")

from fixtures.tiny_diffusion_gemma import CANVAS, SLIDING_WINDOW, load_reference, write_diffusion_gemma  # noqa: E402


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return write_diffusion_gemma(tmp_path_factory.mktemp("diffusion_gemma") / "hf")


@pytest.fixture(scope="module")
def gguf_f32(hf_dir, tmp_path_factory) -> Path:
    return convert_hf(hf_dir, tmp_path_factory.mktemp("dg_gguf") / "tiny-f32.gguf", "f32")


def test_convert_writes_the_pr_dialect(hf_dir, gguf_f32):
    info = gguf_file.read(gguf_f32)
    kv, names = info.kv, {t.name for t in info.tensors}
    assert kv["general.architecture"] == "diffusion-gemma"
    assert kv["diffusion.canvas_length"] == CANVAS
    assert list(kv["diffusion-gemma.attention.head_count_kv"]) == [2, 1]
    assert list(kv["diffusion-gemma.attention.sliding_window_pattern"]) == [True, False]
    assert kv["diffusion-gemma.attention.sliding_window"] == SLIDING_WINDOW
    assert (kv["diffusion-gemma.attention.key_length"], kv["diffusion-gemma.attention.key_length_swa"]) == (128, 64)
    assert kv["diffusion-gemma.final_logit_softcapping"] == 30.0
    assert {"blk.0.attn_v.weight", "blk.0.layer_output_scale.weight", "blk.0.enc_layer_output_scale.weight",
            "blk.1.ffn_gate_up_exps.weight", "blk.1.ffn_down_exps.scale", "blk.1.ffn_gate_inp.scale",
            "self_cond_pre_norm.weight", "self_cond_down.weight", "rope_freqs.weight"} <= names
    assert "blk.1.attn_v.weight" not in names and "output.weight" not in names
    assert not any("vision" in n for n in names)
    # Proportional RoPE of the full layer (head 128, a quarter rotated): 16 pairs at 1, 48 left alone.
    m = diffuse.load(gguf_f32, threads=1)
    assert m.arch == "diffusion-gemma"


def _reference_logits(model, context, canvas, self_cond):
    """transformers' canvas logits: the encoder writes the context's cache, the decoder reads it."""
    from transformers import DynamicCache
    with torch.no_grad():
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        model.model.encoder(input_ids=torch.tensor([context]), cache=cache)
        sc = None if self_cond is None else torch.tensor(self_cond[None], dtype=torch.float64)
        out = model(decoder_input_ids=torch.tensor([canvas]), cache=cache, self_conditioning_logits=sc)
    return out.logits[0].double().numpy()


def _steps(run, prompt, rng, n_vocab, temperature=0.8):
    """Three denoising steps on each of two canvases, the second after the first's argmax; the
    self-conditioning is the previous step's logits / temperature, as the official loop feeds it."""
    context, out = list(prompt), []
    for _ in range(2):
        sc = None
        for _ in range(3):
            canvas = rng.integers(0, n_vocab, CANVAS).tolist()
            logits = run(context, canvas, sc)
            out.append(logits)
            sc = (logits / temperature).astype(np.float32)
        context += np.argmax(logits, axis=-1).tolist()
    return out


@pytest.mark.parametrize("flash, kv_f16", [(False, False), (True, True)], ids=["exact", "default"])
def test_canvas_logits_match_transformers(hf_dir, gguf_f32, flash, kv_f16):
    ref = load_reference(hf_dir)
    m = diffuse.load(gguf_f32, threads=2, flash_attn=flash, kv_f16=kv_f16)
    prompt = np.random.default_rng(1).integers(0, m.n_vocab, 3 * SLIDING_WINDOW).tolist()   # past the window
    ours = _steps(lambda c, x, sc: m.forward(c, canvas=x, self_conditioning=sc), prompt,
                  np.random.default_rng(2), m.n_vocab)
    # The reference is fed our self-conditioning logits, so each step compares one forward pass.
    theirs, it = [], iter(ours)
    context = list(prompt)
    rng = np.random.default_rng(2)
    for _ in range(2):
        sc = None
        for _ in range(3):
            canvas = rng.integers(0, m.n_vocab, CANVAS).tolist()
            theirs.append(_reference_logits(ref, context, canvas, sc))
            sc = (next(it) / 0.8).astype(np.float32)
        context += np.argmax(ours[len(theirs) - 1], axis=-1).tolist()
    # Measured (max over the six passes): exact path (F32 K/V, no flash) 9.2e-7, default (flash, F16
    # K/V) 4.2e-4 of the largest logit. transformers' float64 model computes its norms, softmaxes
    # and RoPE angles in float32, so float32 is also the reference's own precision.
    errors = [np.abs(a - b).max() / np.abs(b).max() for a, b in zip(ours, theirs)]
    assert max(errors) < (2e-6 if not kv_f16 else 1e-3), errors


def test_forward_refuses_bad_canvas_input(gguf_f32):
    m = diffuse.load(gguf_f32, threads=1)
    with pytest.raises(DiffuseError, match="one row per canvas position"):
        m.forward([1, 2, 3], canvas=[4, 5], self_conditioning=np.zeros((3, m.n_vocab)))
    with pytest.raises(DiffuseError, match="outside the vocabulary"):
        m.forward([1, 2, 3], canvas=[m.n_vocab])
    with pytest.raises(DiffuseError, match="context and a canvas|canvas"):
        m.forward([1, 2, 3])


def _copy_with(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config, dst)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_convert_refuses_a_vision_checkpoint_without_text_config(hf_dir, tmp_path):
    bad = _copy_with(hf_dir, tmp_path / "bad", lambda c, d: c.pop("text_config"))
    with pytest.raises(DiffuseError, match="no text_config beside its vision_config"):
        convert_hf(bad, tmp_path / "out.gguf", "f32")
    assert not (tmp_path / "out.gguf").exists()


def test_bad_gguf_files_get_one_clear_error(gguf_f32, tmp_path):
    info = gguf_file.read(gguf_f32)
    cases = {
        "canvas length 0": ({"diffusion.canvas_length": 0}, None, "diffusion.canvas_length = 0"),
        "missing canvas key": ({"diffusion.canvas_length": None}, None, "missing key diffusion.canvas_length"),
        "missing pattern": ({"diffusion-gemma.attention.sliding_window_pattern": None}, None,
                            "missing key diffusion-gemma.attention.sliding_window_pattern"),
        "K = V layer with V": ({}, ("blk.0.attn_v.weight", "blk.1.attn_v.weight"), "K = V"),
    }
    for what, (keys, extra, message) in cases.items():
        out = tmp_path / f"{what.replace(' ', '_')}.gguf"
        _rewrite(info, out, keys, extra)
        with pytest.raises(DiffuseError, match=message):
            diffuse.load(out, threads=1)


def _rewrite(info, out: Path, keys: dict, extra: tuple[str, str] | None) -> None:
    """A copy of the file with keys changed (None: removed) and, optionally, a copy of one tensor
    added under another name."""
    kv = {k: v for k, v in info.kv.items() if keys.get(k, 0) is not None and not k.startswith("GGUF.")}
    kv.update({k: v for k, v in keys.items() if v is not None})
    types = {k: info.kv_types[k] for k in kv if k in info.kv_types}
    tensors = list(info.tensors)
    with open(tensors[0].path, "rb") as f:
        blobs = {}
        for t in tensors:
            f.seek(t.offset)
            blobs[t.name] = np.frombuffer(f.read(t.nbytes), np.uint8)
    outs = [gguf_file.OutTensor(t.name, t.type, t.shape) for t in tensors]
    if extra:
        src = next(t for t in tensors if t.name == extra[0])
        outs.append(gguf_file.OutTensor(extra[1], src.type, src.shape))
        blobs[extra[1]] = blobs[extra[0]]
    gguf_file.write(out, kv, types, outs, (blobs[t.name] for t in outs))


def test_generate_refuses_until_the_loop_exists(gguf_f32):
    m = diffuse.load(gguf_f32, threads=1)
    with pytest.raises(DiffuseError, match="uniform-state loop is not in the engine yet"):
        m.generate([1, 2, 3], chat=False, gen_length=16, steps=4)
