"""models/catalog.json: every entry complete and consistent (LLaDA-MoE among them), the full-attention
models offering a ready GGUF, the block-diffusion ones a checkpoint to convert, and a damaged catalog
refused with the entry and field named."""
from __future__ import annotations

import hashlib
import json

import pytest

import diffuse
from diffuse import DiffuseError, catalog


def test_every_entry_is_complete_and_consistent():
    models = catalog.load()
    ids = [m["id"] for m in models]
    assert len(set(ids)) == len(ids)
    assert {"llada-8b-instruct", "dream-v0-instruct-7b", "llada-moe-7b-a1b-instruct"} <= set(ids)
    for m in models:
        # every checkpoint is bf16; DiffusionGemma's also holds a vision tower diffuse does not convert
        text_bytes = 2 * m["params"]
        assert m["download_bytes"] == text_bytes or \
            (m["family"] == "diffusion-gemma" and text_bytes < m["download_bytes"] < 1.05 * text_bytes)
        assert m["url"] == f"https://huggingface.co/{m['hf_repo']}"
        for need in m["quantizations"].values():
            assert 0 < need["file_gb"] < need["ram_gb"]
        assert abs(m["quantizations"]["f16"]["file_gb"] - text_bytes / 1e9) < 0.05
        gguf = m.get("ready_gguf")
        if gguf is None:                  # block diffusion: no ready GGUF known, converted here
            assert m["family"] in ("sdar", "fast-dllm-v2", "llada2", "nemotron-diffusion", "wedlm", "stable-diffcoder")
            continue
        assert gguf["quantization"] in m["quantizations"] and gguf["file"].endswith(".gguf")
        assert gguf["file_gb"] < gguf["ram_gb"] < gguf["file_gb"] + 2
        assert gguf["file_gb"] * 1e9 < m["download_bytes"] / 3     # the point: 4-5 GB, not 15
        if "file_bytes" in gguf:
            assert abs(gguf["file_bytes"] / 1e9 - gguf["file_gb"]) < 0.05
        assert "suggested" not in m       # a model's settings travel in its file (Model.recipe)


def test_the_mixture_of_experts_model():
    moe = catalog.find(catalog.load(), "llada-moe-7b-a1b-instruct")
    assert (moe["family"], moe["hf_repo"]) == ("llada-moe", "inclusionAI/LLaDA-MoE-7B-A1B-Instruct")
    assert (moe["experts"], moe["experts_per_token"], moe["context_length"]) == (64, 8, 4096)
    assert 7.3e9 < moe["params"] < 7.4e9 and 1.3e9 < moe["active_params"] < 1.5e9
    assert moe["ready_gguf"]["architecture"] == "llada-moe"


BLOCK_MODELS = {   # id: (repository, parameters); every one has a 32768-position context
    "sdar-1.7b-chat": ("JetLM/SDAR-1.7B-Chat", 2_031_739_904),
    "sdar-4b-chat": ("JetLM/SDAR-4B-Chat", 4_411_424_256),
    "sdar-8b-chat": ("JetLM/SDAR-8B-Chat", 8_190_735_360),
    "trado-4b-instruct": ("Gen-Verse/TraDo-4B-Instruct", 4_411_424_256),
    "trado-8b-instruct": ("Gen-Verse/TraDo-8B-Instruct", 8_190_735_360),
    "fast-dllm-v2-1.5b": ("Efficient-Large-Model/Fast_dLLM_v2_1.5B", 1_543_714_304),
    "fast-dllm-v2-7b": ("Efficient-Large-Model/Fast_dLLM_v2_7B", 7_615_616_512),
}


