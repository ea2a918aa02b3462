"""DiffusionGemma: the tiny checkpoint transformers saves (fixtures/tiny_diffusion_gemma.py),
converted to PR #24423's dialect, loaded and run; its canvas logits against transformers 5.24 in
float64 over several denoising steps (self-conditioning chained) and two canvases; bad files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.convert import convert_hf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.diffusion_gemma")

from fixtures.tiny_diffusion_gemma import CANVAS, SLIDING_WINDOW, load_reference, write_diffusion_gemma  # noqa: E402


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return write_diffusion_gemma(tmp_path_factory.mktemp("diffusion_gemma") / "hf")


@pytest.fixture(scope="module")
def gguf_f32(hf_dir, tmp_path_factory) -> Path:
    return convert_hf(hf_dir, tmp_path_factory.mktemp("dg_gguf") / "tiny-f32.gguf", "f32")


def test_convert_writes_the_pr_dialect(hf_dir, gguf_f32):
    info = gguf_file.read(gguf_f32)
    kv, names = info.kv, {t.name for t in info.tensors}
    assert kv["general.architecture"] == "diffusion-gemma"
    assert kv["diffusion.canvas_length"] == CANVAS
    assert list(kv["diffusion-gemma.attention.head_count_kv"]) == [2, 1]
    assert list(kv["diffusion-gemma.attention.sliding_window_pattern"]) == [True, False]
    assert kv["diffusion-gemma.attention.sliding_window"] == SLIDING_WINDOW
    assert (kv["diffusion-gemma.attention.key_length"], kv["diffusion-gemma.attention.key_length_swa"]) == (128, 64)
    assert kv["diffusion-gemma.final_logit_softcapping"] == 30.0
    assert {"blk.0.attn_v.weight", "blk.0.layer_output_scale.weight", "blk.0.enc_layer_output_scale.weight",
            "blk.1.ffn_gate_up_exps.weight", "blk.1.ffn_down_exps.scale", "blk.1.ffn_gate_inp.scale",
            "self_cond_pre_norm.weight", "self_cond_down.weight", "rope_freqs.weight"} <= names
    assert "blk.1.attn_v.weight" not in names and "output.weight" not in names
    assert not any("vision" in n for n in names)
    # Proportional RoPE of the full layer (head 128, a quarter rotated): 16 pairs at 1, 48 left alone.
    m = diffuse.load(gguf_f32, threads=1)
    assert m.arch == "diffusion-gemma"


def _reference_logits(model, context, canvas, self_cond):
    """transformers' canvas logits: the encoder writes the context's cache, the decoder reads it."""
    from transformers import DynamicCache
    with torch.no_grad():
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        model.model.encoder(input_ids=torch.tensor([context]), cache=cache)
        sc = None if self_cond is None else torch.tensor(self_cond[None], dtype=torch.float64)
        out = model(decoder_input_ids=torch.tensor([canvas]), cache=cache, self_conditioning_logits=sc)
    return out.logits[0].double().numpy()


def _steps(run, prompt, rng, n_vocab, temperature=0.8):
    """Three denoising steps on each of two canvases, the second after the first's argmax; the
    self-conditioning is the previous step's logits / temperature, as the official loop feeds it."""
    context, out = list(prompt), []
    for _ in range(2):
        sc = None
        for _ in range(3):
            canvas = rng.integers(0, n_vocab, CANVAS).tolist()
            logits = run(context, canvas, sc)
            out.append(logits)
            sc = (logits / temperature).astype(np.float32)
        context += np.argmax(logits, axis=-1).tolist()
    return out


@pytest.mark.parametrize("flash, kv_f16", [(False, False), (True, True)], ids=["exact", "default"])
def test_canvas_logits_match_transformers(hf_dir, gguf_f32, flash, kv_f16):
    ref = load_reference(hf_dir)
    m = diffuse.load(gguf_f32, threads=2, flash_attn=flash, kv_f16=kv_f16)
    prompt = np.random.default_rng(1).integers(0, m.n_vocab, 3 * SLIDING_WINDOW).tolist()   # past the window
    ours = _steps(lambda c, x, sc: m.forward(c, canvas=x, self_conditioning=sc), prompt,
                  np.random.default_rng(2), m.n_vocab)
    # The reference is fed our self-conditioning logits, so each step compares one forward pass.
    theirs, it = [], iter(ours)
    context = list(prompt)
    rng = np.random.default_rng(2)
    for _ in range(2):
        sc = None
        for _ in range(3):
            canvas = rng.integers(0, m.n_vocab, CANVAS).tolist()
            theirs.append(_reference_logits(ref, context, canvas, sc))
            sc = (next(it) / 0.8).astype(np.float32)
        context += np.argmax(ours[len(theirs) - 1], axis=-1).tolist()
    # Measured (max over the six passes): exact path (F32 K/V, no flash) 9.2e-7, default (flash, F16
    # K/V) 4.2e-4 of the largest logit. transformers' float64 model computes its norms, softmaxes
    # and RoPE angles in float32, so float32 is also the reference's own precision.
    errors = [np.abs(a - b).max() / np.abs(b).max() for a, b in zip(ours, theirs)]
    assert max(errors) < (2e-6 if not kv_f16 else 1e-3), errors


