"""The modes over one causal K/V cache (core_cpp/src/loops/causal.cpp): AR, self-speculation and
Nemotron-Labs-Diffusion's diffusion mode; Nemotron-Labs-Diffusion's conversion and graph.

Parity: the engine's logits against transformers in float64 (tests/reference/nemotron.py), its
loops against ports of the official ones. Losslessness: self_spec gives mode ar's answer, token for
token, on every prompt, draft length and temperature tried."""
from __future__ import annotations

import json

import numpy as np
import pytest
from fixtures.tiny_models import agreeable_head, write_nemotron_diffusion

import diffuse
from diffuse import DiffuseError
from diffuse.convert import convert_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from reference import nemotron as ref  # noqa: E402  (needs torch)

# f32 weights; the default F16 K/V cache rounds K and V to 2^-11 (tests/test_forward_parity.py's
# KV_F16_LIMIT). Measured: see the asserts' messages.
LIMIT = 5e-3
PROMPTS = [[5, 17, 3, 250, 91], [300, 12, 12, 8, 77, 140, 2, 64, 33, 9, 210], [42]]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.fixture(scope="module")
def nemotron(tiny_gguf):
    return diffuse.load(str(tiny_gguf("nemotron-diffusion", "f32")))


@pytest.fixture(scope="module")
def nemotron_ref(tiny_hf_nemotron_diffusion):
    return ref.Reference(tiny_hf_nemotron_diffusion)


def same_answer(got, want: list[int], eos: int) -> bool:
    """The engine's answer pads with end-of-text after the first; the ports stop there."""
    got = [int(t) for t in got]
    return got[:len(want)] == want and set(got[len(want):]) <= {eos}


def ids(n: int, seed: int = 0) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, 400, n)]


# ---- the reference itself ----

def test_float64_yarn_is_transformers_yarn(tiny_hf_nemotron_diffusion):
    """Our float64 YaRN frequencies and attention factor are transformers' own (computed in float32)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = json.loads((tiny_hf_nemotron_diffusion / "config.json").read_text())
    for mscale in ({"mscale": 1.0, "mscale_all_dim": 1.0}, {}):
        rope = {k: v for k, v in config["rope_parameters"].items() if k not in ("mscale", "mscale_all_dim")} | mscale
        cfg = transformers.Ministral3Config(**{**config, "rope_parameters": rope})
        want, want_attn = ROPE_INIT_FUNCTIONS["yarn"](cfg)
        got, attn = ref.yarn_inv_freq(cfg.rope_parameters, cfg.head_dim)
        assert np.allclose(got.numpy(), want.numpy(), rtol=1e-6) and attn == pytest.approx(want_attn)


# ---- Nemotron-Labs-Diffusion: conversion and forward ----

@pytest.mark.parametrize("mode,open_block", [("ar", 0), ("diffusion", 8), ("diffusion", 40)])
def test_nemotron_forward_matches_ministral3(tmp_path, tiny_hf_nemotron_diffusion, nemotron_ref, mode, open_block):
    """40 positions: the llama-4 query scale steps at every 8 (original_max_position_embeddings of the
    tiny config) and YaRN interpolates; the diffusion mode's last block sees itself."""
    model = diffuse.load(str(convert_hf(tiny_hf_nemotron_diffusion, tmp_path / "n.gguf", "f32")))
    x = ids(40, 1)
    got = model.forward(x, mode=mode, block_size=open_block if mode == "diffusion" else None)
    want = nemotron_ref.logits(x, open_block)
    assert relative_error(got, want) < LIMIT, relative_error(got, want)
    f32_kv = diffuse.load(str(tmp_path / "n.gguf"), kv_f16=False)
    exact = f32_kv.forward(x, mode=mode, block_size=open_block if mode == "diffusion" else None)
    assert relative_error(exact, want) < 1e-5, relative_error(exact, want)


