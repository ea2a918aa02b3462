"""LLaDA2.0/2.1 (GGUF arch "llada2", BailingMoeV2 blocks, block diffusion): conversion to llama.cpp's
bailingmoe2 names, logits and router choices against the float64 reference, greedy generation
token for token with the port of the official generate, hostile configs and headers.

The tiny checkpoint (tests/fixtures/tiny_models.py write_llada2) routes by a per-token code the
layers never overwrite, laid out so that every group and expert ranking is the code's whatever the
row's scale: rounding cannot flip a choice (the test measures the margins).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from fixtures.tiny_models import LLADA2_EXPERTS, LLADA2_GROUPS, LLADA2_GROUPS_USED, LLADA2_USED
from gguf import GGMLQuantizationType as T
from reference.block_generate import llada2_generate, llada21_generate
from gguf.quants import dequantize
from reference.forward import forward as reference_forward
from reference.forward import load as reference_load
from test_moe import _drop, _set, _without, relative_error, rewrite

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.convert import convert_hf
from diffuse.convert.families import LLADA2
from diffuse.generation import PRESETS
from diffuse.quantize import quantize_file, tensor_type

PROMPT = [5, 17, 42, 8, 99, 3, 61, 250, 13, 7, 77]

# Relative error against the float64 reference (max |diff| / max |logit|), 40 positions over two
# blocks of 32, F32 K/V without flash attention (measured): f32 3.7e-7, f16 6.7e-4, bf16 5.0e-3,
# q8_0 3.0e-2; with the defaults (F16 K/V, flash attention) f32 weights give 1.2e-3. The limits
# are the other families'.
LIMITS = {"f32": 1e-5, "f16": 5e-3, "bf16": 3e-2, "q8_0": 8e-2}
DEFAULTS_LIMIT = 5e-3
# The smallest router score gap at a cut (groups kept, experts chosen), float64: measured 4.1e-3,
# against F32 router arithmetic on code dimensions that every weight type stores exactly.
MIN_MARGIN = 2e-3


@pytest.fixture(scope="module")
def llada2(tiny_gguf):
    return diffuse.load(tiny_gguf("llada2", "f32"), threads=2, flash_attn=False, kv_f16=False)


def token_ids(model, n: int = 40) -> np.ndarray:
    ids = np.random.default_rng(11).integers(0, model.mask_token_id + 1, n)
    ids[[3, 10, 33, 34, 39]] = model.mask_token_id
    return ids


# ---- conversion ----

def test_conversion_writes_bailingmoe2_names_and_the_recipe(tiny_gguf):
    info = gguf_file.read(tiny_gguf("llada2", "f16"))
    kv, t = info.kv, {x.name: x for x in info.tensors}
    assert kv["general.architecture"] == "llada2"
    assert (kv["llada2.expert_count"], kv["llada2.expert_used_count"], kv["llada2.expert_group_count"],
            kv["llada2.expert_group_used_count"]) == (LLADA2_EXPERTS, LLADA2_USED, LLADA2_GROUPS, LLADA2_GROUPS_USED)
    assert (kv["llada2.leading_dense_block_count"], kv["llada2.expert_shared_count"],
            kv["llada2.expert_gating_func"], kv["llada2.expert_weights_norm"]) == (1, 1, 2, True)
    assert kv["llada2.expert_weights_scale"] == pytest.approx(2.5)
    assert (kv["llada2.rope.dimension_count"], kv["llada2.attention.key_length"]) == (32, 64)
    assert kv["diffusion.block_size"] == 32 and kv["diffusion.shift_logits"] is False
    assert (kv["diffuse.recipe.block_length"], kv["diffuse.recipe.steps"], kv["diffuse.recipe.scheduler"]) == \
        (32, 32, "low_confidence_dynamic")
    assert kv["diffuse.recipe.confidence_threshold"] == pytest.approx(0.95)
    assert t["blk.0.attn_qkv.weight"].shape == (256, (4 + 2 * 2) * 64)
    assert t["blk.0.ffn_gate.weight"].shape == (256, 512) and "blk.0.ffn_gate_inp.weight" not in t
    assert t["blk.1.ffn_gate_exps.weight"].shape == (256, 256, LLADA2_EXPERTS) and "blk.1.ffn_gate.weight" not in t
    assert t["blk.2.ffn_down_shexp.weight"].shape == (256, 256)
    assert t["blk.1.ffn_gate_inp.weight"].type == t["blk.1.exp_probs_b.bias"].type == T.F32
    assert t["blk.1.ffn_up_exps.weight"].type == T.F16


# The generate() signatures of the remote code each checkpoint ships (modeling_llada2_moe.py), as read.
GENERATE_2_0 = ("def generate(self, inputs=None, temperature=0.0, block_length=32, steps=32, gen_length=2048,\n"
                "             top_p=None, top_k=None, eos_early_stop=False, minimal_topk=1, threshold=0.95,\n"
                "             eos_id=156892, mask_id=156895):\n")
GENERATE_2_1 = GENERATE_2_0.replace("threshold=0.95,", "threshold=0.95, editing_threshold=0.9, max_post_steps=16,")


@pytest.mark.parametrize("code,editing", [(GENERATE_2_1, True), (GENERATE_2_0, False), (None, False)])
def test_a_2_1_checkpoint_gets_editing_in_its_recipe(code, editing, tiny_hf_llada2, tmp_path):
    """No key of LLaDA2.1's config.json tells it from 2.0; its remote code's generate() takes editing_threshold. The
    recipe is then the card's quality mode (the preset); otherwise, or without the file, 2.0's."""
    folder = tmp_path / "hf"
    shutil.copytree(tiny_hf_llada2, folder)
    if code is not None:
        (folder / "modeling_llada2_moe.py").write_text(code)
    kv = gguf_file.read(convert_hf(folder, tmp_path / "out.gguf", "f16")).kv
    recipe = {k.removeprefix("diffuse.recipe."): v for k, v in kv.items() if k.startswith("diffuse.recipe.")}
    want = PRESETS["llada2.1-quality"] if editing else {"confidence_threshold": 0.95}
    assert {k: recipe.get(k) for k in want} == pytest.approx(want)
    assert ("editing_threshold" in recipe) == editing


def test_hparams(llada2):
    hp = llada2.hparams
    assert (hp["arch"], hp["family"]) == ("llada2", "sdar")
    assert (hp["block_size"], hp["n_expert"], hp["n_expert_used"]) == (32, 16, 4)
    assert llada2.mask_token_id == llada2.tokenizer.mask_token_id
    assert llada2.recipe["steps"] == 32
    assert (hp["router"], hp["n_expert_groups"], hp["n_group_used"], hp["n_expert_shared"], hp["n_layer_dense"],
            hp["n_rot"]) == ("sigmoid", 4, 2, 1, 1, 32)
    assert hp["expert_weights_scale"] == pytest.approx(2.5)


def test_an_llada2_file_reports_its_architecture_and_its_family(llada2, tiny_gguf):
    """An LLaDA2 file is an llada2 (what labels show) that runs SDAR's loop and defaults (its family):
    the engine says both, wherever Python asks."""
    from diffuse import info
    from diffuse.generation import ARCHITECTURES, default_options
    path = tiny_gguf("llada2", "f32")
    assert (llada2.arch, llada2.family) == ("llada2", "sdar")
    read = gguf_file.read(path)
    assert (read.arch, read.family, read.dialect) == ("llada2", "sdar", "diffuse")
    d = info.describe(path)
    assert (d["architecture"], d["family"]) == ("llada2", "sdar")
    assert "architecture  llada2 (family sdar" in info.format_info(d)
    assert ARCHITECTURES["llada2"] | {"default_mask_id": None} == {
        "name": "llada2", "family": "sdar", "loop": "masked", "moe": True, "shift_logits": False,
        "block_diffusion": True, "default_mask_id": None}
    assert default_options("llada2") == default_options("sdar")


def test_info_shows_the_router(tiny_gguf):
    from diffuse import info
    text = info.format_info(info.describe(tiny_gguf("llada2", "f32")))
    assert "router sigmoid with selection bias, 2 of 4 groups, weights x 2.5" in text
    assert "rope over 32 of 64 dims" in text


# ---- parity with the float64 reference ----

@pytest.mark.parametrize("outtype", list(LIMITS))
def test_logits_match_the_reference(outtype, tiny_gguf, tiny_hf_llada2):
    """F32 K/V without flash attention, then the defaults (F16 K/V, flash attention)."""
    ids = token_ids(diffuse.load(tiny_gguf("llada2", "f32")))
    want = reference_forward(tiny_hf_llada2, ids.tolist())
    exact = diffuse.load(tiny_gguf("llada2", outtype), threads=2, flash_attn=False, kv_f16=False)
    err = relative_error(exact.forward(ids), want)
    assert err < LIMITS[outtype], f"{outtype}: {err:.2e}"
    default = diffuse.load(tiny_gguf("llada2", outtype), threads=2)
    err = relative_error(default.forward(ids), want)
    assert err < max(LIMITS[outtype], DEFAULTS_LIMIT), f"{outtype} defaults: {err:.2e}"


def test_short_sequences_and_other_blocks_match_the_reference(llada2, tiny_hf_llada2):
    for n, block in ((1, None), (7, None), (40, 8)):
        ids = token_ids(llada2)[:n]
        err = relative_error(llada2.forward(ids, block_size=block),
                             reference_forward(tiny_hf_llada2, ids.tolist(), block_size=block))
        assert err < LIMITS["f32"], f"n={n} block={block}: {err:.2e}"


def test_router_choices_match_the_reference_with_margins(llada2, tiny_hf_llada2):
    """Step 0 of a generation: every MoE layer's k experts of every row it reports are the
    reference's, best first; the dense layer routes nothing."""
    seen = []
    llada2.generate(PROMPT, gen_length=32, steps=32, cache=False, chat=False, on_step=seen.append,
                    expert_routing=True)
    ev = seen[0]
    x = PROMPT + [llada2.mask_token_id] * (32 - len(PROMPT))
    routing = []
    reference_forward(tiny_hf_llada2, x, routing=routing)
    assert len(routing) == 2 and (ev.experts[0] == -1).all()
    for layer, (chosen, margin) in zip(ev.experts[1:], routing):
        assert margin.min() > MIN_MARGIN
        rows = (layer != -1).all(axis=1)
        assert rows.sum() >= len(x) - len(PROMPT)          # at least the masked rows
        np.testing.assert_array_equal(layer[rows], chosen[ev.active[rows]])


