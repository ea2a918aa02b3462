"""LLaDA-MoE (GGUF arch "llada-moe"): conversion, loading in our dialect and llama.cpp's, logits
against the float64 reference, routing, the denoising loop (cache, schedulers, batches),
quantisation with llama.cpp's MoE mixture, hostile headers, and the experts in the events.

The tiny checkpoint (tests/fixtures/tiny_models.py write_llada_moe) routes by a per-token code the
layers never overwrite, so rounding in any weight type cannot flip an expert choice: every
difference from the reference is arithmetic, measured by the same relative error as
test_forward_parity.py.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from fixtures.dialects import to_llama_cpp
from fixtures.tiny_models import MOE_EXPERTS, MOE_USED
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from reference.forward import forward as reference_forward
from reference.forward import load as reference_load

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.convert import convert_hf
from diffuse.convert.families import LLADA_MOE
from diffuse.quantize import quantize_file, tensor_type

PROMPT = [5, 17, 42, 8, 99, 3]

# Relative error against the reference on the checkpoint (measured, 24 positions, F32 K/V):
# f32 2.7e-7, f16 5.6e-4, bf16 3.4e-3, q8_0 1.8e-2 (the dense families' orders of magnitude, so
# their limits); with the F16 K/V cache and flash attention f32 weights give 9.2e-4.
LIMITS = {"f32": 1e-5, "f16": 5e-3, "bf16": 3e-2, "q8_0": 8e-2}
KV_F16_LIMIT = 5e-3


@pytest.fixture(scope="module")
def moe(tiny_gguf):
    return diffuse.load(tiny_gguf("llada-moe", "f32"), threads=2)


def token_ids(model, n: int = 24) -> np.ndarray:
    ids = np.random.default_rng(7).integers(0, model.mask_token_id + 1, n)
    ids[[3, 10, 11, 20]] = model.mask_token_id
    return ids


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


# ---- conversion and loading ----

def test_conversion_writes_llama_cpp_moe_layout(tiny_gguf):
    info = gguf_file.read(tiny_gguf("llada-moe", "f16"))
    kv = info.kv
    assert kv["general.architecture"] == "llada-moe"
    assert (kv["llada-moe.expert_count"], kv["llada-moe.expert_used_count"],
            kv["llada-moe.expert_feed_forward_length"]) == (MOE_EXPERTS, MOE_USED, 256)
    assert kv["diffusion.shift_logits"] is False and kv["llada-moe.attention.causal"] is False
    assert kv["tokenizer.ggml.mask_token_id"] == diffuse.load(info.path).mask_token_id
    t = {x.name: x for x in info.tensors}
    assert t["blk.0.ffn_gate_exps.weight"].shape == (256, 256, MOE_EXPERTS)
    assert t["blk.1.ffn_down_exps.weight"].shape == (256, 256, MOE_EXPERTS)
    assert t["blk.0.ffn_gate_inp.weight"].type == T.F32      # the router is never rounded
    assert t["blk.0.ffn_up_exps.weight"].type == T.F16
    assert t["blk.0.attn_q_norm.weight"].shape == (64,)
    assert not any("ffn_gate.weight" in name for name in t)


def test_hparams(moe):
    hp = moe.hparams
    assert (hp["arch"], hp["family"], hp["dialect"], hp["rope_mode"]) == ("llada-moe", "llada", "diffuse", "neox")
    assert (hp["n_expert"], hp["n_expert_used"], hp["n_ff_exp"], hp["qk_norm"]) == (MOE_EXPERTS, MOE_USED, 256, True)
    assert moe.n_expert == MOE_EXPERTS and hp["shift_logits"] is False


@pytest.mark.parametrize("outtype", list(LIMITS))
@pytest.mark.parametrize("kv_f16", [False, True])
def test_logits_match_reference(outtype, kv_f16, tiny_gguf, tiny_hf_llada_moe):
    model = diffuse.load(tiny_gguf("llada-moe", outtype), threads=2, kv_f16=kv_f16, flash_attn=kv_f16)
    ids = token_ids(model)
    err = relative_error(model.forward(ids), reference_forward(tiny_hf_llada_moe, ids))
    assert err < max(LIMITS[outtype], KV_F16_LIMIT if kv_f16 else 0), f"{outtype} kv_f16={kv_f16}: {err:.2e}"


def test_short_and_long_sequences_match_reference(tiny_gguf, tiny_hf_llada_moe):
    model = diffuse.load(tiny_gguf("llada-moe", "f32"), threads=1, kv_f16=False)
    for n in (1, 5, 100):
        ids = np.resize(token_ids(model), n)
        err = relative_error(model.forward(ids), reference_forward(tiny_hf_llada_moe, ids))
        assert err < LIMITS["f32"], f"n={n}: {err:.2e}"


def test_llama_cpp_dialect_is_the_same_model(tiny_gguf, tmp_path):
    ours = diffuse.load(tiny_gguf("llada-moe", "f32"))
    theirs = diffuse.load(to_llama_cpp(tiny_gguf("llada-moe", "f32"), tmp_path / "llama_cpp.gguf"))
    assert theirs.dialect == "llama.cpp" and theirs.hparams["n_expert"] == MOE_EXPERTS
    assert theirs.mask_token_id == ours.mask_token_id
    ids = token_ids(ours)
    np.testing.assert_array_equal(theirs.forward(ids), ours.forward(ids))


def test_repacked_attention_with_mapped_experts(tiny_gguf, tmp_path):
    """repack=True moves the 2-D matrices into ggml's CPU layout; the 3-D experts stay mapped.
    Only the summation order differs (see test_repack.py): float rounding."""
    path = quantize_file(tiny_gguf("llada-moe", "f32"), tmp_path / "q4_0.gguf", "Q4_0")
    plain = diffuse.load(path, threads=2, kv_f16=False)
    repacked = diffuse.load(path, threads=2, repack=True, kv_f16=False)
    experts = sum(t.nbytes for t in gguf_file.read(path).tensors if t.name.endswith("_exps.weight"))
    assert 0 < repacked.repacked_bytes <= repacked.weights_bytes - experts
    ids = token_ids(plain)
    assert relative_error(repacked.forward(ids), plain.forward(ids)) < 1e-3


def rewrite(src, out, kv_edit=None, tensor_edit=None):
    """A copy of a GGUF with its metadata and tensor table edited (hostile-file tests)."""
    info = gguf_file.read(src)
    kv, types = dict(info.kv), dict(info.kv_types)
    if kv_edit:
        kv_edit(kv, types)
    tensors = [gguf_file.OutTensor(t.name, t.type, t.shape) for t in info.tensors]
    data = [t.raw() for t in info.tensors]
    if tensor_edit:
        tensors, data = tensor_edit(tensors, data)
    gguf_file.write(out, kv, types, tensors, data)
    return out


def _set(key, value):
    def edit(kv, types):
        kv[key] = value
    return edit


def _drop(key):
    def edit(kv, types):
        del kv[key], types[key]
    return edit


def _half_experts(tensors, data):
    """blk.0.ffn_up_exps with 4 experts instead of 8 (its bytes halved to match)."""
    out_t, out_d = [], []
    for t, d in zip(tensors, data):
        if t.name == "blk.0.ffn_up_exps.weight":
            t = gguf_file.OutTensor(t.name, t.type, t.shape[:2] + (MOE_EXPERTS // 2,))
            d = np.asarray(d)[: d.shape[0] // 2]
        out_t.append(t)
        out_d.append(d)
    return out_t, out_d


def _without(name):
    def edit(tensors, data):
        keep = [i for i, t in enumerate(tensors) if t.name != name]
        return [tensors[i] for i in keep], [data[i] for i in keep]
    return edit


@pytest.mark.parametrize("kv_edit,tensor_edit,match", [
    (_set("llada-moe.expert_used_count", MOE_EXPERTS + 1), None, r"expert_used_count = 9 is outside \[1, 8\]"),
    (_set("llada-moe.expert_count", 0), None, r"expert_count = 0 is outside"),
    (_set("llada-moe.expert_count", 100000), None, r"expert_count = 100000 is outside"),
    (_drop("llada-moe.expert_count"), None, "missing key llada-moe.expert_count"),
    (_drop("llada-moe.expert_feed_forward_length"), _without("blk.0.ffn_gate_exps.weight"),
     r"missing key llada-moe.expert_feed_forward_length|missing tensor blk.0.ffn_gate_exps"),
    (_set("llada-moe.expert_count", 4), None, r"ffn_gate_inp.weight has shape \[256, 8\], expected \[256, 4\]"),
    (None, _half_experts, r"blk.0.ffn_up_exps.weight has shape \[256, 256, 4\], expected \[256, 256, 8\]"),
    (None, _without("blk.1.attn_k_norm.weight"), "missing tensor blk.1.attn_k_norm.weight"),
])
def test_hostile_moe_header_is_a_clear_error(kv_edit, tensor_edit, match, tiny_gguf, tmp_path):
    path = rewrite(tiny_gguf("llada-moe", "f32"), tmp_path / "bad.gguf", kv_edit, tensor_edit)
    with pytest.raises(DiffuseError, match=match):
        diffuse.load(path)


def test_llama_cpp_file_without_mask_id_falls_back_to_156895(tiny_gguf, tmp_path):
    """LLaDA-MoE's mask id; outside a tiny vocabulary, so loading says so."""
    path = rewrite(tiny_gguf("llada-moe", "f32"), tmp_path / "m.gguf", _drop("tokenizer.ggml.mask_token_id"))
    with pytest.raises(DiffuseError, match="156895"):
        diffuse.load(path)