def test_nemotron_attention_factor_from_mscale(tmp_path, nemotron_ref):
    """Without mscale / mscale_all_dim, YaRN's attention factor is 0.1 ln(16) + 1: cos and sin scale."""
    hf = write_nemotron_diffusion(tmp_path / "hf", dtype="f32", mscale=False)
    model = diffuse.load(str(convert_hf(hf, tmp_path / "n.gguf", "f32")), kv_f16=False)
    x = ids(24, 2)
    want = ref.Reference(hf).logits(x)
    assert relative_error(model.forward(x, mode="ar"), want) < 1e-5
    assert relative_error(nemotron_ref.logits(x), want) > 1e-2    # the factor matters


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.pop("rope_parameters"), "no YaRN RoPE parameters"),
    (lambda c: c["rope_parameters"].update(rope_type="default"), "no YaRN RoPE parameters"),
    (lambda c: c["rope_parameters"].pop("llama_4_scaling_beta"), "lack 'llama_4_scaling_beta'"),
    (lambda c: c["rope_parameters"].update(factor=float("nan")), "factor = nan is not a number"),
])
def test_nemotron_config_without_yarn_is_refused(tmp_path, edit, message):
    hf = write_nemotron_diffusion(tmp_path / "hf", dtype="f32", n_layers=1, config_edit=edit)
    with pytest.raises(DiffuseError, match=message):
        convert_hf(hf, tmp_path / "n.gguf", "f32")
    assert not (tmp_path / "n.gguf").exists()


# ---- the AR mode on other families: causal logits against transformers ----

@pytest.mark.parametrize("family", ["llada", "sdar", "fast-dllm-v2"])
def test_ar_logits_match_transformers(tiny_gguf, request, family):
    """LLaDA (Llama blocks; its file's q/k permuted for NORM RoPE), SDAR (Qwen3), Fast-dLLM v2 (Qwen2),
    causal, against transformers' Llama / Qwen3 / Qwen2ForCausalLM in float64."""
    hf = request.getfixturevalue({"llada": "tiny_hf_llada", "sdar": "tiny_hf_sdar",
                                  "fast-dllm-v2": "tiny_hf_fast_dllm_v2"}[family])
    model = diffuse.load(str(tiny_gguf(family, "f32")), kv_f16=False)
    x = ids(30, 3)
    err = relative_error(model.forward(x, mode="ar"), ref.Reference(hf).logits(x))
    assert err < 1e-5, err


# ---- the loops against ports of the official ones ----

def test_ar_mode_is_the_official_ar_generate(nemotron, nemotron_ref):
    mask, eos = nemotron.mask_token_id, nemotron.tokenizer.eos_token_ids[0]
    for prompt in PROMPTS:
        got = nemotron.generate(prompt, mode="ar", gen_length=24, chat=False)
        want = ref.ar_generate(nemotron_ref, prompt, mask, 24, eos)
        assert same_answer(got.tokens, want, eos)
        assert got.steps == len(want) == got.forward_passes


@pytest.mark.parametrize("draft_length", [1, 2, 5, 32])
def test_self_spec_is_the_official_linear_spec(agreeable, draft_length):
    model, reference = agreeable
    mask, eos = model.mask_token_id, model.tokenizer.eos_token_ids[0]
    for prompt in PROMPTS:
        events = []
        got = model.generate(prompt, mode="self_spec", draft_length=draft_length, gen_length=30, chat=False,
                             on_step=events.append)
        want, iterations = ref.linear_spec_generate(reference, prompt, mask, 30, draft_length, eos)
        assert same_answer(got.tokens, want, eos)
        spec = [(list(e.spec_draft), e.spec_accepted) for e in events[1:]]
        assert spec == iterations


def test_diffusion_mode_is_the_official_generate(nemotron, nemotron_ref):
    mask, eos = nemotron.mask_token_id, nemotron.tokenizer.eos_token_ids[0]
    for prompt in PROMPTS:
        got = nemotron.generate(prompt, gen_length=40, block_length=8, chat=False)   # the model's default mode
        assert same_answer(got.tokens, ref.diffusion_generate(nemotron_ref, prompt, mask, 40, 8, eos_id=eos), eos)
        assert mask not in got.tokens


# ---- losslessness ----

