"""Stable-DiffCoder (ByteDance-Seed): conversion of its Hugging Face layout, logits against the
float64 reference (itself checked against transformers' LlamaForCausalLM under the block-causal
mask in tests/test_block_reference.py), and its generate_block against a port of it
(tests/reference/block_generate.py), on a tiny random checkpoint; its answer through the CLI, the
server, batches and cancel."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
from gguf import GGUFReader
from fixtures.tiny_models import write_stable_diffcoder
from reference import block_generate as bg
from reference.forward import forward, load

import diffuse
from diffuse import DiffuseError, _core, gguf_file
from diffuse.convert import convert_hf
from diffuse.convert.families import qk_row_order

PROMPTS = {8: [5 * t % 400 + 3 for t in range(8)], 13: [7 * t % 400 + 1 for t in range(13)],
           14: [11 * t % 400 + 2 for t in range(14)]}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return write_stable_diffcoder(tmp_path_factory.mktemp("sdc") / "Stable-DiffCoder-tiny-Instruct", dtype="f32")


@pytest.fixture(scope="module")
def gguf(hf, tmp_path_factory):
    return convert_hf(hf, tmp_path_factory.mktemp("sdc-gguf") / "sdc.gguf", "f32")


@pytest.fixture(scope="module")
def model(gguf):
    """F32 weights and K/V, no flash attention: the parity runs."""
    return diffuse.load(gguf, threads=2, flash_attn=False, kv_f16=False)


# ---- conversion ----

def test_convert_reads_the_real_layout(hf, gguf):
    kv = gguf_file.read(gguf).kv
    tensors = {t.name: np.asarray(t.data) for t in GGUFReader(str(gguf)).tensors}
    assert kv["general.architecture"] == "stable-diffcoder"
    assert kv["diffusion.block_size"] == 4 and kv["tokenizer.ggml.mask_token_id"] == 5   # generate_block's defaults
    assert kv["stable-diffcoder.rope.freq_base"] == 500000.0
    # The model card's decoding: 512 steps over 512 tokens in blocks of 4, low_confidence, greedy.
    assert {k.removeprefix("diffuse.recipe."): v for k, v in kv.items() if k.startswith("diffuse.recipe.")} == {
        "gen_length": 512, "block_length": 4, "steps": 4, "scheduler": "low_confidence_static", "temperature": 0.0}
    _, w = load(str(hf))
    # q/k rows permuted as llama.cpp's llama converter does (NORM RoPE), GQA's k over its KV heads.
    q = tensors["blk.1.attn_q.weight"]
    k = tensors["blk.1.attn_k.weight"]
    assert np.array_equal(q, w["model.layers.1.self_attn.q_proj.weight"][qk_row_order(256, 4)])
    assert np.array_equal(k, w["model.layers.1.self_attn.k_proj.weight"][qk_row_order(128, 2)])
    assert np.array_equal(tensors["output.weight"], w["lm_head.weight"])
    m = diffuse.load(gguf)
    assert m.arch == "stable-diffcoder" and m.family == "sdar"
    assert m.mask_token_id == 5 and m.hparams["block_size"] == 4
    assert m.tokenizer.eos_token_ids[0] == m.tokenizer.encode_with_special_tokens("<[end\u2581of\u2581sentence]>")[0]


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(attention_bias=True), "attention_bias = True"),
    (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
    (lambda c: c.pop("num_attention_heads"), "missing 'num_attention_heads'"),
])
def test_unsupported_configs_are_refused(tmp_path, edit, message):
    hf = write_stable_diffcoder(tmp_path / "hf", n_layers=1, config_edit=edit)
    out = tmp_path / "out.gguf"
    with pytest.raises(DiffuseError, match=message):
        convert_hf(hf, out)
    assert not out.exists()


# ---- logits (the float64 reference is transformers' LlamaForCausalLM: tests/test_block_reference.py) ----

def test_engine_logits_match_float64(hf, gguf, model):
    """Block-causal in blocks of 4 from position 0: within 1e-5 of float64 (relative to the largest
    logit) with F32 weights and K/V, no flash attention; within 5e-3 with the default F16 K/V cache
    and flash attention (its rounding)."""
    ids = PROMPTS[13] + [9, 4, 77, 200, 31, 6]                   # 19 positions: ends inside a block
    want = forward(hf, ids)
    err = np.abs(model.forward(np.array(ids, np.int32)) - want).max() / np.abs(want).max()
    assert err < 1e-5, err
    default = diffuse.load(gguf, threads=2)
    err = np.abs(default.forward(np.array(ids, np.int32)) - want).max() / np.abs(want).max()
    assert err < 5e-3, err


# ---- the loop against the port of generate_block ----

class EngineLogits:
    """The port's model interface over the engine's forward: every pass recomputes 0..b1-1."""

    def __init__(self, model):
        self.model = model

    def logits(self, x, b0, b1):
        return self.model.forward(np.array(x[:b1], np.int32))[b0:b1].astype(np.float64)

    store = logits


@pytest.mark.parametrize("n_prompt", [8, 13, 14])
@pytest.mark.parametrize("steps, threshold", [(4, None), (3, None), (2, None), (1, None), (4, 0.2)])
@pytest.mark.parametrize("driver", ["engine forward", "float64"])
def test_generation_is_generate_block(hf, model, n_prompt, steps, threshold, driver):
    """Commit for commit (every pass's positions and tokens) the port of the official loop: the
    prompt's tail shares the first block, whose steps share its masks (not its length), the last
    block is cut at gen_length; one token per step at the card's 4 steps per block."""
    prompt = PROMPTS[n_prompt]
    driven = EngineLogits(model) if driver == "engine forward" else bg.Cached(hf, 4)
    eos = model.tokenizer.eos_token_ids[0]
    want = bg.stable_diffcoder_generate(driven, prompt, 5, 24, 4, steps * 6, threshold, eos)
    options = dict(scheduler="confidence_threshold", confidence_threshold=threshold) if threshold else {}
    events = []
    got = model.generate(prompt, gen_length=24, steps=steps, chat=False, on_step=events.append, **options)
    assert len(got.tokens) == 24                                   # exactly gen_length: the last block cut
    assert got.tokens[:len(want.tokens)].tolist() == want.tokens
    assert set(got.tokens[len(want.tokens):].tolist()) <= {eos}
    denoise = [commits for kind, commits in want.passes if kind == "denoise"]
    assert [[(p, int(got_tok)) for p, got_tok in zip(e.unmasked.tolist(), e.tokens[e.unmasked].tolist())]
            for e in events] == denoise
    assert max(e.block_end for e in events) <= n_prompt + 24


def test_end_of_text_ends_the_answer_as_generate_block_does(model):
    """A token the answer holds taken as end-of-text: the port stops after the block holding it and
    cuts the answer there; the engine's answer is the same, padded with it."""
    def run(eos_ids):
        options = diffuse.generation.resolve_options(model.arch, model.recipe, gen_length=24)
        return _core.generate_batch(model._core, [np.array(PROMPTS[13], np.int32)], options=[options], threads=2,
                                    eos_ids=eos_ids, on_step=None, expert_routing=False)[0]
    stop = int(run([])["tokens"][9])
    want = bg.stable_diffcoder_generate(EngineLogits(model), PROMPTS[13], 5, 24, 4, 24, None, stop)
    got = run([stop])
    assert got["stop_reason"] == "eos" and len(want.tokens) < 24
    assert got["tokens"].tolist() == want.tokens + [stop] * (24 - len(want.tokens))


def test_context_is_checked(model):
    with pytest.raises(DiffuseError, match="exceeds the model's context of 8192"):
        model.generate(PROMPTS[8], gen_length=8190, chat=False)


# ---- batches, cancel, the CLI and the server ----

def test_batches_give_the_tokens_of_single_runs(model):
    prompts = list(PROMPTS.values())
    single = [model.generate(p, gen_length=18, chat=False).tokens.tolist() for p in prompts]
    batch = model.generate_batch(prompts, gen_length=18, chat=False)
    assert [r.tokens.tolist() for r in batch] == single


def test_cancel_stops_at_the_step(model):
    seen = []
    result = model.generate(PROMPTS[13], gen_length=24, chat=False, on_step=lambda e: seen.append(e) or len(seen) < 3)
    assert result.stop_reason == "cancelled" and result.steps == 3


def test_a_quantised_file_keeps_the_recipe_and_decodes(gguf, tmp_path):
    from diffuse.quantize import quantize_file
    q8 = diffuse.load(quantize_file(gguf, tmp_path / "q8.gguf", "q8_0"), threads=2)
    assert q8.arch == "stable-diffcoder" and q8.mask_token_id == 5 and q8.recipe["block_length"] == 4
    assert len(q8.generate(PROMPTS[13], gen_length=10, chat=False).tokens) == 10


def test_cli_generates_with_the_recipe(gguf, capsys):
    from diffuse.cli import main
    assert main(["generate", "-m", str(gguf), "-p", "def add(a, b):", "--gen-length", "12", "--quiet",
                 "--threads", "1"]) == 0
    assert capsys.readouterr().out.strip()


def test_server_answers(gguf):
    from diffuse.serve import Server
    m = diffuse.load(gguf, threads=1)
    server = Server(m, port=0, api_key=None, max_batch=4)
    server.start()
    try:
        body = json.dumps({"model": "sdc", "messages": [{"role": "user", "content": "Write add."}],
                           "max_tokens": 10}).encode()
        request = urllib.request.Request(server.url + "/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            answer = json.loads(r.read())
        assert answer["usage"]["completion_tokens"] <= 10
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        server.stop()