# ---- quantisation: llama.cpp's MoE mixture ----

def test_q4_k_m_uses_llama_cpp_mixture(tiny_gguf, tiny_hf_llada2, tmp_path):
    """Router and expert bias F32; experts row-wise in the default type, ffn_down (routed, shared
    and dense) Q6_K on use_more_bits layers; the fused attn_qkv one step up. Logits against the
    reference on the file's own (dequantised) weights: measured 3.2e-2 (LLaDA-MoE 1.4e-2, dense 2.7e-2 to 3.6e-2)."""
    path = quantize_file(tiny_gguf("llada2", "f32"), tmp_path / "q4.gguf", "Q4_K_M")
    types = {t.name: T(t.type) for t in gguf_file.read(path).tensors}
    assert types["blk.1.ffn_gate_inp.weight"] == types["blk.1.exp_probs_b.bias"] == T.F32
    assert types["blk.1.ffn_gate_exps.weight"] == types["blk.1.ffn_up_shexp.weight"] == T.Q4_K
    # use_more_bits picks layer 2 of 3 (the last eighth)
    assert types["blk.2.ffn_down_exps.weight"] == types["blk.2.ffn_down_shexp.weight"] == T.Q6_K
    assert types["blk.0.ffn_down.weight"] == types["blk.1.ffn_down_exps.weight"] == T.Q4_K
    assert types["blk.0.attn_qkv.weight"] == T.Q5_K and types["output.weight"] == T.Q6_K
    model = diffuse.load(path, threads=2)
    ids = token_ids(model)
    want = reference_forward(tiny_hf_llada2, ids.tolist(), file_weights(path, tiny_hf_llada2))
    err = relative_error(model.forward(ids), want)
    assert err < 6e-2, f"Q4_K_M on its own weights: {err:.2e}"