def test_diffusion_gemma_and_unsloths_gguf():
    """The checkpoint and the GGUF Unsloth wrote with PR #24423's converter: no sha256 is known, so
    the download is checked against the pinned size, the hub's sha256 and the header, and says so;
    the figures no primary record confirmed are marked."""
    m = catalog.find(catalog.load(), "diffusiongemma-26b-a4b-it")
    assert (m["family"], m["hf_repo"], m["license"]) == ("diffusion-gemma", "google/diffusiongemma-26B-A4B-it",
                                                         "Apache-2.0")
    assert (m["experts"], m["experts_per_token"], m["context_length"]) == (128, 8, 262144)
    assert 25.2e9 < m["params"] < 25.3e9 and 3.8e9 < m["active_params"] < 3.9e9
    gguf = m["ready_gguf"]
    assert (gguf["repo"], gguf["file"], gguf["architecture"]) == (
        "unsloth/diffusiongemma-26B-A4B-it-GGUF", "diffusiongemma-26B-A4B-it-Q4_K_M.gguf", "diffusion-gemma")
    assert gguf["file_bytes"] == 16_806_810_336 and "sha256" not in gguf
    assert catalog.gguf_size_text(gguf) == "16.81 GB"
    assert catalog.gguf_checks_text(gguf) == ("checked against the size pinned in the catalog, the hub's sha256 "
                                              "(the catalog pins none) and its GGUF header")
    assert {"download_bytes", "ram_gb"} <= set(m["unverified"])


def test_the_block_diffusion_models():
    models = catalog.load()
    for model_id, (repo, params) in BLOCK_MODELS.items():
        m = catalog.find(models, model_id)
        assert (m["hf_repo"], m["params"], m["context_length"]) == (repo, params, 32768)
        assert m["family"] == ("fast-dllm-v2" if model_id.startswith("fast") else "sdar")
        assert "ready_gguf" not in m and m["recommended"] == "q4_k_m"
        for need in m["quantizations"].values():
            assert need["ram_gb"] == round(need["file_gb"] + 1, 1)   # file + 1 GB, as the about says
    # SDAR-4B/8B's checkpoints, as their model.safetensors.index.json gives them
    assert catalog.find(models, "sdar-4b-chat")["download_bytes"] == 8_822_848_512
    assert catalog.find(models, "sdar-8b-chat")["download_bytes"] == 16_381_470_720
    # TraDo is SDAR trained further: the same shapes
    for size in ("4b", "8b"):
        sdar, trado = (catalog.find(models, f"{n}-{size}-{k}")
                       for n, k in (("sdar", "chat"), ("trado", "instruct")))
        assert (sdar["params"], sdar["quantizations"]) == (trado["params"], trado["quantizations"])


# id: (repository, family, licence, parameters, context); the checkpoint is converted here
FAMILIES_2026 = {
    "nemotron-labs-diffusion-8b": ("nvidia/Nemotron-Labs-Diffusion-8B", "nemotron-diffusion",
                                   "NVIDIA Nemotron Open Model License", 8_489_553_920, 262144),
    "nemotron-labs-diffusion-3b": ("nvidia/Nemotron-Labs-Diffusion-3B", "nemotron-diffusion",
                                   "NVIDIA Nemotron Open Model License", 3_831_659_520, 262144),
    "wedlm-8b-instruct": ("tencent/WeDLM-8B-Instruct", "wedlm", "Apache-2.0", 8_190_735_360, 32768),
    "stable-diffcoder-8b-instruct": ("ByteDance-Seed/Stable-DiffCoder-8B-Instruct", "stable-diffcoder", "MIT",
                                     8_250_462_208, 8192),
}


def test_the_2026_families_are_converted_from_their_checkpoints():
    """No ready GGUF exists for Nemotron-Labs-Diffusion, WeDLM or Stable-DiffCoder: each entry is a
    checkpoint to convert, its sizes the rule's (file + 1 GB), and the figures no primary record
    confirmed are named in its unverified member. WeDLM-8B is Qwen3-8B's shapes, as SDAR-8B."""
    models = catalog.load()
    for model_id, (repo, family, licence, params, context) in FAMILIES_2026.items():
        m = catalog.find(models, model_id)
        assert (m["hf_repo"], m["family"], m["license"], m["params"], m["context_length"]) == (
            repo, family, licence, params, context)
        assert "ready_gguf" not in m and m["recommended"] == "q4_k_m"
        for need in m["quantizations"].values():
            assert need["ram_gb"] == round(need["file_gb"] + 1, 1)
        assert m["unverified"] and set(m["unverified"]) <= set(m)
    wedlm, sdar = (catalog.find(models, i) for i in ("wedlm-8b-instruct", "sdar-8b-chat"))
    assert (wedlm["params"], wedlm["quantizations"]) == (sdar["params"], sdar["quantizations"])
    assert "license" in catalog.find(models, "nemotron-labs-diffusion-8b")["unverified"]