@pytest.fixture(scope="module")
def agreeable(tmp_path_factory):
    """A Nemotron look-alike whose head favours two tokens by the sign of one direction of the final
    hidden state: drafts then match the AR choice often but not always, so iterations keep anything
    from none to all of their drafts."""
    folder = tmp_path_factory.mktemp("agreeable")
    hf = write_nemotron_diffusion(folder / "hf", dtype="f32", edit=agreeable_head)
    return diffuse.load(str(convert_hf(hf, folder / "a.gguf", "f32"))), ref.Reference(hf)


def test_agreeable_model_accepts_some_drafts(agreeable):
    model, _ = agreeable
    events = []
    model.generate(PROMPTS[1], mode="self_spec", draft_length=8, gen_length=60, chat=False, on_step=events.append)
    accepted = [e.spec_accepted for e in events[1:]]
    assert max(accepted) >= 3 and min(accepted) < 7, accepted


@pytest.mark.parametrize("family", ["nemotron-diffusion", "sdar", "llada", "dream"])
@pytest.mark.parametrize("options", [{}, {"temperature": 0.9, "seed": 11}, {"temperature": 0.7, "top_p": 0.9, "seed": 4}])
def test_self_spec_is_ar(tiny_gguf, agreeable, family, options):
    """The same answer as mode ar on every prompt and draft length (the default 32 included),
    greedy, or sampled with the same seed (draws are keyed by position). Sampled runs use an F32
    K/V cache: with the default F16 one, a pass of one row and a pass of a block round differently
    (ggml's flash kernel accumulates V in F16 for short batches, ~1e-3), so a draw that lands
    near a boundary between two tokens may differ (12 of 36 sampled 40-token runs of the tiny model
    differed somewhere; greedy choices never did here)."""
    load = dict(kv_f16=False) if options else {}
    paths = [agreeable[0].path] if family == "nemotron-diffusion" else []
    paths.append(str(tiny_gguf(family, "f32")))
    for path in paths:
        model = diffuse.load(path, **load)
        for prompt in PROMPTS:
            ar = model.generate(prompt, mode="ar", gen_length=40, chat=False, **options)
            for draft_length in (None, 1, 3, 8):
                spec = model.generate(prompt, mode="self_spec", draft_length=draft_length, gen_length=40,
                                      chat=False, **options)
                assert list(spec.tokens) == list(ar.tokens), (family, prompt, draft_length)
                assert spec.forward_passes <= 2 * ar.forward_passes


def test_self_spec_events(agreeable):
    """Per iteration: the drafted block, the drafts kept (equal to what the event commits), the bonus
    token after them, and the first rejected draft, which differs from the bonus."""
    model, _ = agreeable
    events = []
    result = model.generate(PROMPTS[1], mode="self_spec", draft_length=6, gen_length=50, chat=False,
                            on_step=events.append)
    for e in events[1:]:
        k = e.block_end - e.block_start
        assert len(e.spec_draft) == k and e.spec_draft[0] == e.tokens[e.block_start]
        a = e.spec_accepted
        assert list(e.unmasked) == list(range(e.block_start + 1, e.block_start + a + 2))
        assert list(e.tokens[e.block_start + 1:e.block_start + a + 1]) == list(e.spec_draft[1:a + 1])
        if a + 1 < k:
            assert e.spec_draft[a + 1] != e.tokens[e.block_start + a + 1]   # rejected; the bonus took its place
        assert set(e.active) == set(range(e.block_start, e.block_end))
    assert sum(len(e.unmasked) for e in events) == 50 == len(result.tokens)



