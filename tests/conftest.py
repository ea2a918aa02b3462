"""Shared fixtures: tiny random LLaDA and Dream checkpoints in the real Hugging Face layouts, and
their GGUF conversions (see tests/fixtures/tiny_models.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fixtures.tiny_models import write_dream, write_llada

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
def tiny_gguf(tmp_path_factory, tiny_hf_llada, tiny_hf_dream):
    """tiny_gguf("llada" | "dream", "f32" | "f16" | "bf16" | "q8_0") -> Path of our conversion
    (made once per session)."""
    folder = tmp_path_factory.mktemp("gguf")
    sources = {"llada": tiny_hf_llada, "dream": tiny_hf_dream}
    made: dict[tuple[str, str], Path] = {}

    def make(family: str, outtype: str = "f32") -> Path:
        if (family, outtype) not in made:
            made[family, outtype] = convert_hf(sources[family], folder / f"{family}-{outtype}.gguf", outtype)
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