def file_weights(path, hf_dir) -> dict[str, np.ndarray]:
    """The GGUF file's tensors, dequantized, under their Hugging Face names (experts split)."""
    names = {**LLADA2.tensors, **LLADA2.dense_tensors, **LLADA2.moe_tensors}
    weights = dict(reference_load(str(hf_dir))[1])
    for t in gguf_file.read(path).tensors:
        x = dequantize(np.asarray(t.raw()), T(t.type)).reshape(t.shape[::-1]).astype(np.float64)
        layer = t.name.split(".")[1] if t.name.startswith("blk.") else None
        pattern = t.name.replace(f"blk.{layer}.", "blk.{i}.") if layer else t.name
        if pattern in LLADA2.experts:
            for e in range(x.shape[0]):
                weights[LLADA2.experts[pattern].format(i=layer, e=e)] = x[e]
        else:
            weights[names[pattern].format(i=layer)] = x
    return weights


def test_q4_k_m_mixture_of_llada2_mini():
    """LLaDA2.1-mini's shapes (20 layers, 256 experts)."""
    def t(name, shape=(2048, 2048)):
        return tensor_type(name, shape, "Q4_K_M", n_layer=20, has_output=True, n_expert=256)
    assert t("blk.0.attn_qkv.weight", (2048, 3072)) == t("blk.7.attn_qkv.weight", (2048, 3072)) == T.Q5_K
    assert t("blk.19.ffn_down_exps.weight", (512, 2048, 256)) == t("blk.0.ffn_down.weight", (5120, 2048)) == T.Q6_K
    assert t("blk.3.ffn_down_exps.weight", (512, 2048, 256)) == T.Q4_K
    assert t("blk.1.ffn_gate_inp.weight", (2048, 256)) == t("blk.1.exp_probs_b.bias", (256,)) == T.F32


