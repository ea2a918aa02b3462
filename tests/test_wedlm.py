"""WeDLM (Tencent): conversion of both layouts, logits against transformers in float64, the loop
(core_cpp/src/loops/wedlm.h) pass for pass against a port of Tencent's engine
(tests/reference/wedlm.py), the default path's limit, its events, batches, cancel, the CLI, the
server and bad input."""
from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_models import write_wedlm

import diffuse
from diffuse import DiffuseError
from diffuse.convert import convert_hf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from reference.nemotron import Reference  # noqa: E402  (needs torch)
from reference.wedlm import wedlm_generate  # noqa: E402

LAYOUTS = ["qwen3", "qwen2"]   # WeDLM-8B's blocks, WeDLM-7B's
PROMPTS = [[5, 17, 3, 250, 91, 33, 2, 8], [42], [300, 12, 12, 8, 77, 140, 2, 64, 33, 9, 210]]
# Tencent's defaults (window 16, threshold 0.4, penalty 0.02), a narrow window filling several masks
# a pass, and threshold 0 (its None: the lowest adjusted entropy alone).
SETTINGS = [{}, {"window_size": 4, "threshold": 1.0, "pos_penalty": 0.1}, {"window_size": 8, "threshold": 0.0}]
DEFAULTS = {"window_size": 16, "threshold": 0.4, "pos_penalty": 0.02}


def sharpen(tensors):
    """Random weights give near-uniform rows (entropy ~5.5 nats, nothing under any threshold):
    a larger head spreads the entropies over 0-2.5 nats, so passes fill one mask or several."""
    tensors["lm_head.weight"] *= 8


@pytest.fixture(scope="module")
def wedlm(tmp_path_factory):
    """layout -> (HF folder, our f32 GGUF)."""
    root = tmp_path_factory.mktemp("wedlm")
    made = {}
    for layout in LAYOUTS:
        hf = write_wedlm(root / f"hf-{layout}", qwen3=layout == "qwen3", edit=sharpen)
        made[layout] = hf, convert_hf(hf, root / f"{layout}.gguf", "f32")
    return made


@pytest.fixture(scope="module")
def references(wedlm):
    return {layout: Reference(hf) for layout, (hf, _) in wedlm.items()}


def relative_error(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def same_answer(got, want: list[int], eos: list[int]) -> bool:
    """The engine pads with end-of-text after the first; the port stops there."""
    got = [int(t) for t in got]
    return got[:len(want)] == want and set(got[len(want):]) <= set(eos)


# ---- conversion ----

@pytest.mark.parametrize("layout,arch", [("qwen3", "wedlm"), ("qwen2", "wedlm-qwen2")])
def test_both_layouts_convert_quantise_and_describe(wedlm, tmp_path, layout, arch):
    import json

    from diffuse.info import describe, format_info
    from diffuse.quantize import quantize_file
    hf, path = wedlm[layout]
    model = diffuse.load(str(path))
    assert model.arch == arch and model.family == "wedlm"
    assert model.mask_token_id == json.loads((hf / "config.json").read_text())["mask_token_id"]
    q8 = quantize_file(path, tmp_path / "q8.gguf", "Q8_0")
    info = describe(str(q8))
    assert info["architecture"] == arch and info["family"] == "wedlm" and info["hparams"]
    assert "diffusion     causal attention; a sliding window of 16 positions per causal pass" in format_info(info)
    answer = diffuse.load(str(q8)).generate(PROMPTS[0], gen_length=12, chat=False)
    assert len(answer.tokens) == 12


def test_config_null_mask_takes_the_official_fallback_or_is_refused(tmp_path):
    """config.json's mask_token_id null: Tencent's engine takes 151665 whatever the vocabulary holds;
    in a vocabulary of 448 rows that id does not exist: refused, nothing written."""
    hf = write_wedlm(tmp_path / "hf", mask_token_id=None, n_layers=1)
    with pytest.raises(DiffuseError, match=r"mask_token_id = None, its official fallback 151665, outside the 448"):
        convert_hf(hf, tmp_path / "w.gguf", "f32")
    assert not (tmp_path / "w.gguf").exists()


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.update(attention_bias=True), "attention_bias = True is a wedlm variant"),
    (lambda c: (c.pop("qk_norm"), c.update(attention_bias=False)), "attention_bias = False is a wedlm-qwen2 variant"),
])
def test_mixed_bias_and_qk_norm_are_refused(tmp_path, edit, message):
    """Tencent's engine gives q/k norms to the layers without biases, its remote code by qk_norm:
    only the two real combinations mean one model."""
    hf = write_wedlm(tmp_path / "hf", n_layers=1, config_edit=edit)
    with pytest.raises(DiffuseError, match=message):
        convert_hf(hf, tmp_path / "w.gguf", "f32")