def test_the_llada2_models():
    """LLaDA2.1-mini and LLaDA2.0-mini: block-diffusion MoE, no ready GGUF (converted here), the
    shapes of LLaDA2.1-mini's config.json (16.26B parameters, 256 experts, 8 per token)."""
    import numpy as np

    from diffuse import gguf_file
    from diffuse.bench.moe_block import tensor_shapes
    from diffuse.quantize import tensor_type

    models = catalog.load()
    shapes = tensor_shapes(20)
    params = sum(int(np.prod(s)) for s in shapes.values())
    q4 = sum(gguf_file.OutTensor(n, 0 if n.endswith(("ffn_gate_inp.weight", ".bias")) else
                                 int(tensor_type(n, s, "Q4_K_M", 20, True, 256)), s).nbytes
             for n, s in shapes.items())
    for model_id, repo in (("llada2.1-mini", "inclusionAI/LLaDA2.1-mini"), ("llada2.0-mini", "inclusionAI/LLaDA2.0-mini")):
        m = catalog.find(models, model_id)
        assert (m["family"], m["hf_repo"], m["license"]) == ("llada2", repo, "Apache-2.0")
        assert (m["params"], m["experts"], m["experts_per_token"], m["context_length"]) == (params, 256, 8, 32768)
        assert 1.0e9 < m["active_params"] < 1.2e9
        assert "ready_gguf" not in m and m["recommended"] == "q4_k_m"
        assert abs(m["quantizations"]["q4_k_m"]["file_gb"] - q4 / 1e9) < 0.05      # diffuse's own Q4_K_M plan
        for need in m["quantizations"].values():
            assert need["ram_gb"] == round(need["file_gb"] + 1, 1)


def test_the_demo_entry_describes_the_shipped_file_and_its_settings_are_in_the_file():
    path, entry = catalog.demo()
    data = path.read_bytes()
    assert (entry["file_bytes"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert "suggested" not in entry
    model = diffuse.load(path, threads=1)
    assert (model.arch, model.n_ctx_train) == (entry["family"], entry["context_length"])
    # the model card's settings (models/README.md): greedy decoding loops on this model
    assert model.recipe == {"gen_length": 64, "steps": 64, "block_length": 16, "temperature": 0.7}


def test_unknown_model_is_named():
    with pytest.raises(DiffuseError, match="no model 'nope'.*llada-8b-instruct"):
        catalog.find(catalog.load(), "nope")


def _damage(entry: dict, how: str) -> None:
    gguf = entry["ready_gguf"]
    if how == "missing field":
        del entry["hf_repo"]
    elif how == "wrong type":
        entry["params"] = "8B"
    elif how == "bool as number":
        gguf["file_gb"] = True
    elif how == "recommended unknown":
        entry["recommended"] = "q2_k"
    elif how == "quantization without RAM":
        del entry["quantizations"]["f16"]["ram_gb"]
    elif how == "gguf field missing":
        del gguf["architecture"]
    elif how == "gguf in a subfolder":
        gguf["file"] = "../evil.gguf"
    elif how == "not a gguf":
        gguf["file"] = "model.safetensors"
    elif how == "bad sha256":
        gguf["sha256"] = "ABC"
    elif how == "gguf quantization unknown":
        gguf["quantization"] = "iq2_xs"
    elif how == "unverified names nothing":
        entry["unverified"] = ["ready_gguf.checksum"]


DAMAGES = ["missing field", "wrong type", "bool as number", "recommended unknown",
           "quantization without RAM", "gguf field missing",
           "gguf in a subfolder", "not a gguf", "bad sha256", "gguf quantization unknown", "unverified names nothing"]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_entry_is_refused_with_its_name(tmp_path, how):
    data = json.loads(catalog.default_path().read_text())
    _damage(data["models"][1], how)
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DiffuseError, match=f"catalog.json: {data['models'][1]['id']}: "):
        catalog.load(path)


@pytest.mark.parametrize("text", ["", "{}", '{"models": 3}', '{"models": [7]}'])
def test_an_unreadable_catalog_is_refused(tmp_path, text):
    path = tmp_path / "catalog.json"
    path.write_text(text)
    with pytest.raises(DiffuseError, match="catalog.json: "):
        catalog.load(path)