# ---- generation: the port of the official generate ----

class EngineLogits:
    """The port's model interface over the engine's forward (every pass the window 0..b1-1)."""

    def __init__(self, model, block_size):
        self.model, self.block_size = model, block_size

    def logits(self, x, b0, b1):
        return self.model.forward(np.array(x[:b1], np.int32), block_size=self.block_size)[b0:b1].astype(np.float64)


@pytest.mark.parametrize("n_prompt", [11, 32])
@pytest.mark.parametrize("block_length,steps,threshold", [(32, 32, 0.95), (8, 4, 0.3), (8, 8, 0.05)])
def test_greedy_generation_matches_the_official_loop(llada2, n_prompt, block_length, steps, threshold):
    """Token for token the port of LLaDA2's generate (greedy, our stated differences), the engine
    with its exact cache on; the port driven by the engine's own forward, recomputing every pass."""
    prompt = (PROMPT * 3)[:n_prompt]
    eos = llada2.tokenizer.eos_token_ids[0]
    want = llada2_generate(EngineLogits(llada2, block_length), prompt, llada2.mask_token_id, eos, 48,
                           block_length, steps, threshold)
    got = llada2.generate(prompt, gen_length=48, steps=steps, block_length=block_length, chat=False,
                          scheduler="low_confidence_dynamic", confidence_threshold=threshold, temperature=0)
    n = len(want.tokens)
    assert got.tokens[:n].tolist() == want.tokens
    assert got.steps == len(want.passes)


# ---- LLaDA2.1's token-to-token editing: the port of its generate ----

# Edits in the parity runs (the port's count; n_prompt 11 / 32), measured: the speed mode's
# thresholds 629 / 2016 (every differing token is edited, so post steps run to the budget), 0.02
# 114 / 76, 0.03 8 / 4 (blocks end at a post step that edits nothing). The tiny model's x0 is
# rarely above a few percent likely, so higher editing thresholds edit nothing here.
@pytest.mark.parametrize("n_prompt", [11, 32])
@pytest.mark.parametrize("block_length,threshold,editing_threshold,max_post_steps",
                         [(32, 0.5, 0.0, 16), (8, 0.3, 0.02, 4), (8, 0.3, 0.03, 4)])
def test_editing_matches_the_official_loop(llada2, n_prompt, block_length, threshold, editing_threshold,
                                           max_post_steps):
    """Token for token, commit for commit and edit for edit the port of LLaDA2.1's generate
    (greedy, our stated differences), the engine with its exact cache on (steps = block_length:
    the official floor of one commit per pass)."""
    prompt = (PROMPT * 3)[:n_prompt]
    eos = llada2.tokenizer.eos_token_ids[0]
    want = llada21_generate(EngineLogits(llada2, block_length), prompt, llada2.mask_token_id, eos, 48,
                            block_length, threshold, editing_threshold, max_post_steps)
    assert sum(len(e) for e in want.edits) > 0
    events = []
    got = llada2.generate(prompt, gen_length=48, steps=block_length, block_length=block_length, chat=False,
                          scheduler="low_confidence_dynamic", confidence_threshold=threshold,
                          editing_threshold=editing_threshold, max_post_steps=max_post_steps, temperature=0,
                          on_step=events.append)
    assert got.tokens[:len(want.tokens)].tolist() == want.tokens
    assert got.steps == len(want.passes) == len(events)
    assert [e.unmasked.tolist() for e in events] == [[pos for pos, _ in c] for _, c in want.passes]
    assert [e.edited.tolist() for e in events] == [[pos for pos, _ in e] for e in want.edits]
    for before, e, edits in zip(events, events[1:], want.edits[1:]):   # edits change committed tokens only
        assert all(not before.mask[pos] and e.tokens[pos] == tok != before.tokens[pos] for pos, tok in edits)