# ---- logits ----

@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_match_transformers(wedlm, references, layout):
    """Causal logits against transformers' Qwen3ForCausalLM / Qwen2ForCausalLM in float64: F32 K/V
    below 1e-5 relative; the default path (F16 K/V, flash attention) below 5e-3."""
    _, path = wedlm[layout]
    x = [int(t) for t in np.random.default_rng(3).integers(0, 400, 40)]
    want = references[layout].logits(x)
    exact = relative_error(diffuse.load(str(path), kv_f16=False).forward(x, mode="ar"), want)
    model = diffuse.load(str(path))
    default = relative_error(model.forward(x, mode="ar"), want)
    assert exact < 1e-5 and default < 5e-3, (exact, default)
    assert np.array_equal(model.forward(x), model.forward(x, mode="ar"))   # its own pattern is causal


# ---- the loop against Tencent's ----

def run_both(path, reference, prompt, options, gen_length=24, **load):
    model = diffuse.load(str(path), **load)
    events = []
    got = model.generate(prompt, gen_length=gen_length, chat=False, on_step=events.append, **options)
    o = {**DEFAULTS, **options}
    eos = model.tokenizer.eos_token_ids
    want, passes = wedlm_generate(reference, prompt, model.mask_token_id, gen_length, o["window_size"],
                                  o["threshold"], o["pos_penalty"], tuple(eos))
    return got, events, want, passes, eos


def same_pass(event, p) -> bool:
    n = len(event.tokens)
    return (list(event.window_order) == [q for q in p["order"] if q < n] and list(event.committed) == p["committed"]
            and list(event.unmasked) == sorted(q for q in p["filled"] if q < n)
            and all(event.tokens[q] == t for q, t in p["filled"].items() if q < n))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("options", SETTINGS)
def test_loop_is_tencents_pass_for_pass(wedlm, references, layout, options):
    """F32 K/V: every pass runs the port's window order, commits its head, fills the same masks with
    the same tokens, entropies within 1e-4 nats; the same answer. The port runs one pass more (the
    one committing the last tokens, which nothing reads)."""
    _, path = wedlm[layout]
    for prompt in PROMPTS:
        got, events, want, passes, eos = run_both(path, references[layout], prompt, options, kv_f16=False)
        assert same_answer(got.tokens, want, eos)
        assert len(passes) == len(events) + 1 and got.steps == got.forward_passes == len(events)
        for event, p in zip(events, passes):
            assert same_pass(event, p), (event.step, prompt)
            errors = [abs(event.entropy[q] - h) for q, h in p["entropy"].items() if q < len(event.tokens)]
            assert max(errors, default=0) < 1e-4


def test_long_prompt_prefills_in_chunks(wedlm, references):
    """A prompt past one prefill pass (512 rows): the window over the chunks' K/V is the port's."""
    _, path = wedlm["qwen3"]
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, 400, 600)]
    got, events, want, passes, eos = run_both(path, references["qwen3"], prompt, SETTINGS[1], gen_length=8,
                                              kv_f16=False)
    assert same_answer(got.tokens, want, eos) and all(same_pass(e, p) for e, p in zip(events, passes))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_default_path_within_its_limit(wedlm, references, layout):
    """The default path (F16 K/V, flash attention) rounds K and V: its entropies stay within 0.03
    nats of float64 (measured up to 0.013 on this 8x-sharpened head), and where its choices part from
    the port's, the port's were within that of a tie (the adjusted entropy against the threshold, or
    the lowest adjusted entropy against the next)."""
    _, path = wedlm[layout]
    tol = 0.03
    for options in SETTINGS:
        for prompt in PROMPTS:
            got, events, want, passes, eos = run_both(path, references[layout], prompt, options)
            o = {**DEFAULTS, **options}
            for event, p in zip(events, passes):
                n = len(event.tokens)
                errors = [abs(event.entropy[q] - h) for q, h in p["entropy"].items() if q < n]
                assert max(errors, default=0) < tol
                if same_pass(event, p):
                    continue
                masks = sorted(p["entropy"])
                adjusted = sorted(p["entropy"][q] + (q - masks[0]) * o["pos_penalty"] for q in masks)
                near_threshold = any(abs(a - o["threshold"]) < tol for a in adjusted)
                near_argmin = len(adjusted) > 1 and adjusted[1] - adjusted[0] < tol
                assert near_threshold or near_argmin or list(event.unmasked) == sorted(q for q in p["filled"] if q < n)
                break   # a different pass: the runs part here
            else:
                assert same_answer(got.tokens, want, eos)


