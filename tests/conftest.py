"""Shared fixtures: tiny random LLaDA and Dream checkpoints in the real Hugging Face layouts, and
their GGUF conversions (see tests/fixtures/tiny_models.py)."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from fixtures.tiny_models import (write_dream, write_fast_dllm_v2, write_llada, write_llada2, write_llada_moe,
                                  write_nemotron_diffusion, write_sdar)

from diffuse.convert import convert_hf


@pytest.fixture(scope="session")
def tiny_hf_llada(tmp_path_factory) -> Path:
    """LLaDA-8B-Instruct layout, bf16 weights in 2 shards, tokenizer.json."""
    return write_llada(tmp_path_factory.mktemp("hf") / "LLaDA-tiny-Instruct")


@pytest.fixture(scope="session")
def tiny_hf_dream(tmp_path_factory) -> Path:
    """Dream-v0-Instruct-7B layout, float32 weights in 3 shards, vocab.json + merges.txt."""
    return write_dream(tmp_path_factory.mktemp("hf") / "Dream-tiny-Instruct")


@pytest.fixture(scope="session")
def tiny_hf_llada_moe(tmp_path_factory) -> Path:
    """LLaDA-MoE-7B-A1B-Instruct layout (8 experts, top 2), bf16 weights in 2 shards, tokenizer.json."""
    return write_llada_moe(tmp_path_factory.mktemp("hf") / "LLaDA-MoE-tiny-Instruct")


@pytest.fixture(scope="session")
def tiny_hf_sdar(tmp_path_factory) -> Path:
    """JetLM/SDAR-4B-Chat layout (Qwen3, head_dim 128 over a width of 256, block_size 4), bf16 weights
    in 2 shards, tokenizer.json."""
    return write_sdar(tmp_path_factory.mktemp("hf") / "SDAR-tiny-Chat")


@pytest.fixture(scope="session")
def tiny_hf_fast_dllm_v2(tmp_path_factory) -> Path:
    """Efficient-Large-Model/Fast_dLLM_v2_1.5B layout (Qwen2.5 with biases, tied, bd_size 32), bf16
    weights in 2 shards, tokenizer.json."""
    return write_fast_dllm_v2(tmp_path_factory.mktemp("hf") / "Fast_dLLM_v2_tiny")


@pytest.fixture(scope="session")
def tiny_hf_llada2(tmp_path_factory) -> Path:
    """inclusionAI/LLaDA2.1-mini layout (fused QKV, partial RoPE, a dense first layer, 16 experts in 4
    groups with a sigmoid router and expert bias, a shared expert), bf16 weights in 2 shards."""
    return write_llada2(tmp_path_factory.mktemp("hf") / "LLaDA2-tiny-mini")


@pytest.fixture(scope="session")
def tiny_hf_nemotron_diffusion(tmp_path_factory) -> Path:
    """float32 weights: the parity tests compare against a float64 reference."""
    return write_nemotron_diffusion(tmp_path_factory.mktemp("hf") / "nemotron-diffusion", dtype="f32")


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory, request):
    """tiny_gguf("llada" | "dream" | "llada-moe" | "sdar" | "fast-dllm-v2" | "llada2", "f32" | "f16" | "bf16" | "q8_0")
    -> Path of our
    conversion (made once per session; each checkpoint is written on first use)."""
    folder = tmp_path_factory.mktemp("gguf")
    sources = {"llada": "tiny_hf_llada", "dream": "tiny_hf_dream", "llada-moe": "tiny_hf_llada_moe",
               "sdar": "tiny_hf_sdar", "fast-dllm-v2": "tiny_hf_fast_dllm_v2", "llada2": "tiny_hf_llada2",
               "nemotron-diffusion": "tiny_hf_nemotron_diffusion"}
    made: dict[tuple[str, str], Path] = {}

    def make(family: str, outtype: str = "f32") -> Path:
        if (family, outtype) not in made:
            made[family, outtype] = convert_hf(request.getfixturevalue(sources[family]),
                                               folder / f"{family}-{outtype}.gguf", outtype)
        return made[family, outtype]

    return make


# ---- a local stand-in for the Hugging Face hub (tests/fixtures/fake_hub.py) ----

@pytest.fixture
def small_chunks(monkeypatch):
    """Stream in 1 KB chunks (not 10 MB) so that a tiny file arrives in many pieces."""
    from fixtures.fake_hub import CHUNK
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)


@pytest.fixture
def repo_dir(tiny_hf_llada, tmp_path):
    """The tiny checkpoint as a hub repository holds it."""
    folder = tmp_path / "repo"
    shutil.copytree(tiny_hf_llada, folder)
    return folder


@pytest.fixture
def fake_hub(repo_dir, small_chunks):
    from fixtures.fake_hub import REPO, FakeHub
    with FakeHub({REPO: repo_dir}) as server:
        yield server


@pytest.fixture
def gguf_repo(tiny_gguf, tmp_path):
    """A ready-GGUF repository as the hub holds it: one GGUF file (the tiny LLaDA, Q8_0)."""
    from fixtures.fake_hub import GGUF_FILE
    folder = tmp_path / "gguf-repo"
    folder.mkdir()
    shutil.copy(tiny_gguf("llada", "q8_0"), folder / GGUF_FILE)
    return folder


@pytest.fixture
def gguf_hub(gguf_repo, small_chunks):
    from fixtures.fake_hub import GGUF_REPO, FakeHub
    with FakeHub({GGUF_REPO: gguf_repo}) as server:
        yield server


@pytest.fixture
def ready_model(gguf_repo) -> dict:
    """The catalog's LLaDA entry with its ready GGUF pointed at the fake hub's file (size and
    sha256 pinned, as the catalog pins the real one)."""
    from fixtures.fake_hub import GGUF_FILE, GGUF_REPO

    from diffuse import catalog
    data = (gguf_repo / GGUF_FILE).read_bytes()
    model = catalog.find(catalog.load(), "llada-8b-instruct")
    return dict(model, ready_gguf=dict(model["ready_gguf"], repo=GGUF_REPO, file=GGUF_FILE,
                                       file_bytes=len(data),
                                       sha256=hashlib.sha256(data).hexdigest()))
