"""Weights repacked into ggml's interleaved layout give the logits of the mapped weights."""
import numpy as np

import diffuse
from diffuse.quantize import quantize_file


def test_repacked_q4_0_matches_mapped(tiny_gguf, tmp_path):
    path = tmp_path / "llada-q4_0.gguf"
    quantize_file(tiny_gguf("llada", "f32"), path, "Q4_0")
    # F32 K/V cache: F16 rounding of K/V would turn the last-bit differences into Q8_0 rounding
    # flips downstream (1.4% on this tiny random model), hiding what is compared here.
    mapped = diffuse.load(path, threads=2, kv_f16=False)
    packed = diffuse.load(path, threads=2, repack=True, kv_f16=False)
    assert mapped.repacked_bytes == 0 and packed.repacked_bytes > 0
    ids = np.arange(1, 40) % mapped.n_vocab
    a, b = mapped.forward(ids), packed.forward(ids)
    # Both paths quantise the activations to Q8_0 and use integer dot products; only the summation
    # order differs, so the limit is float rounding, not quantisation error.
    assert np.max(np.abs(a - b)) <= 1e-3 * np.max(np.abs(a))