def test_forward_refuses_bad_canvas_input(gguf_f32):
    m = diffuse.load(gguf_f32, threads=1)
    with pytest.raises(DiffuseError, match="one row per canvas position"):
        m.forward([1, 2, 3], canvas=[4, 5], self_conditioning=np.zeros((3, m.n_vocab)))
    with pytest.raises(DiffuseError, match="outside the vocabulary"):
        m.forward([1, 2, 3], canvas=[m.n_vocab])
    with pytest.raises(DiffuseError, match="context and a canvas|canvas"):
        m.forward([1, 2, 3])
    with pytest.raises(DiffuseError, match="mode 'ar' does not apply to DiffusionGemma"):
        m.forward([1, 2, 3], mode="ar")
    with pytest.raises(DiffuseError, match="mode do not apply to a canvas"):
        m.forward([1, 2, 3], canvas=[4, 5], mode="ar")


def _copy_with(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config, dst)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_convert_refuses_a_vision_checkpoint_without_text_config(hf_dir, tmp_path):
    bad = _copy_with(hf_dir, tmp_path / "bad", lambda c, d: c.pop("text_config"))
    with pytest.raises(DiffuseError, match="no text_config beside its vision_config"):
        convert_hf(bad, tmp_path / "out.gguf", "f32")
    assert not (tmp_path / "out.gguf").exists()


def test_bad_gguf_files_get_one_clear_error(gguf_f32, tmp_path):
    info = gguf_file.read(gguf_f32)
    cases = {
        "canvas length 0": ({"diffusion.canvas_length": 0}, None, "diffusion.canvas_length = 0"),
        "missing canvas key": ({"diffusion.canvas_length": None}, None, "missing key diffusion.canvas_length"),
        "missing pattern": ({"diffusion-gemma.attention.sliding_window_pattern": None}, None,
                            "missing key diffusion-gemma.attention.sliding_window_pattern"),
        "K = V layer with V": ({}, ("blk.0.attn_v.weight", "blk.1.attn_v.weight"), "K = V"),
    }
    for what, (keys, extra, message) in cases.items():
        out = tmp_path / f"{what.replace(' ', '_')}.gguf"
        _rewrite(info, out, keys, extra)
        with pytest.raises(DiffuseError, match=message):
            diffuse.load(out, threads=1)


def _rewrite(info, out: Path, keys: dict, extra: tuple[str, str] | None) -> None:
    """A copy of the file with keys changed (None: removed) and, optionally, a copy of one tensor
    added under another name."""
    kv = {k: v for k, v in info.kv.items() if keys.get(k, 0) is not None and not k.startswith("GGUF.")}
    kv.update({k: v for k, v in keys.items() if v is not None})
    types = {k: info.kv_types[k] for k in kv if k in info.kv_types}
    tensors = list(info.tensors)
    with open(tensors[0].path, "rb") as f:
        blobs = {}
        for t in tensors:
            f.seek(t.offset)
            blobs[t.name] = np.frombuffer(f.read(t.nbytes), np.uint8)
    outs = [gguf_file.OutTensor(t.name, t.type, t.shape) for t in tensors]
    if extra:
        src = next(t for t in tensors if t.name == extra[0])
        outs.append(gguf_file.OutTensor(extra[1], src.type, src.shape))
        blobs[extra[1]] = blobs[extra[0]]
    gguf_file.write(out, kv, types, outs, (blobs[t.name] for t in outs))



def _run(m, prompt, **options):
    events = []
    result = m.generate(prompt, chat=False, on_step=lambda ev: events.append(ev) or True, **options)
    return result, events