def test_events_follow_the_contract(wedlm):
    """window_order: the window's positions, filled ones first (ascending), then the masks;
    committed: the leading filled positions, contiguous from block_start; cached: everything before."""
    _, path = wedlm["qwen3"]
    events = []
    result = diffuse.load(str(path)).generate(PROMPTS[0], gen_length=30, chat=False, window_size=4, threshold=1.0,
                                              on_step=events.append)
    previous_mask = np.ones(len(events[0].tokens), bool)
    previous_mask[:events[0].prompt_length] = False
    for e in events:
        order = list(e.window_order)
        assert sorted(order) == list(range(e.block_start, e.block_end))
        filled = [q for q in order if not previous_mask[q]]
        assert order == sorted(filled) + sorted(set(order) - set(filled))
        assert list(e.committed) == list(range(e.block_start, e.block_start + len(e.committed)))
        assert all(not previous_mask[q] for q in e.committed)
        assert list(e.cached) == list(range(e.block_start)) and list(e.active) == order
        assert not e.mask[e.unmasked].any() and previous_mask[e.unmasked].all()
        previous_mask = e.mask
    assert result.steps == len(events) and not events[-1].mask.any()


def test_sampling_repeats_with_its_seed(wedlm):
    """temperature > 0: draws keyed by (seed, step, position): a seed repeats its run; the
    entropies the rule reads are the raw logits' (as Tencent's sampler), the same as greedy's at the
    first pass."""
    _, path = wedlm["qwen3"]
    model = diffuse.load(str(path))
    first, again, greedy = [], [], []
    a = model.generate(PROMPTS[0], gen_length=20, chat=False, temperature=1.0, seed=5, on_step=first.append)
    b = model.generate(PROMPTS[0], gen_length=20, chat=False, temperature=1.0, seed=5, on_step=again.append)
    model.generate(PROMPTS[0], gen_length=20, chat=False, on_step=greedy.append)
    assert list(a.tokens) == list(b.tokens)
    assert np.array_equal(first[0].entropy, greedy[0].entropy, equal_nan=True)
    assert any(list(model.generate(PROMPTS[0], gen_length=20, chat=False, temperature=1.0, seed=s).tokens)
               != list(a.tokens) for s in (6, 7, 8))


