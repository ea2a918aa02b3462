"""DiffusionGemma's files: a checkpoint whose tokenizer is in Gemma 4's own format, our conversion
of it, and the GGUF llama.cpp PR #24423's converter writes for it (Unsloth's GGUFs: Gemma 4's
vocabulary as llama.cpp arrays, no tokenizer.json; fixtures/tiny_diffusion_gemma.write_pr_gguf);
image inputs refused with one clear error; damaged files and vocabularies refused likewise."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.convert import convert_hf
from diffuse.tokenizer import Tokenizer

pytest.importorskip("torch")
pytest.importorskip("transformers.models.diffusion_gemma")

from fixtures.tiny_diffusion_gemma import CANVAS, with_keys, write_diffusion_gemma, write_pr_gguf  # noqa: E402

TEXTS = ["The river ran past the old mill.", "  two  spaces, and\n\n\nthree newlines\n", "zq€ 東京 ✓ emoji 🙂",
         "tabs\tand trailing space ", "<turn|> typed by a user", "", "\n", "a" * 300]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return write_diffusion_gemma(tmp_path_factory.mktemp("dg_files") / "hf", gemma_vocab=True)


@pytest.fixture(scope="module")
def ours(hf_dir, tmp_path_factory) -> Path:
    return convert_hf(hf_dir, tmp_path_factory.mktemp("dg_ours") / "tiny-f32.gguf", "f32")


@pytest.fixture(scope="module")
def pr_file(ours, tmp_path_factory) -> Path:
    return write_pr_gguf(ours, tmp_path_factory.mktemp("dg_pr") / "diffusiongemma-tiny-F32.gguf")


def test_convert_embeds_gemma4_vocabulary_and_template(hf_dir, ours):
    kv = gguf_file.read(ours).kv
    assert kv["tokenizer.ggml.model"] == "gemma4" and "tokenizer.ggml.pre" not in kv
    assert kv["tokenizer.chat_template"] == (hf_dir / "chat_template.jinja").read_text()
    assert kv["diffusion.eb_max_steps"] == 48 and kv["diffusion-gemma.attention.shared_kv_layers"] == 0
    tokens, types = kv["tokenizer.ggml.tokens"], list(kv["tokenizer.ggml.token_type"])
    assert types[tokens.index("<0x41>")] == 6 and types[tokens.index("<turn|>")] == 3
    tok = diffuse.load(ours, threads=1).tokenizer
    ids = tok.encode_chat("Hello river")
    assert ids[:2] == [tok.bos_token_id, tok.token_to_id("<|turn>")] and tok.token_to_id("<turn|>") in ids


def test_llama_cpp_gemma4_arrays_tokenize_as_the_hf_tokenizer(hf_dir, pr_file):
    """The tokenizer rebuilt from the PR file's arrays gives the ids and text of the tokenizer.json
    it came from (transformers' GemmaTokenizer, the format google ships)."""
    from tokenizers import Tokenizer as HF
    hf = HF.from_file(str(hf_dir / "tokenizer.json"))
    hf.encode_special_tokens = True     # as our encode: a special token's string typed is text
    tok = Tokenizer.for_model(pr_file)
    assert tok.source == "llama.cpp vocabulary (pre-tokenizer gemma4)"
    for text in TEXTS:
        want = hf.encode(text, add_special_tokens=True).ids
        assert tok.encode(text, add_special_tokens=True) == want, text
        assert tok.decode(want, skip_special_tokens=True) == hf.decode(want, skip_special_tokens=True)
    assert tok.bos_token_id == 2 and set(tok.eos_token_ids) == {1, tok.token_to_id("<turn|>")}
    assert tok.mask_token_id == 4


def test_the_pr_file_runs_in_the_library_cli_and_server(ours, pr_file):
    m = diffuse.load(pr_file, threads=2)
    assert m.arch == "diffusion-gemma"
    want = {k: v for k, v in diffuse.load(ours, threads=1).recipe.items() if k != "gen_length"}
    assert m.recipe == want      # its diffusion.eb_* keys (the PR writes no answer length)
    a = m.generate("Tell me about the river", gen_length=CANVAS, steps=3, seed=4)
    b = diffuse.load(ours, threads=2).generate("Tell me about the river", gen_length=CANVAS, steps=3, seed=4)
    assert (a.tokens == b.tokens).all() and a.text == b.text and a.prompt_tokens.tolist() == b.prompt_tokens.tolist()

    run = [sys.executable, "-m", "diffuse.cli"]
    info = subprocess.run(run + ["info", str(pr_file)], capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert "diffusion-gemma" in info.stdout
    gen = subprocess.run(run + ["generate", "-m", str(pr_file), "-p", "Tell me about the river", "--quiet",
                                "--gen-length", str(CANVAS), "--steps", "3", "--seed", "4", "--threads", "1"],
                         capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.strip() == a.text.strip()

    import openai
    from diffuse.serve import Server
    s = Server(m, port=0, api_key="k", max_batch=4)
    s.start()
    try:
        client = openai.OpenAI(base_url=s.url, api_key="k", max_retries=0, timeout=60)
        out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Tell me about the river"}],
                                             max_tokens=CANVAS, extra_body={"steps": 3, "seed": 4})
        assert out.choices[0].message.content == a.text
        with pytest.raises(openai.BadRequestError, match=r"content\[1\] is an image .*text models only"):
            client.chat.completions.create(model="m", max_tokens=CANVAS, messages=[{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}])
        image = m.tokenizer.token_to_id("<|image|>")
        with pytest.raises(openai.BadRequestError, match="is an image token"):
            client.completions.create(model="m", prompt=[2, 5, image, 6], max_tokens=CANVAS)
    finally:
        s.stop()


@pytest.mark.parametrize("which", ["ours", "pr_file"])
def test_image_tokens_in_a_prompt_are_refused(which, request):
    m = diffuse.load(request.getfixturevalue(which), threads=1)
    image = m.tokenizer.token_to_id("<|image|>")
    assert image in m.image_token_ids
    with pytest.raises(DiffuseError, match=f"token id {image} at index 1 is an image token: .*text model only"):
        m.generate([2, image, 5], chat=False, gen_length=CANVAS, steps=2)
    # Typed as text, the image token's string is text, not the token.
    assert image not in m.encode_prompt("look: <|image|>")


def _rewrite(src: Path, out: Path, keys: dict) -> Path:
    """A copy of `src` with keys changed (None: removed)."""
    info = gguf_file.read(src)
    kv = {k: v for k, v in info.kv.items() if keys.get(k, 0) is not None and not k.startswith("GGUF.")}
    types = {k: info.kv_types[k] for k in kv}
    for k, v in keys.items():
        if v is not None:
            kv[k], types[k] = v
    return with_keys(src, out, kv, types)


def test_contradictory_pr_keys_get_one_clear_error(pr_file, tmp_path):
    cases = {
        "shared kv": ({"diffusion-gemma.attention.shared_kv_layers": (2, "u32")}, "shared_kv_layers is not 0"),
        "per-layer input": ({"diffusion-gemma.embedding_length_per_layer_input": (256, "u32")},
                            "embedding_length_per_layer_input is not 0"),
        "kv heads": ({"diffusion-gemma.attention.head_count_kv": ([2, 1, 1], "array[i32]")}, "expected 2"),
        "no sliding window": ({"diffusion-gemma.attention.sliding_window": None}, "missing key"),
    }
    for what, (keys, message) in cases.items():
        out = _rewrite(pr_file, tmp_path / f"{what.replace(' ', '_')}.gguf", keys)
        with pytest.raises(DiffuseError, match=message):
            diffuse.load(out, threads=1)
    bad = _rewrite(pr_file, tmp_path / "bad_sampler.gguf", {"diffusion.eb_max_steps": (0, "u32")})
    with pytest.warns(Warning, match="recipe is ignored"):
        m = diffuse.load(bad, threads=1)
    assert m.recipe == {}


def test_damaged_gemma4_vocabularies_get_one_clear_error(pr_file, tmp_path):
    kv = gguf_file.read(pr_file).kv
    tokens, merges = list(kv["tokenizer.ggml.tokens"]), list(kv["tokenizer.ggml.merges"])
    no_bytes = [t if t != "<0x41>" else "<0xZZ>" for t in tokens]
    cases = {
        "unknown model": ({"tokenizer.ggml.model": ("gemma5", "str")}, "tokenizer model 'gemma5' is not supported"),
        "no merges": ({"tokenizer.ggml.merges": None}, "malformed tokenizer.ggml"),
        "merge of nothing": ({"tokenizer.ggml.merges": (merges + ["nope zilch"], "array[str]")}, "inconsistent"),
        "merge without a space": ({"tokenizer.ggml.merges": (merges + ["nospace"], "array[str]")}, "malformed merge"),
        "short types": ({"tokenizer.ggml.token_type": (list(kv["tokenizer.ggml.token_type"])[:-1], "array[i32]")},
                        "malformed tokenizer.ggml"),
        "no byte tokens": ({"tokenizer.ggml.tokens": (no_bytes, "array[str]")}, "256 byte tokens"),
    }
    for what, (keys, message) in cases.items():
        out = _rewrite(pr_file, tmp_path / f"{what.replace(' ', '_')}.gguf", keys)
        m = diffuse.load(out, threads=1)
        with pytest.raises(DiffuseError, match=message):
            m.generate("Tell me about the river", gen_length=CANVAS, steps=2)
    assert json.loads(json.dumps(sorted(p.name for p in tmp_path.iterdir()))) == sorted(
        f"{w.replace(' ', '_')}.gguf" for w in cases)   # nothing else written