@pytest.mark.parametrize("options", [
    dict(gen_length=2 * CANVAS, steps=6, seed=3),                                     # the defaults' rules
    dict(gen_length=2 * CANVAS, steps=8, seed=4, entropy_budget=10.0, stop_entropy=6.0, temperature=0.3,
         temperature_end=0.1),                                                          # wide bound, early stops
    dict(gen_length=CANVAS, steps=5, seed=5, temperature=1.5, temperature_end=0.2, stability=0),
])
def test_loop_matches_the_official_one_step_for_step(gguf_f32, options):
    """The engine's events against transformers' own denoising step, driven by the engine's forward
    (Model.forward) and its noise: the same positions accepted, the same argmax drafts, the same
    stops, the same answer."""
    from reference.uniform_state import official_generate
    m = diffuse.load(gguf_f32, threads=2)
    prompt = np.random.default_rng(7).integers(0, 400, 3 * SLIDING_WINDOW).tolist()
    result, events = _run(m, prompt, **options)
    o = diffuse.generation.resolve_options(m.arch, m.recipe, **options)
    starts = {ev.block: ev for ev in reversed(events)}          # each canvas's first event
    canvas = lambda ev: ev.tokens[ev.block_start:ev.block_end].tolist()
    noise = lambda k: canvas(events[k + 1]) if k + 1 < len(events) and events[k + 1].block == events[k].block \
        else [0] * CANVAS
    eos = list(m.tokenizer.eos_token_ids)
    theirs, trace = official_generate(
        lambda c, x, sc: m.forward(c, canvas=x, self_conditioning=sc), prompt, canvas_length=CANVAS,
        vocab_size=m.n_vocab, max_new_tokens=o["gen_length"], steps=o["steps"], entropy_bound=o["entropy_budget"],
        t_min=o["temperature_end"], t_max=o["temperature"], stability=o["stability"], confidence=o["stop_entropy"],
        eos_ids=eos, pad_id=-1, initial=lambda n: canvas(starts[n]), noise=noise)
    assert len(trace) == len(events) == result.steps
    for ev, t in zip(events, trace):
        accepted = np.zeros(CANVAS, bool)
        accepted[ev.unmasked - ev.block_start] = True
        assert (accepted == t["accepted"]).all(), ev.step
        assert (ev.draft == t["argmax"]).all(), ev.step
        assert set(ev.redrawn - ev.block_start) == set(np.flatnonzero(~accepted))
        assert ev.entropy_cut == pytest.approx(np.nanmax(np.where(accepted, ev.entropy[ev.block_start:ev.block_end],
                                                                  np.nan)))
    ours = result.tokens.tolist()
    cut = next((i + 1 for i, t in enumerate(theirs) if t in eos), len(theirs))
    assert ours[:cut] == theirs[:cut] and len(ours) == len(theirs)
    assert all(t == theirs[cut - 1] for t in ours[cut:])          # after end-of-text: that token (theirs: pad)
    if options.get("stop_entropy"):
        assert result.steps < o["steps"] * len(starts), "no canvas stopped early: the stop rule went untested"


def test_greedy_draws_are_the_argmax_and_runs_repeat(gguf_f32):
    m = diffuse.load(gguf_f32, threads=2)
    prompt = list(range(10, 30))
    a, events = _run(m, prompt, gen_length=CANVAS, steps=4, temperature=0.0, temperature_end=0.0, seed=1)
    for ev, nxt in zip(events, events[1:]):
        kept = ev.unmasked - ev.block_start
        assert (nxt.tokens[ev.block_start:ev.block_end][kept] == ev.draft[kept]).all()
    b, _ = _run(m, prompt, gen_length=CANVAS, steps=4, temperature=0.0, temperature_end=0.0, seed=1)
    c, _ = _run(m, prompt, gen_length=CANVAS, steps=4, temperature=0.0, temperature_end=0.0, seed=2)
    assert (a.tokens == b.tokens).all() and a.tokens.tolist() != []
    assert len(c.tokens) == CANVAS


def test_batches_cancel_and_end_of_text(gguf_f32):
    m = diffuse.load(gguf_f32, threads=2)
    prompts = [list(range(5, 25)), list(range(40, 47))]
    opts = dict(gen_length=2 * CANVAS, steps=3, seed=9)
    alone = [m.generate(p, chat=False, **opts) for p in prompts]
    together = m.generate_batch(prompts, chat=False, **opts)
    for x, y in zip(alone, together):
        assert (x.tokens == y.tokens).all() and x.steps == y.steps
    # Cancelling one sequence leaves the other running.
    seen = []
    out = m.generate_batch(prompts, chat=False, on_step=lambda ev: seen.append(ev.sequence) or ev.sequence != 0, **opts)
    assert out[0].stop_reason == "cancelled" and out[1].stop_reason == together[1].stop_reason
    assert (out[1].tokens == together[1].tokens).all()
    # End-of-text in a finished canvas ends the answer there, the rest filled with it.
    first = alone[0].tokens[:CANVAS]
    eos = int(first[3])
    (raw,) = diffuse._core.generate_batch(m._core, [np.asarray(prompts[0], np.int32)], options=[opts], eos_ids=[eos])
    at = int(np.flatnonzero(raw["tokens"] == eos)[0])
    assert raw["stop_reason"] == "eos" and len(raw["tokens"]) == CANVAS and (raw["tokens"][at:] == eos).all()