def test_top_p_cuts_the_raw_distribution_then_the_temperature_applies(wedlm):
    """Tencent's sample_tokens: top-k, top-p over the raw logits, then temperature. At temperature 5
    and top_p 0.5 every token the first pass fills lies in its raw nucleus, which at the positions
    filled holds fewer tokens than the tempered one would."""
    _, path = wedlm["qwen3"]
    model = diffuse.Model(str(path), kv_f16=False)
    prompt, width = PROMPTS[0], DEFAULTS["window_size"]
    # the first pass: the prompt, then the window's masks in their own order, causally
    raw = model.forward(prompt + [model.mask_token_id] * width, mode="ar")[len(prompt):].astype(np.float64)

    def nucleus(logits):
        p = np.exp(logits - logits.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        return set(order[: np.searchsorted(np.cumsum(p[order]), 0.5, side="right") + 1].tolist())

    wider = 0
    for seed in range(30):
        events = []
        model.generate(prompt, gen_length=width, chat=False, temperature=5.0, top_p=0.5, seed=seed,
                       on_step=events.append)
        for q in events[0].unmasked:
            row = raw[q - len(prompt)]
            assert int(events[0].tokens[q]) in nucleus(row), (seed, q)
            wider += len(nucleus(row / 5.0)) > len(nucleus(row))
    assert wider > 0


# ---- batches, streams, cancel, CLI, server ----

def test_batch_and_stream_give_each_answer_alone(wedlm):
    """WeDLM's loop runs beside the other causal modes: a batch and a stream (items joining later)
    give each prompt the answer it has alone."""
    _, path = wedlm["qwen2"]
    model = diffuse.load(str(path))
    items = [(PROMPTS[0], {}), (PROMPTS[1], {"window_size": 4, "threshold": 1.0}), (PROMPTS[2], {"mode": "ar"})]
    alone = [list(model.generate(p, gen_length=16, chat=False, **o).tokens) for p, o in items]
    batch = model.generate_batch([p for p, _ in items], gen_length=16, chat=False, per_prompt=[o for _, o in items])
    assert [list(r.tokens) for r in batch] == alone
    finished, events = {}, []
    pending = [items[2:], items[:2]]
    model.generate_stream(lambda: [(p, {**o, "gen_length": 16}) for p, o in pending.pop()] if pending else [],
                          lambda i, r: finished.__setitem__(i, r), chat=False, on_step=events.append)
    assert [list(finished[i].tokens) for i in range(3)] == alone
    assert {e.sequence for e in events if e.window_order is not None} == {0, 1}


def test_cancel(wedlm):
    _, path = wedlm["qwen3"]
    seen = []
    result = diffuse.load(str(path)).generate(PROMPTS[2], gen_length=40, chat=False,
                                              on_step=lambda e: seen.append(e) or len(seen) < 3)
    assert result.stop_reason == "cancelled" and len(seen) == 3 and result.steps == 3


# ---- bad input ----

@pytest.mark.parametrize("options,message", [
    ({"window_size": 0}, r"window_size = 0 is out of range: expected an integer in \[1, "),
    ({"window_size": 16385}, r"window_size \(16385\) exceeds the model's context of 16384 positions"),
    ({"pos_penalty": -1}, r"pos_penalty = -1 is out of range"),
])
def test_bad_options_are_refused(wedlm, options, message):
    _, path = wedlm["qwen3"]
    with pytest.raises(DiffuseError, match=message):
        diffuse.load(str(path)).generate([1, 2, 3], chat=False, **options)


def test_cli_generate(wedlm, tmp_path, capsys):
    from diffuse.cli import main
    from diffuse.recording import Recording
    _, path = wedlm["qwen3"]
    run = tmp_path / "run.npz"
    assert main(["generate", "-m", str(path), "-p", "Hello there", "--gen-length", "20", "--window-size", "8",
                 "--threshold", "1.0", "--threads", "1", "--record", str(run)]) == 0
    out, err = capsys.readouterr()
    rec = Recording.load(run)
    assert out == rec.result.text + "\n" and "tok/s" in err
    assert rec.options["window_size"] == 8 and rec.options["pos_penalty"] == 0.02
    assert len(rec.events) == rec.result.steps
    for e in rec.events:   # the window's fields come back from the file
        assert sorted(e.window_order) == list(range(e.block_start, e.block_end))
        assert list(e.committed) == list(range(e.block_start, e.block_start + len(e.committed)))


def test_server_answers_as_generate_with_its_events(wedlm):
    """Through `diffuse serve` (the openai client) the answer is generate's; through diffuse.remote
    the step events carry the window's order and commits, relative to the answer."""
    import openai

    from diffuse.remote import RemoteModel
    from diffuse.serve import Server
    _, path = wedlm["qwen2"]
    model = diffuse.load(str(path), threads=1)
    options = {"gen_length": 16, "window_size": 4, "threshold": 1.0}
    local = []
    want = model.generate("It was", chat=False, on_step=local.append, **options)
    server = Server(model, port=0, max_batch=4)
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        got = client.completions.create(model="m", prompt="It was", max_tokens=16,
                                        extra_body={"window_size": 4, "threshold": 1.0})
        assert got.choices[0].text == want.text
        remote = []
        RemoteModel.connect(server.url, timeout=60).generate("It was", chat=False, on_step=remote.append, **options)
        p = local[0].prompt_length
        assert [list(e.window_order) for e in remote] == [list(e.window_order - p) for e in local]
        assert [list(e.committed) for e in remote] == [list(e.committed - p) for e in local]
    finally:
        server.stop()
