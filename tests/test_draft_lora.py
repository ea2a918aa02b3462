"""Nemotron-Labs-Diffusion's draft LoRA (linear_spec_lora/, PEFT on o_proj): converted into the
model's GGUF, added in self-speculation's draft passes only. Its draft pass against the float64
reference (base weights plus scale * B A on o_proj for the block's rows), the loop against the port
of linear_spec_generate with the adapters on for the draft, the answer still mode ar's token for
token, and a LoRA folder that does not fit the model refused in one line with nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest
from fixtures.tiny_models import agreeable_head, write_draft_lora, write_nemotron_diffusion

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.convert import convert_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from reference import nemotron as ref  # noqa: E402  (needs torch)

PROMPTS = [[5, 17, 3, 250, 91], [300, 12, 12, 8, 77, 140, 2, 64, 33, 9, 210], [42]]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.fixture(scope="module")
def agreeable(tmp_path_factory):
    """test_causal_modes.py's agreeable Nemotron look-alike (drafts match the AR choice often, not
    always) with a draft LoRA: (model with F32 K/V, its path, the float64 reference, the checkpoint)."""
    folder = tmp_path_factory.mktemp("lora")
    hf = write_nemotron_diffusion(folder / "hf", dtype="f32", edit=agreeable_head)
    write_draft_lora(hf, r=8, alpha=16.0)
    path = convert_hf(hf, folder / "lora.gguf", "f32")
    return diffuse.load(path, kv_f16=False, flash_attn=False), path, ref.Reference(hf), hf


# ---- conversion ----

def test_the_lora_is_converted_into_the_model(agreeable, tmp_path):
    model, path, _, hf = agreeable
    info = gguf_file.read(path)
    assert info.kv["diffusion.draft_lora.scale"] == 2.0                        # lora_alpha / r = 16 / 8
    lora = [t for t in info.tensors if ".lora_" in t.name]
    assert len(lora) == 2 * model.hparams["n_layer"]
    assert info.tensor("blk.1.attn_output.weight.lora_a").shape == (512, 8)   # ggml order: PEFT's A (8, 512)
    assert info.tensor("blk.1.attn_output.weight.lora_b").shape == (8, 256)
    assert model.hparams["draft_lora_rank"] == 8
    f16 = gguf_file.read(convert_hf(hf, tmp_path / "f16.gguf", "f16"))
    assert {t.type_name for t in f16.tensors if ".lora_" in t.name} == {"f16"}


def test_quantised_files_keep_the_lora(agreeable, tmp_path):
    from diffuse.quantize import quantize_file
    _, path, _, hf = agreeable
    out = quantize_file(path, tmp_path / "q8.gguf", "q8_0")
    info = gguf_file.read(out)
    assert {t.type_name for t in info.tensors if ".lora_" in t.name} == {"f32"}
    q8 = diffuse.load(out)
    assert q8.hparams["draft_lora_rank"] == 8
    ar = q8.generate(PROMPTS[1], mode="ar", gen_length=20, chat=False)
    spec = q8.generate(PROMPTS[1], mode="self_spec", draft_length=6, gen_length=20, chat=False)
    assert list(spec.tokens) == list(ar.tokens)
    # an F16 LoRA stays F16 (it became F32), byte for byte, whichever type the rest takes
    f16 = convert_hf(hf, tmp_path / "lora-f16.gguf", "f16")
    for qtype in ("q4_k_m", "f16"):
        q = gguf_file.read(quantize_file(f16, tmp_path / f"{qtype}.gguf", qtype))
        for t in gguf_file.read(f16).tensors:
            if ".lora_" in t.name:
                assert q.tensor(t.name).type_name == "f16" and (q.tensor(t.name).raw() == t.raw()).all()


# ---- the draft pass ----

def test_draft_pass_matches_float64(agreeable):
    """The draft pass (a block of 8 over a causal prefix of 12) with the LoRA against float64 with
    scale * B A added to the block's o_proj: below 1e-5 (F32 weights and K/V); without it, the base
    weights' logits; the LoRA moves them by far more than the limit."""
    model, path, reference, _ = agreeable
    ids = PROMPTS[1] + [100] * 9                                      # the seed and masks, as a draft
    with_lora = reference.logits(ids, open_block=9, draft_lora=True)
    base = reference.logits(ids, open_block=9)
    got = model.forward(ids, block_size=9, draft_lora=True)
    assert relative_error(got, with_lora) < 1e-5
    assert relative_error(model.forward(ids, block_size=9), base) < 1e-5
    assert relative_error(with_lora, base) > 1e-2
    default = diffuse.load(path)                                      # F16 K/V cache, flash attention
    assert relative_error(default.forward(ids, block_size=9, draft_lora=True), with_lora) < 5e-3