def test_editing_in_a_batch_is_each_prompts_own(llada2):
    """A batch mixing an editing sequence with one that does not: each gets its own tokens and steps."""
    opts = dict(gen_length=48, steps=8, block_length=8, chat=False, scheduler="low_confidence_dynamic",
                confidence_threshold=0.3, temperature=0)
    editing = dict(editing_threshold=0.02, max_post_steps=4)
    prompts = [PROMPT, (PROMPT * 3)[:32]]
    alone = [llada2.generate(prompts[0], **opts, **editing), llada2.generate(prompts[1], **opts)]
    batch = llada2.generate_batch(prompts, **opts, per_prompt=[editing, {}])
    assert [r.tokens.tolist() for r in batch] == [r.tokens.tolist() for r in alone]
    assert [r.steps for r in batch] == [r.steps for r in alone]


def test_editing_off_is_the_2_0_loop(llada2):
    """editing_threshold 1 (the default) edits nothing and runs no post step, whatever max_post_steps."""
    opts = dict(gen_length=48, steps=8, block_length=8, chat=False, scheduler="low_confidence_dynamic",
                confidence_threshold=0.3, temperature=0)
    a = llada2.generate(PROMPT, **opts)
    b = llada2.generate(PROMPT, **opts, editing_threshold=1.0, max_post_steps=16)
    assert a.tokens.tolist() == b.tokens.tolist() and a.steps == b.steps


@pytest.mark.parametrize("arch", ["llada", "fast-dllm-v2"])
def test_editing_is_refused_where_the_cache_or_shift_forbid_it(arch, tiny_gguf):
    model = diffuse.load(tiny_gguf(arch, "f32"), threads=1)
    with pytest.raises(DiffuseError, match="editing_threshold applies to block-diffusion models without shifted"):
        model.generate(PROMPT, gen_length=32, chat=False, editing_threshold=0.5)


@pytest.mark.parametrize("value,match", [(-0.1, "editing_threshold = -0.1 is out of range"),
                                         (1.5, "editing_threshold = 1.5 is out of range")])
def test_bad_editing_values_are_refused(llada2, value, match):
    with pytest.raises(DiffuseError, match=match):
        llada2.generate(PROMPT, gen_length=32, chat=False, editing_threshold=value)


