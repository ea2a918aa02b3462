"""Weights repacked into ggml's interleaved layout give the logits of the mapped weights."""
import numpy as np

import diffuse


def test_repacked_q8_0_matches_mapped(tiny_gguf):
    path = tiny_gguf("llada", "q8_0")
    mapped = diffuse.load(path, threads=2)
    packed = diffuse.load(path, threads=2, repack=True)
    assert mapped.repacked_bytes == 0
    ids = np.arange(1, 40) % mapped.n_vocab
    a, b = mapped.forward(ids), packed.forward(ids)
    # Both paths quantise the activations and use integer dot products; only the summation order
    # may differ, so the limit is float rounding, not quantisation error.
    assert np.max(np.abs(a - b)) <= 1e-3 * np.max(np.abs(a))