def test_server_sends_the_drafts_as_the_local_run_has_them(agreeable):
    """Through `diffuse serve` a self_spec run's step events carry each iteration's draft and the
    drafts kept, rebuilt by diffuse.remote as the local run has them, and every drafted token's text
    (a rejected draft is decided nowhere); a run of another mode carries none. The usage brings the
    forward passes the engine counted."""
    from diffuse.remote import RemoteModel
    from diffuse.serve import Server
    model, _ = agreeable
    options = {"mode": "self_spec", "draft_length": 6, "gen_length": 24}
    local = []
    want = model.generate("It was", chat=False, on_step=local.append, **options)
    server = Server(model, port=0, max_batch=4)
    server.start()
    try:
        client = RemoteModel.connect(server.url, timeout=60)
        remote = []
        got = client.generate("It was", chat=False, on_step=remote.append, **options)
        assert list(got.tokens) == list(want.tokens) and got.forward_passes == want.forward_passes > 0
        assert [(None if e.spec_draft is None else list(e.spec_draft), e.spec_accepted) for e in remote] == \
            [(None if e.spec_draft is None else list(e.spec_draft), e.spec_accepted) for e in local]
        drafted = {int(t) for e in local if e.spec_draft is not None for t in e.spec_draft}
        assert drafted <= set(client.tokenizer.pieces)
        ar = []
        passes = client.generate("It was", chat=False, on_step=ar.append, mode="ar", gen_length=8).forward_passes
        assert passes == model.generate("It was", chat=False, mode="ar", gen_length=8).forward_passes
        assert all(e.spec_draft is None and e.spec_accepted == -1 for e in ar)
    finally:
        server.stop()


