"""The engine's few-row output head product (core_cpp/src/head_product.cpp) against the float product of
the same (dequantised) weights and against ggml's mat-mul, per weight type, and the engine forced onto
either head giving the same logits."""
import numpy as np
import pytest
from gguf.quants import dequantize

import diffuse
from diffuse import _core

TYPES = {"Q8_0": 8, "Q4_K": 12, "Q6_K": 14, "F16": 1}


def _weight(rng, m, k, name):
    w = rng.standard_normal((m, k)).astype(np.float32)
    wq = _core.quantize_rows(w, TYPES[name])
    exact = dequantize(wq, TYPES[name]).reshape(m, k).astype(np.float64)   # what the file holds
    return wq, exact


def _rel(a, ref):
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


# Error against the float product of the file's weights, as a fraction of the largest logit. The
# activations are quantised to 8 bits per block of 32 (amax / 127), as ggml's Q8_0 product does:
# measured 0.64% for Q8_0 (ggml 0.65%), 0.69% for Q4_K and 0.57% for Q6_K (ggml, with one scale per
# 256: 0.87% and 0.80%), rows of 896/1024 at 1-32 rows. F16 weights meet F32 activations: 2e-7
# (ggml rounds the activations to F16: 2.2e-4).
LIMIT = {"Q8_0": 8e-3, "Q4_K": 8e-3, "Q6_K": 8e-3, "F16": 1e-5}


@pytest.mark.parametrize("isa", ["cpu", "avx2", "generic"])
@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("k", [256, 512, 288])
def test_head_product_matches_float_product(name, k, isa, monkeypatch):
    """Every instruction set this CPU has (DIFFUSE_HEAD_ISA lowers it); rows of 288 take AVX2's
    32-value steps on an AVX-512 CPU."""
    if name in ("Q4_K", "Q6_K") and k % 256:
        pytest.skip("K types have rows of 256")
    if isa != "cpu":
        monkeypatch.setenv("DIFFUSE_HEAD_ISA", isa)
    rng = np.random.default_rng(k)
    m = 1003   # not a multiple of the threads' 16-row split
    wq, exact = _weight(rng, m, k, name)
    for n in (1, 3, 8, 9, 32):
        x = rng.standard_normal((n, k)).astype(np.float32)
        ref = x.astype(np.float64) @ exact.T
        own = _core.head_matmul(wq, TYPES[name], k, x, own=True, threads=3)
        ggml = _core.head_matmul(wq, TYPES[name], k, x, own=False, threads=3)
        assert own.shape == (n, m)
        assert _rel(own, ref) <= LIMIT[name], (n, _rel(own, ref), _rel(ggml, ref))
        assert _rel(own, ref) <= 1.25 * _rel(ggml, ref)   # never less accurate than ggml's product
        # Each logit is one thread's sum in a fixed order: the same bits at any thread count.
        assert np.array_equal(own, _core.head_matmul(wq, TYPES[name], k, x, own=True, threads=1))


def test_head_product_refuses_what_it_cannot_compute():
    rng = np.random.default_rng(0)
    wq, _ = _weight(rng, 64, 256, "Q8_0")
    with pytest.raises(diffuse.DiffuseError, match="33 rows"):
        _core.head_matmul(wq, TYPES["Q8_0"], 256, np.zeros((33, 256), np.float32), own=True)
    q4 = _core.quantize_rows(np.zeros((64, 256), np.float32), 2)   # Q4_0: ggml's product only
    with pytest.raises(diffuse.DiffuseError, match="no head product for q4_0"):
        _core.head_matmul(q4, 2, 256, np.zeros((2, 256), np.float32), own=True)
    with pytest.raises(diffuse.DiffuseError, match="not 64 rows"):
        _core.head_matmul(wq[:, :-1], TYPES["Q8_0"], 256, np.zeros((2, 256), np.float32), own=True)
    with pytest.raises(diffuse.DiffuseError, match="x is"):
        _core.head_matmul(wq, TYPES["Q8_0"], 256, np.zeros((2, 255), np.float32), own=True)


def test_engine_forced_onto_either_head_gives_the_same_logits(tiny_gguf, monkeypatch):
    path = tiny_gguf("sdar", "q8_0")
    ids = np.arange(3, 19)
    logits = {}
    for head in ("ggml", "own"):
        monkeypatch.setenv("DIFFUSE_HEAD", head)
        model = diffuse.load(path, threads=2, kv_f16=False)
        logits[head] = model.forward(ids)
    assert logits["own"].shape == logits["ggml"].shape
    assert _rel(logits["own"], logits["ggml"]) <= LIMIT["Q8_0"]


def test_a_wrong_head_setting_is_one_clear_error(tiny_gguf, monkeypatch):
    model = diffuse.load(tiny_gguf("sdar", "q8_0"), threads=1)
    monkeypatch.setenv("DIFFUSE_HEAD", "fastest")
    with pytest.raises(diffuse.DiffuseError, match="DIFFUSE_HEAD is 'fastest': expected own, ggml or auto"):
        model.forward(np.arange(3, 7))


def test_auto_choice_gives_exactly_one_of_the_two_heads(tmp_path, monkeypatch):
    """Unforced, the engine times both products on a head past the 16 MiB floor (F16, 16384 x 512)
    and keeps one per row count: its logits are bit for bit those of one forced path."""
    from diffuse.bench.random_models import write_random_sdar
    path = write_random_sdar(tmp_path / "sdar.gguf", n_layer=1, n_embd=512, n_head=4, n_head_kv=2, head_dim=128,
                             n_ff=512, n_vocab=16384, n_ctx=256)
    ids = np.arange(3, 11)
    logits = {}
    for head in ("ggml", "own", "auto"):
        monkeypatch.setenv("DIFFUSE_HEAD", head)
        logits[head] = diffuse.load(path, threads=2, kv_f16=False).forward(ids)
    assert not np.array_equal(logits["own"], logits["ggml"])   # F16: ggml rounds the activations to F16
    assert _rel(logits["own"], logits["ggml"]) <= 1e-3
    assert np.array_equal(logits["auto"], logits["own"]) or np.array_equal(logits["auto"], logits["ggml"])