def test_generate_refuses_what_does_not_apply(gguf_f32):
    m = diffuse.load(gguf_f32, threads=1)
    with pytest.raises(DiffuseError, match="exceeds the model's context"):
        m.generate([1, 2, 3], chat=False, gen_length=m.n_ctx_train)
    with pytest.raises(DiffuseError, match="canvases of its own length"):
        m.generate([1, 2, 3], chat=False, block_length=8)
    with pytest.raises(DiffuseError, match="must not exceed temperature"):
        m.generate([1, 2, 3], chat=False, temperature=0.3, temperature_end=0.5)
    for mode in ("ar", "self_spec"):   # the causal-cache modes (loops/causal.cpp) are not this model's
        with pytest.raises(DiffuseError, match="mode ar and self_spec do not apply to DiffusionGemma"):
            m.generate([1, 2, 3], chat=False, mode=mode)


def test_the_server_streams_uniform_state_events(gguf_f32):
    """The OpenAI-compatible server runs the model; its step events carry the draft, the re-drawn
    positions and the entropy cut."""
    import openai
    from diffuse.serve import Server
    s = Server(diffuse.load(gguf_f32, threads=2), port=0, api_key="k", max_batch=4)
    s.start()
    try:
        client = openai.OpenAI(base_url=s.url, api_key="k", max_retries=0, timeout=60)
        # One seed for both: an unset seed is a random one.
        plain = client.completions.create(model="m", prompt="The river", max_tokens=CANVAS,
                                          extra_body={"steps": 3, "seed": 0})
        stream = client.completions.create(model="m", prompt="The river", max_tokens=CANVAS, stream=True,
                                           extra_body={"steps": 3, "seed": 0, "diffusion_events": True})
        events, text = [], ""
        for chunk in stream:
            if (ev := (chunk.model_extra or {}).get("diffusion")) is not None:
                events.append(ev)
            elif chunk.choices:
                text += chunk.choices[0].text
    finally:
        s.stop()
    assert text == plain.choices[0].text
    assert [e["step"] for e in events] == list(range(len(events))) and events
    ev = events[0]
    assert len(ev["draft"]) == CANVAS and sorted(ev["redrawn"] + ev["unmasked"]) == list(range(CANVAS))
    assert ev["entropy_cut"] == max(ev["entropy"][i] for i in ev["unmasked"])


def test_the_server_streams_a_canvas_once_it_is_final(gguf_f32):
    """A canvas re-draws positions it accepted at an earlier step: the server streams each canvas's
    text once it is finished (streamed == not streamed, never a 500 for a changed prefix), and a mode
    the canvases cannot run is the request's fault (400), said before the run."""
    import openai
    from diffuse.serve import Server
    s = Server(diffuse.load(gguf_f32, threads=2), port=0, api_key="k", max_batch=4)
    s.start()
    try:
        client = openai.OpenAI(base_url=s.url, api_key="k", max_retries=0, timeout=60)
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2 * CANVAS}
        for seed in range(1, 7):
            plain = client.chat.completions.create(**chat, extra_body={"seed": seed})
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                **chat, stream=True, extra_body={"seed": seed}) if c.choices)
            assert streamed == plain.choices[0].message.content
            assert plain.usage.completion_tokens == 2 * CANVAS
        with pytest.raises(openai.BadRequestError, match="do not apply to DiffusionGemma") as e:
            client.chat.completions.create(**chat, extra_body={"mode": "ar"})
        assert e.value.body["type"] == "invalid_request_error"
    finally:
        s.stop()


def test_recordings_keep_the_uniform_state_fields(gguf_f32, tmp_path):
    from diffuse.recording import Recording
    m = diffuse.load(gguf_f32, threads=2)
    rec = Recording(prompt="ids", options={"steps": 3}, model={"arch": m.arch})
    result = m.generate(list(range(10, 30)), chat=False, gen_length=CANVAS, steps=3, on_step=rec.add)
    rec.finish(result, m.tokenizer.decode)
    rec.save(tmp_path / "run.npz")
    back = Recording.load(tmp_path / "run.npz")
    assert len(back.events) == len(rec.events) == 3
    for a, b in zip(rec.events, back.events):
        assert (a.draft == b.draft).all() and (a.redrawn == b.redrawn).all() and a.entropy_cut == b.entropy_cut