def test_cli_generate_reports_the_forward_passes(agreeable, capsys):
    """diffuse generate --mode self_spec: --json and the summary say how many passes ran."""
    from diffuse.cli import main
    model, _ = agreeable
    args = ["generate", "-m", model.path, "-p", "It was", "--mode", "self_spec", "--draft-length", "4",
            "--gen-length", "16", "--threads", "1"]
    want = model.generate("It was", mode="self_spec", draft_length=4, gen_length=16, threads=1)
    assert main([*args, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["forward_passes"] == want.forward_passes > 0
    assert f"forward passes {want.forward_passes}" in err

def test_cli_generate_over_the_network_reports_and_records_the_forward_passes(agreeable, capsys, tmp_path):
    """diffuse generate --server --mode self_spec: --json has the passes the server counted, and the
    recording keeps them and the architecture the server names (diffuse info shows it)."""
    from diffuse.cli import main
    from diffuse.recording import Recording
    from diffuse.serve import Server
    model, _ = agreeable
    want = model.generate("It was", chat=False, mode="self_spec", draft_length=4, gen_length=16)
    server = Server(model, port=0, max_batch=4)
    server.start()
    try:
        args = ["generate", "--server", server.url, "-p", "It was", "--no-chat", "--mode", "self_spec",
                "--draft-length", "4", "--gen-length", "16", "--quiet"]
        assert main([*args, "--json", "--record", str(tmp_path / "run.npz")]) == 0
    finally:
        server.stop()
    assert json.loads(capsys.readouterr().out)["forward_passes"] == want.forward_passes > 0
    assert Recording.load(tmp_path / "run.npz").result.forward_passes == want.forward_passes
    assert main(["info", str(tmp_path / "run.npz")]) == 0
    assert f"({model.arch})" in capsys.readouterr().out


def test_end_of_text_stops_every_mode(nemotron):
    """An end-of-text token ends the answer (the rest padded with it) in every mode alike."""
    prompt = PROMPTS[0]
    free = nemotron.generate(prompt, mode="ar", gen_length=30, chat=False)
    eos = int(free.tokens[6])   # a token the answer reaches: made end-of-text for this run
    core = nemotron._core
    outs = [diffuse._core.generate_batch(core, [np.array(prompt, np.int32)], options=[{**opts, "gen_length": 30}],
                                         eos_ids=[eos])[0]
            for opts in ({"mode": "ar"}, {"mode": "self_spec", "draft_length": 4})]
    first = list(free.tokens).index(eos)
    for out in outs:
        assert out["stop_reason"] == "eos"
        assert list(out["tokens"][:first + 1]) == list(free.tokens[:first + 1])
        assert set(out["tokens"][first:]) == {eos}


# ---- bad input: one clear error, nothing lost ----

@pytest.mark.parametrize("options,message", [
    ({"mode": "self_spec", "draft_length": 0}, r"draft_length = 0 is out of range"),
    ({"mode": "self_spec", "draft_length": 262145}, r"draft_length \(262145\) exceeds the model's context of 262144"),
    ({"mode": "ar", "cfg_scale": 1.0}, "cfg_scale does not apply to mode ar"),
    ({"mode": "self_spec", "editing_threshold": 0.5}, "editing_threshold does not apply to mode self_spec"),
    ({"mode": "bogus"}, "unknown mode 'bogus'"),
])
def test_bad_options_are_refused(nemotron, options, message):
    with pytest.raises(DiffuseError, match=message):
        nemotron.generate([1, 2, 3], chat=False, **options)


def test_context_is_checked(tiny_gguf):
    model = diffuse.load(str(tiny_gguf("sdar", "f32")))
    n_ctx = model._core.hparams["n_ctx_train"]
    with pytest.raises(DiffuseError, match="exceeds the model's context"):
        model.generate([1, 2, 3], mode="ar", gen_length=n_ctx, chat=False)


def test_a_stream_mixes_modes(tiny_gguf):
    """generate_stream runs ar / self_spec items beside the denoising loop's, numbered in admission
    order, each with the answer it has alone; a refused item fails alone."""
    model = diffuse.load(str(tiny_gguf("llada", "f32")))
    items = [(PROMPTS[0], {"mode": "ar", "gen_length": 12}), (PROMPTS[1], {"mode": "self_spec", "gen_length": 12}),
             (PROMPTS[2], {"gen_length": 16, "steps": 8, "seed": 1}),
             (PROMPTS[0], {"mode": "self_spec", "draft_length": 0}),
             (PROMPTS[2], {"mode": "ar", "gen_length": 5})]
    alone = [model.generate(p, chat=False, **o).tokens for p, o in items[:3]]
    finished, events = {}, []
    pending = [items[3:], items[:3]]

    def admit():
        return pending.pop() if pending else []

    model.generate_stream(admit, lambda i, r: finished.__setitem__(i, r), chat=False, on_step=events.append)
    assert sorted(finished) == [0, 1, 2, 3, 4]
    for i in range(3):
        assert list(finished[i].tokens) == list(alone[i])
    assert isinstance(finished[3], DiffuseError) and "draft_length" in str(finished[3])
    assert len(finished[4].tokens) == 5
    assert {e.sequence for e in events} == {0, 1, 2, 4}


# ---- diffuse bench spec ----

def test_bench_spec(nemotron, tmp_path, capsys):
    """Every draft length's passes, the break-even, and tok/s at the published acceptance by default."""
    from diffuse.cli import main
    out = tmp_path / "spec.json"
    assert main(["bench", "spec", nemotron.path, "--depth", "16", "--reps", "1", "--ar-tokens", "2",
                 "--draft-lengths", "1,4,8", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["k"] for r in result["rows"]] == [1, 4, 8]
    assert result["rows"][0]["draft_ms"] == 0                     # a draft of 1 is the seed alone: no draft pass
    for r in result["rows"]:
        assert r["break_even"] == pytest.approx(r["iteration_ms"] / result["decode_ms"])
    assert {s["acceptance"] for s in result["speed"]} == {5.46, 6.82}
    assert all(s["used"] == min(s["acceptance"], s["k"]) for s in result["speed"])
    assert "published" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["bench", "spec", nemotron.path, "--acceptance", "0.5"])


def test_long_prompt_prefills_in_chunks(tiny_hf_nemotron_diffusion, nemotron, nemotron_ref):
    """A prompt past one prefill pass (512 rows): the chunks' causal K/V are the one pass's."""
    x = ids(700, 4)
    f32 = diffuse.load(nemotron.path, kv_f16=False)
    assert relative_error(f32.forward(x, mode="ar"), nemotron_ref.logits(x)) < 1e-5
    ar = nemotron.generate(x, mode="ar", gen_length=12, chat=False)
    spec = nemotron.generate(x, mode="self_spec", draft_length=4, gen_length=12, chat=False)
    assert list(spec.tokens) == list(ar.tokens)


@pytest.mark.parametrize("mode", ["ar", "self_spec", "diffusion"])
def test_cancel(nemotron, mode):
    seen = []
    result = nemotron.generate(PROMPTS[1], mode=mode, gen_length=40, chat=False,
                               on_step=lambda e: seen.append(e) or len(seen) < 3)
    assert result.stop_reason == "cancelled" and len(seen) == 3 and result.steps == 3
