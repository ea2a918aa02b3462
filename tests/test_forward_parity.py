"""Engine logits == float64 reference logits (tests/reference/forward.py) on every position, for
both families and every weight type.

Two comparisons:
- against the reference on the Hugging Face checkpoint itself: what a user gets end to end
  (conversion included);
- against the reference on the weights the GGUF file holds (dequantized by the gguf package's
  numpy code): what the engine's arithmetic adds on top of the weight rounding.

Error = max |engine - reference| / max |reference| over all positions and the whole vocabulary
(the logits have std ~1, max ~4). A wrong permutation, rope mode, GQA grouping or bias gives
errors of order 1, far above every limit.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from reference.forward import forward as reference_forward
from reference.forward import load as reference_load

import diffuse
from diffuse import gguf_file
from diffuse.convert.families import DREAM, LLADA, qk_row_order
from diffuse.quantize import quantize_file

# End to end. Measured (LLaDA / Dream, 24 positions): f32 4.3e-7 / 4.2e-7, f16 7.6e-4 / 1.1e-3,
# bf16 6.0e-3 / 1.0e-2, q8_0 3.1e-2 / 2.9e-2. These random tiny models amplify a relative
# perturbation of the weights about 6-8x by the logits, hence the limits of the rounded types.
LIMITS = {
    # float32 everywhere; rounding in sums over 256-768 terms is ~1e-6.
    "f32": 1e-5,
    # f16 weights (2^-11 relative rounding), and ggml rounds the activations to f16 for the dot product.
    "f16": 5e-3,
    # bf16 keeps 8 bits of mantissa (2^-8 rounding), weights and activations alike: 8x f16's error.
    "bf16": 3e-2,
    # 8-bit blocks of 32 with one scale (~0.5% rms per weight); ggml quantizes the activations to
    # Q8_0 for the dot product too.
    "q8_0": 8e-2,
}

# Attention configurations: flash attention with the F16 K/V cache (the default), with an F32
# cache, and the materialised-score path. An F32 cache keeps the limits above (measured 5.9e-7 /
# 6.3e-7 for f32 weights, flash or not). The F16 cache rounds K and V to 2^-11 and ggml's flash
# kernel accumulates V in F16 for short batches: measured 1.6e-3 / 1.4e-3 with f32 weights at 24
# positions (4.1e-4 / 4.2e-4 at 100, where the tiled kernel accumulates in F32), 1.6e-3 / 1.9e-3
# with f16 weights. llama.cpp's F16 flash path: ~6e-4 against an F64 reference.
ATTENTION = {
    "flash-f16kv": dict(flash_attn=True, kv_f16=True),
    "flash-f32kv": dict(flash_attn=True, kv_f16=False),
    "plain-f32kv": dict(flash_attn=False, kv_f16=False),
}
KV_F16_LIMIT = 5e-3


def limit(outtype: str, attention: str) -> float:
    return max(LIMITS[outtype], KV_F16_LIMIT) if ATTENTION[attention]["kv_f16"] else LIMITS[outtype]


# Engine on the file's own weights: only the activation rounding of ggml's dot products remains
# (f16 for F16, bf16 for BF16, 8-bit blocks for Q8_0 and the k-quants). Measured (LLaDA / Dream):
# f16 7.6e-4 / 6.4e-4, bf16 6.0e-3 / 5.4e-3, q8_0 2.0e-2 / 1.9e-2, Q4_K_M 2.7e-2 / 3.6e-2
# (against the checkpoint Q4_K_M is 0.31 / 0.28: 4-bit weights, amplified as above).
FILE_LIMITS = {"f16": 3e-3, "bf16": 2e-2, "q8_0": 6e-2, "Q4_K_M": 6e-2}


def token_ids(model: diffuse.Model, n: int = 24) -> np.ndarray:
    """Random ids over the tokenizer's vocabulary, with the mask token in a few places."""
    ids = np.random.default_rng(7).integers(0, model.mask_token_id + 1, n)
    ids[[3, 10, 11, 20]] = model.mask_token_id
    return ids


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("attention", list(ATTENTION))
@pytest.mark.parametrize("outtype", list(LIMITS))
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_logits_match_reference(family, outtype, attention, tiny_gguf, request):
    model = diffuse.load(tiny_gguf(family, outtype), threads=2, **ATTENTION[attention])
    ids = token_ids(model)
    got = model.forward(ids)
    want = reference_forward(request.getfixturevalue(f"tiny_hf_{family}"), ids)
    err = relative_error(got, want)
    assert err < limit(outtype, attention), f"{family} {outtype} {attention}: relative error {err:.2e}"
    if outtype == "f32" and not ATTENTION[attention]["kv_f16"]:
        assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("attention", list(ATTENTION))
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_short_and_long_sequences_match_reference(family, attention, tiny_gguf, request):
    """Every length is its own bidirectional problem (no cache state carried over); 100 positions
    take the flash kernel's tiled path, 1 and 5 its per-row path."""
    model = diffuse.load(tiny_gguf(family, "f32"), threads=1, **ATTENTION[attention])
    hf_dir = request.getfixturevalue(f"tiny_hf_{family}")
    for n in (1, 5, 100):
        ids = np.resize(token_ids(model), n)
        err = relative_error(model.forward(ids), reference_forward(hf_dir, ids))
        assert err < limit("f32", attention), f"{family} {attention} n={n}: relative error {err:.2e}"


def file_weights(path, hf_dir) -> dict[str, np.ndarray]:
    """The GGUF file's tensors, dequantized, under their Hugging Face names and row order."""
    info = gguf_file.read(path)
    family = {"llada": LLADA, "dream": DREAM}[info.kv["general.architecture"]]
    n_layer = info.kv[f"{family.arch}.block_count"]
    hf_names = {pattern.format(i=i): hf.format(i=i) for pattern, hf in family.tensors.items()
                for i in range(n_layer)}
    _, weights = reference_load(str(hf_dir))
    weights = dict(weights)
    for t in info.tensors:
        x = dequantize(np.asarray(t.raw()), GGMLQuantizationType(t.type)).reshape(t.shape[::-1])
        if family.permute_qk and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = info.kv[f"llada.attention.head_count{'' if 'attn_q' in t.name else '_kv'}"]
            x = x[np.argsort(qk_row_order(x.shape[0], heads))]
        weights[hf_names[t.name]] = x.astype(np.float64)
    return weights


@pytest.mark.parametrize("wtype", list(FILE_LIMITS))
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_logits_match_reference_on_file_weights(family, wtype, tiny_gguf, request, tmp_path):
    if wtype == "Q4_K_M":
        path = quantize_file(tiny_gguf(family, "f32"), tmp_path / "q4_k_m.gguf", "Q4_K_M")
    else:
        path = tiny_gguf(family, wtype)
    hf_dir = request.getfixturevalue(f"tiny_hf_{family}")
    model = diffuse.load(path, threads=2)
    ids = token_ids(model)
    err = relative_error(model.forward(ids), reference_forward(hf_dir, ids, file_weights(path, hf_dir)))
    assert err < FILE_LIMITS[wtype], f"{family} {wtype}: relative error {err:.2e}"