def test_causal_passes_never_use_it(agreeable):
    model, _, reference, _ = agreeable
    ids = PROMPTS[1] + [7, 8, 9]
    assert relative_error(model.forward(ids, mode="ar"), reference.logits(ids)) < 1e-5
    with pytest.raises(DiffuseError, match="draft_lora applies to mode 'diffusion'"):
        model.forward(ids, mode="ar", draft_lora=True)


def test_a_model_without_it_refuses_the_hook(tiny_gguf):
    plain = diffuse.load(str(tiny_gguf("nemotron-diffusion", "f32")))
    assert plain.hparams["draft_lora_rank"] == 0
    with pytest.raises(DiffuseError, match="with a draft LoRA"):
        plain.forward([1, 2, 3], draft_lora=True)


# ---- the loop ----

@pytest.mark.parametrize("draft_length", [2, 5, 32])
def test_self_spec_is_the_official_linear_spec_with_the_lora(agreeable, draft_length):
    """Drafts and acceptance counts at every iteration as the port's with the adapters on for the
    draft; with draft_lora off, as the port's without."""
    model, _, reference, _ = agreeable
    mask, eos = model.mask_token_id, model.tokenizer.eos_token_ids[0]
    for draft_lora in (True, False):
        for prompt in PROMPTS:
            events = []
            got = model.generate(prompt, mode="self_spec", draft_length=draft_length, gen_length=30, chat=False,
                                 draft_lora=draft_lora, on_step=events.append)
            want, iterations = ref.linear_spec_generate(reference, prompt, mask, 30, draft_length, eos, draft_lora)
            assert [int(t) for t in got.tokens[:len(want)]] == want
            assert [(list(e.spec_draft), e.spec_accepted) for e in events[1:]] == iterations


def test_self_spec_with_the_lora_is_still_ar(agreeable):
    """The LoRA changes drafts (and how many are kept), never the answer: mode ar's, token for
    token, at every draft length, with the default F16 cache too."""
    model, path, _, _ = agreeable
    changed = False
    for m in (model, diffuse.load(path)):
        for prompt in PROMPTS:
            ar = m.generate(prompt, mode="ar", gen_length=40, chat=False)
            for draft_length in (None, 3, 8):
                runs = {}
                for draft_lora in (True, False):
                    events = []
                    r = m.generate(prompt, mode="self_spec", draft_length=draft_length, gen_length=40, chat=False,
                                   draft_lora=draft_lora, on_step=events.append)
                    assert list(r.tokens) == list(ar.tokens), (prompt, draft_length, draft_lora)
                    runs[draft_lora] = [list(e.spec_draft) for e in events[1:]]
                changed |= runs[True] != runs[False]
    assert changed


# ---- a LoRA folder that does not fit ----

def _o_proj(i: int, ab: str) -> str:
    return f"base_model.model.encoder.layers.{i}.self_attn.o_proj.lora_{ab}.weight"


