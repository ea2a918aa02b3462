"""Every file the loader accepts runs or fails with a clear error; caps on what a caller asks.

Hostile inputs tried here: 3 layer counts at and near the loader's limit (256, 1024 layers; a
batch of 4 over 1024 layers), 6 thread counts, 3 K/V sizes beyond the machine's memory (on machines under 30 GiB)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError
from diffuse.bench.random_models import write_random_llada

TINY = dict(n_embd=16, n_head=2, n_ff=32, n_vocab=64)


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory):
    """1024 layers, the most the loader accepts (a fixed 8192-node graph once aborted at 250+)."""
    return write_random_llada(tmp_path_factory.mktemp("deep") / "deep.gguf", n_layer=1024, n_ctx=1 << 24, **TINY)


@pytest.mark.timeout(300)
def test_the_deepest_file_the_loader_accepts_runs(deep_model):
    m = diffuse.load(deep_model, threads=1)
    assert m.n_layer == 1024
    assert np.isfinite(m.forward([1, 2, 3])).all()
    r = m.generate([1, 2, 3], gen_length=4, steps=2, block_length=4)
    assert r.steps == 2
    batch = m.generate_batch([[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]], gen_length=4, steps=2, block_length=4)
    assert [b.tokens.tolist() for b in batch][0] == r.tokens.tolist()


@pytest.mark.timeout(120)
def test_256_layers(tmp_path):
    m = diffuse.load(write_random_llada(tmp_path / "m.gguf", n_layer=256, n_ctx=64, **TINY))
    assert m.generate([1, 2], gen_length=8, steps=4, block_length=8).steps == 4


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return write_random_llada(tmp_path_factory.mktemp("small") / "m.gguf", n_layer=2, n_ctx=1 << 24, **TINY)


@pytest.mark.parametrize("threads", [10000, 2**31 - 1, 2**40])
def test_thread_counts_are_capped_at_the_logical_cpus(small_model, threads):
    m = diffuse.load(small_model, threads=threads)
    assert m.threads == os.cpu_count()
    r = m.generate([1, 2], gen_length=8, steps=4, block_length=8, threads=threads)
    assert r.steps == 4


@pytest.mark.parametrize("threads", [-1, 2.5, "4"])
def test_bad_thread_counts_are_clear_errors(small_model, threads):
    with pytest.raises(DiffuseError, match="threads must be a non-negative integer"):
        diffuse.load(small_model, threads=threads)
    m = diffuse.load(small_model)
    with pytest.raises(DiffuseError, match="threads must be a non-negative integer"):
        m.generate([1, 2], gen_length=8, steps=4, block_length=8, threads=threads)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gen_length", [1 << 20, 600_000, 1 << 19])
def test_a_cache_beyond_the_machines_memory_is_refused(deep_model, gen_length):
    """A file may claim a huge context; the K/V cache it would need is refused, not overcommitted
    (1024 layers x 16 x 2 x 2 B = 64 KiB per position: 32-64 GiB here)."""
    if os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") > 30 << 30:
        pytest.skip("this machine has the memory for it")
    m = diffuse.load(deep_model)
    with pytest.raises(DiffuseError, match="K/V cache .* more than this machine's memory"):
        m.generate([1, 2], gen_length=gen_length, steps=1, block_length=gen_length)