@pytest.mark.parametrize("change,match", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok = 9 exceeds num_experts = 8"),
    ({"num_experts": 0}, "num_experts = 0 is not an integer from 1"),
    ({"shared_expert_intermediate_size": 512}, "shared_expert_intermediate_size = 512 is a llada-moe variant"),
    ({"moe_router_score_function": "sigmoid"}, "moe_router_score_function = 'sigmoid'"),
    ({"expert_intermediate_size": 128}, r"experts.0.gate_proj.weight has shape \[256, 256\], expected \[128, 256\]"),
])
def test_bad_moe_config_is_refused(change, match, tiny_hf_llada_moe, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(tiny_hf_llada_moe, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(DiffuseError, match=match):
        convert_hf(folder, tmp_path / "out.gguf", "f16")
    assert not (tmp_path / "out.gguf").exists()


# ---- quantisation ----

def file_weights(path, hf_dir) -> dict[str, np.ndarray]:
    """The GGUF file's tensors, dequantized, under their Hugging Face names (experts split)."""
    info = gguf_file.read(path)
    n_layer = info.kv["llada-moe.block_count"]
    _, weights = reference_load(str(hf_dir))
    weights = dict(weights)
    for t in info.tensors:
        x = dequantize(np.asarray(t.raw()), T(t.type)).reshape(t.shape[::-1]).astype(np.float64)
        for pattern, hf in {**LLADA_MOE.tensors, **LLADA_MOE.experts}.items():
            for i in range(n_layer):
                if pattern.format(i=i) != t.name:
                    continue
                if pattern in LLADA_MOE.experts:
                    for e in range(x.shape[0]):
                        weights[hf.format(i=i, e=e)] = x[e]
                else:
                    weights[hf.format(i=i)] = x
    return weights


def test_q4_k_m_uses_llama_cpp_moe_mixture(tiny_gguf, tiny_hf_llada_moe, tmp_path):
    path = quantize_file(tiny_gguf("llada-moe", "f32"), tmp_path / "q4.gguf", "Q4_K_M")
    types = {t.name: T(t.type) for t in gguf_file.read(path).tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == T.F32          # llama.cpp never quantises the router
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.1.ffn_up_exps.weight"] == T.Q4_K
    # use_more_bits picks layer 1 of 2 (the last eighth): ffn_down, the experts' included
    assert types["blk.0.ffn_down_exps.weight"] == T.Q4_K and types["blk.1.ffn_down_exps.weight"] == T.Q6_K
    # 8 experts: llama.cpp's rule for Mixtral-like models
    assert types["blk.0.attn_v.weight"] == types["blk.1.attn_k.weight"] == T.Q8_0
    assert types["blk.0.attn_output.weight"] == T.Q5_K
    assert types["output.weight"] == T.Q6_K
    model = diffuse.load(path, threads=2)
    ids = token_ids(model)
    want = reference_forward(tiny_hf_llada_moe, ids, file_weights(path, tiny_hf_llada_moe))
    err = relative_error(model.forward(ids), want)
    assert err < 6e-2, f"Q4_K_M on its own weights: {err:.2e}"   # measured 1.4e-2 (dense: 2.7e-2 / 3.6e-2)


def test_q4_k_m_mixture_of_a_64_expert_model():
    """LLaDA-MoE-7B-A1B (16 layers, 64 experts): the dense rules, experts included."""
    def t(name, shape=(2048, 2048)):
        return tensor_type(name, shape, "Q4_K_M", n_layer=16, has_output=True, n_expert=64)
    assert t("blk.0.attn_v.weight") == t("blk.15.ffn_down_exps.weight", (1024, 2048, 64)) == T.Q6_K
    assert t("blk.3.attn_v.weight") == t("blk.3.ffn_down_exps.weight", (1024, 2048, 64)) == T.Q4_K
    assert t("blk.4.attn_v.weight") == T.Q6_K                 # every third layer in between
    assert t("blk.0.attn_k.weight") == t("blk.0.attn_output.weight") == t("blk.0.ffn_up_exps.weight") == T.Q4_K
    assert t("blk.0.ffn_gate_inp.weight", (2048, 64)) == T.F32


# ---- the denoising loop ----

def test_cache_refreshed_every_step_is_exact(moe):
    kw = dict(gen_length=32, steps=16, block_length=8)
    assert moe.generate(PROMPT, cache=True, refresh_every=1, **kw).tokens.tolist() == \
        moe.generate(PROMPT, cache=False, **kw).tokens.tolist()


@pytest.mark.parametrize("scheduler", ["low_confidence", "random", "entropy_exit", "origin", "maskgit_plus",
                                       "topk_margin", "entropy"])
def test_every_scheduler_fills_the_buffer(moe, scheduler):
    r = moe.generate(PROMPT, gen_length=16, steps=8, block_length=8, scheduler=scheduler, cache=True, seed=3)
    assert (r.tokens != moe.mask_token_id).all() and r.steps >= 2


def test_batch_matches_single_runs(moe):
    prompts, kw = [PROMPT, [9, 8, 7], PROMPT[:4]], dict(gen_length=16, steps=8, block_length=8)
    batch = moe.generate_batch(prompts, per_prompt=[{"cache": True}, {"cache": False}, {"cfg_scale": 1.0}], **kw)
    singles = [moe.generate(prompts[0], cache=True, **kw), moe.generate(prompts[1], cache=False, **kw),
               moe.generate(prompts[2], cfg_scale=1.0, **kw)]
    assert [b.tokens.tolist() for b in batch] == [s.tokens.tolist() for s in singles]


# ---- experts in the events ----

def test_events_carry_the_reference_routing(moe, tiny_hf_llada_moe):
    """Step 0 recomputes every position: its experts are the reference's choice (best first)."""
    events = []
    moe.generate(PROMPT, gen_length=16, steps=4, block_length=16, on_step=events.append)
    ev = events[0]
    assert ev.experts.shape == (2, len(ev.active), MOE_USED) and ev.experts.dtype == np.int32
    routing = []
    reference_forward(tiny_hf_llada_moe, PROMPT + [moe.mask_token_id] * 16, routing=routing)   # step 0's input
    np.testing.assert_array_equal(ev.experts[0], routing[0][0])
    needed = ev.active >= ev.block_start                                 # the rows the last layer computed
    np.testing.assert_array_equal(ev.experts[1][needed], routing[1][0][needed])
    assert (ev.experts[1][~needed] == -1).all()
    # later steps: only the active positions, cached ones are not recomputed
    assert all(e.experts.shape[1] == len(e.active) for e in events)
    assert all(((e.experts >= -1) & (e.experts < MOE_EXPERTS)).all() for e in events)


def test_batch_events_carry_each_sequences_own_routing(moe, tiny_hf_llada_moe):
    """In a batch the rows of every sequence share one pass: each event reads its own rows."""
    prompts, events = [PROMPT, [9, 8, 7, 6, 5, 4, 3]], []
    moe.generate_batch(prompts, gen_length=8, steps=2, block_length=8, on_step=events.append)
    for s, prompt in enumerate(prompts):
        ev = next(e for e in events if e.sequence == s and e.step == 0)
        routing = []
        reference_forward(tiny_hf_llada_moe, prompt + [moe.mask_token_id] * 8, routing=routing)
        np.testing.assert_array_equal(ev.experts[0], routing[0][0])
        needed = ev.active >= ev.block_start
        np.testing.assert_array_equal(ev.experts[1][needed], routing[1][0][needed])


def test_routing_only_when_asked(moe, tiny_gguf):
    off = []
    moe.generate(PROMPT, gen_length=8, steps=2, block_length=8, on_step=off.append, expert_routing=False)
    assert off[0].experts is None
    dense = []
    diffuse.load(tiny_gguf("llada", "f32")).generate(PROMPT, gen_length=8, steps=2, block_length=8,
                                                     on_step=dense.append, expert_routing=True)
    assert dense[0].experts is None


def test_recording_keeps_the_routing(moe, tmp_path):
    from diffuse.recording import Recording

    rec = Recording(prompt="p", model={"arch": moe.arch, "n_expert": moe.n_expert})
    rec.finish(moe.generate(PROMPT, gen_length=16, steps=4, block_length=8, on_step=rec.add))
    rec.save(tmp_path / "run.npz")
    back = Recording.load(tmp_path / "run.npz")
    for a, b in zip(rec.events, back.events):
        np.testing.assert_array_equal(a.experts, b.experts)
    # a damaged split is refused, not reshaped into nonsense
    data = dict(np.load(tmp_path / "run.npz"))
    data["experts_dims"][1, 1] += 1
    np.savez(tmp_path / "bad.npz", **data)
    with pytest.raises(DiffuseError, match="do not split experts_values"):
        Recording.load(tmp_path / "bad.npz")


def test_bench_model_writer_makes_a_loadable_llama_cpp_file(tmp_path):
    from diffuse.bench.random_models import write_random_llada_moe

    path = write_random_llada_moe(tmp_path / "m.gguf", n_layer=1, n_embd=64, n_head=2, n_expert=4, n_expert_used=2,
                                  n_ff_exp=32, n_vocab=64, n_ctx=128)
    model = diffuse.load(path, threads=1)
    assert (model.dialect, model.n_expert, model.hparams["n_expert_used"]) == ("llama.cpp", 4, 2)
    assert np.isfinite(model.forward(np.arange(10))).all()
    # bench forward's cost model counts the routed experts a position uses, not none of them
    from diffuse.bench.cost import matmuls
    experts = {mm.name: mm for mm in matmuls(str(path)) if "_exps" in mm.name}
    assert sorted(experts) == [f"blk.0.ffn_{w}_exps.weight" for w in ("down", "gate", "up")]
    assert (experts["blk.0.ffn_up_exps.weight"].k, experts["blk.0.ffn_up_exps.weight"].m) == (64, 32 * 2)