BAD = {
    "no weights": (lambda f: (f / "adapter_model.safetensors").unlink(), "no adapter_model.safetensors"),
    "no config": (lambda f: (f / "adapter_config.json").unlink(), "no adapter_config.json"),
    "other targets": (dict(config_edit=lambda c: c.update(target_modules=["q_proj", "v_proj"])),
                      r"target_modules = \['q_proj', 'v_proj'\], expected \['o_proj'\]"),
    "tensor on q_proj": (dict(edit=lambda t: t.update({_o_proj(0, "A").replace("o_proj", "q_proj"):
                                                       t[_o_proj(0, "A")]})),
                         "is a LoRA on q_proj; the draft LoRA targets o_proj only"),
    "rank mismatch": (dict(config_edit=lambda c: c.update(r=4)), r"rank 8, but adapter_config.json says r = 4"),
    "wrong shape": (dict(edit=lambda t: t.update({_o_proj(1, "B"): np.zeros((200, 8), np.float32)})),
                    r"has shape \[200, 8\], expected \[256, 8\] \(the model's o_proj maps 512 -> 256\)"),
    "missing layer": (dict(edit=lambda t: t.pop(_o_proj(1, "B"))), "no lora_B for layer 1's o_proj"),
    "layer past the model": (dict(edit=lambda t: t.update({_o_proj(5, "A"): t[_o_proj(0, "A")]})),
                             "is for layer 5; the model has 2 layers"),
    "not a tensor of it": (dict(edit=lambda t: t.update({"base_model.model.diffusion_head.weight":
                                                         np.zeros((2, 2), np.float32)})),
                           "unexpected tensor"),
    "DoRA": (dict(config_edit=lambda c: c.update(use_dora=True)), "use_dora = True"),
    "bad rank": (dict(config_edit=lambda c: c.update(r=0)), "r = 0 is not a rank"),
    "NaN": (dict(edit=lambda t: t[_o_proj(0, "B")].__setitem__((0, 0), np.nan)), "NaN or infinite"),
    "not JSON": (lambda f: (f / "adapter_config.json").write_text("{"), "not valid JSON"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_lora_folder_that_does_not_fit_is_refused(tmp_path, case):
    how, message = BAD[case]
    hf = write_nemotron_diffusion(tmp_path / "hf", dtype="f32")
    if callable(how):
        how(write_draft_lora(hf))
    else:
        write_draft_lora(hf, **how)
    out = tmp_path / "out.gguf"
    with pytest.raises(DiffuseError, match=message) as e:
        convert_hf(hf, out)
    assert "\n" not in str(e.value) and "linear_spec_lora" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]       # nothing written


def test_a_file_with_the_lora_in_some_layers_only_is_refused(agreeable, tmp_path):
    """A GGUF edited by hand: load fails in one line, naming the tensor."""
    _, path, _, _ = agreeable
    info = gguf_file.read(path)
    from gguf import GGUFReader
    reader = GGUFReader(path)
    keep = [t for t in reader.tensors if t.name != "blk.1.attn_output.weight.lora_a"]
    tensors = [gguf_file.OutTensor(t.name, int(t.tensor_type), tuple(int(d) for d in t.shape)) for t in keep]
    out = tmp_path / "partial.gguf"
    gguf_file.write(out, info.kv, info.kv_types, tensors, (np.asarray(t.data) for t in keep))
    with pytest.raises(DiffuseError, match="some layers only: tensor blk.1.attn_output.weight.lora_a is missing"):
        diffuse.load(out)


# ---- diffuse bench spec ----

def test_bench_spec_times_the_draft_both_ways(agreeable, tmp_path):
    from diffuse.bench import spec
    _, path, _, _ = agreeable
    result = spec.run(path, depth=16, draft_lengths=[1, 4], acceptance=[5.46, 6.82], threads=1, reps=1, ar_tokens=2)
    assert "draft_lora_ms" not in result["rows"][0] and result["rows"][1]["draft_lora_ms"] > 0
    row = result["rows"][1]
    assert row["iteration_ms"] == pytest.approx(row["draft_lora_ms"] + row["verify_ms"])
    assert {s["acceptance"]: s["draft"] for s in result["speed"] if s["k"] == 4} == {5.46: "base", 6.82: "LoRA"}
    assert "draft LoRA of rank 8" in spec.header(result)
    assert json.dumps(result, default=str)