@pytest.mark.parametrize("name", ["llada2.1-speed", "llada2.1-quality"])
def test_presets_from_the_cli_and_the_server(name, llada2, tiny_gguf, capsys):
    """--preset and a request's "preset": the mode's options over the model's defaults, the flags
    and fields given over the mode."""
    from diffuse.cli import main
    from diffuse.serve import protocol
    code = main(["generate", "-m", str(tiny_gguf("llada2", "f32")), "-p", "Hello", "--no-chat", "--gen-length", "32",
                 "--threads", "1", "--json", "--preset", name, "--max-post-steps", "3"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["options"] == {**out["options"], **PRESETS[name], "max_post_steps": 3}
    body = json.dumps({"prompt": "Hello", "max_tokens": 32, "preset": name, "confidence_threshold": 0.6}).encode()
    r = protocol.parse(body, "completion", llada2, 8)
    assert r.options == {**r.options, **PRESETS[name], "confidence_threshold": pytest.approx(0.6)}
    with pytest.raises(protocol.BadRequest, match="unknown preset 'fast'") as e:
        protocol.parse(json.dumps({"prompt": "Hello", "preset": "fast"}).encode(), "completion", llada2, 8)
    assert e.value.param == "preset"


def test_a_stream_sends_only_text_editing_cannot_change(tiny_gguf):
    """With editing a committed token may change until its block is finished: the server streams
    a block's text once it is, so the deltas add up to the final answer (the S mode edits most)."""
    import openai
    from diffuse.serve import Server
    model = diffuse.load(tiny_gguf("llada2", "f32"), threads=1)
    server = Server(model, port=0, max_batch=2)
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
        body = dict(model="m", prompt="Hello there", max_tokens=64)
        whole = client.completions.create(**body, extra_body={"preset": "llada2.1-speed"}).choices[0].text
        events, parts = [], []
        for chunk in client.completions.create(**body, stream=True,
                                               extra_body={"preset": "llada2.1-speed", "diffusion_events": True}):
            if chunk.choices:
                parts.append(chunk.choices[0].text)
            else:
                events.append(chunk.model_extra["diffusion"])
        assert sum(len(e["edited"]) for e in events) > 0
        assert "".join(parts) == whole
    finally:
        server.stop()


def test_the_recipe_is_the_default(llada2):
    a = llada2.generate(PROMPT, gen_length=32, chat=False)
    b = llada2.generate(PROMPT, gen_length=32, chat=False, steps=32, block_length=32,
                        scheduler="low_confidence_dynamic", confidence_threshold=0.95, temperature=0)
    assert a.tokens.tolist() == b.tokens.tolist()


# ---- bad input: one clear error, before anything is allocated ----

@pytest.mark.parametrize("change,match", [
    ({"n_group": 0}, "n_group = 0 is not an integer from 1"),
    ({"topk_group": 5}, "topk_group = 5 exceeds n_group = 4"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok = 9 exceeds the 8 experts of the topk_group = 2 groups"),
    ({"n_group": 3}, "num_experts = 16 does not split into n_group = 3 equal groups"),
    ({"n_group": 16}, "does not split into n_group = 16 equal groups of at least 2"),
    ({"first_k_dense_replace": 4}, "first_k_dense_replace = 4 exceeds the 3 layers"),
    ({"partial_rotary_factor": 0.01}, "gives 0 of 64 dimensions"),
    ({"score_function": "softmax"}, "score_function = 'softmax' is a llada2 variant"),
    ({"moe_intermediate_size": 128}, r"has shape \[256, 256\], expected \[128, 256\]"),
])
def test_bad_config_is_refused(change, match, tiny_hf_llada2, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(tiny_hf_llada2, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(DiffuseError, match=match):
        convert_hf(folder, tmp_path / "out.gguf", "f16")
    assert not (tmp_path / "out.gguf").exists()


def test_missing_expert_bias_is_refused(tmp_path):
    from fixtures.tiny_models import write_llada2
    folder = write_llada2(tmp_path / "hf", edit=lambda t: t.pop("model.layers.2.mlp.gate.expert_bias"))
    with pytest.raises(DiffuseError, match="missing tensor model.layers.1.mlp.gate.expert_bias|"
                                           "missing tensor model.layers.2.mlp.gate.expert_bias"):
        convert_hf(folder, tmp_path / "out.gguf", "f16")


def _wide_qkv(tensors, data):
    """blk.1.attn_qkv with one head too many (its bytes padded to match)."""
    out_t, out_d = [], []
    for t, d in zip(tensors, data):
        if t.name == "blk.1.attn_qkv.weight":
            t = gguf_file.OutTensor(t.name, t.type, (t.shape[0], t.shape[1] + 64))
            d = np.concatenate([np.asarray(d), np.asarray(d)[:64]])
        out_t.append(t)
        out_d.append(d)
    return out_t, out_d


@pytest.mark.parametrize("kv_edit,tensor_edit,match", [
    (_set("llada2.expert_group_count", 0), None, r"expert_group_count = 0 is outside \[1, 16\]"),
    (_set("llada2.expert_group_used_count", 5), None, r"expert_group_used_count = 5 is outside \[1, 4\]"),
    (_set("llada2.expert_used_count", 9), None, "expert_used_count = 9 exceeds the 8 experts of the 2 groups kept"),
    (_set("llada2.expert_group_count", 3), None, "16 experts do not split into 3 equal groups"),
    (_set("llada2.expert_group_count", 16), None, "needs at least two"),
    (_set("llada2.leading_dense_block_count", 9), None, r"leading_dense_block_count = 9 is outside \[0, 3\]"),
    (_set("llada2.rope.dimension_count", 128), None, r"rope.dimension_count = 128 is outside \[2, 64\]"),
    (_set("llada2.expert_gating_func", 1), None, "llada2 routes by sigmoid"),
    (None, _without("blk.2.exp_probs_b.bias"), "missing tensor blk.2.exp_probs_b.bias"),
    (None, _without("blk.1.ffn_up_shexp.weight"), "missing tensor blk.1.ffn_up_shexp.weight"),
    (_drop("llada2.leading_dense_block_count"), None, "missing tensor blk.0.ffn_gate_inp.weight"),
    (None, _wide_qkv, r"blk.1.attn_qkv.weight has shape \[256, 576\], expected \[256, 512\]"),
])
def test_hostile_header_is_a_clear_error(kv_edit, tensor_edit, match, tiny_gguf, tmp_path):
    path = rewrite(tiny_gguf("llada2", "f32"), tmp_path / "bad.gguf", kv_edit, tensor_edit)
    with pytest.raises(DiffuseError, match=match):
        diffuse.load(path)
