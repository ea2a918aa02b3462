"""DiffusionGemma (google/diffusiongemma-26B-A4B-it, transformers 5.24 `models/diffusion_gemma/`)
-> GGUF in llama.cpp PR #24423's dialect (arch `diffusion-gemma`), the layout Unsloth's GGUFs have.

The checkpoint is one Gemma 4 MoE text stack run twice (a causal encoder that writes the K/V cache,
a bidirectional decoder over the canvas): transformers saves the shared weights once, under
model.decoder.*, and the encoder's own per-layer layer_scalar under model.encoder.language_model.*.
The vision tower (model.encoder.vision_tower.*, model.encoder.embed_vision.*) is not converted.

Names and keys are those of a Q8_0 file written by the PR's converter (its key/tensor dump is
public); where that dump is the only source, the comments say so:
- per layer: attn_{q,k,v,output}, attn_{q,k}_norm, attn_norm, post_attention_norm, ffn_norm and
  ffn_{gate,up,down} (the dense GELU-tanh MLP), post_ffw_norm_1, pre_ffw_norm_2, ffn_gate_inp
  (router, F32) and ffn_gate_inp.scale (its learned scale), ffn_gate_up_exps (fused, gate rows
  first) and ffn_down_exps, ffn_down_exps.scale (the router's per_expert_scale), post_ffw_norm_2,
  post_ffw_norm, layer_output_scale (the decoder's layer_scalar), enc_layer_output_scale (the
  encoder's); full-attention layers have no attn_v (K = V);
- self_cond_{pre_norm,gate,up,down}; rope_freqs (the proportional RoPE of the full layers as
  llama.cpp's frequency factors: 1 for the rotated pairs, 1e30 for the others: the value is our
  choice, the engine reads whatever the file holds); token_embd (tied head); output_norm;
- keys {arch}.attention.head_count_kv (per layer), .attention.sliding_window_pattern (per layer,
  true = sliding), .attention.key_length / value_length (full) and _swa, .rope.freq_base and _swa,
  .rope.dimension_count and _swa, .attention.sliding_window, .final_logit_softcapping, and
  diffusion.canvas_length (no arch prefix).

Checked against the PR's code (conversion/diffusion_gemma.py and gemma.py's Gemma4Model,
gguf-py/gguf/constants.py, src/models/diffusion-gemma.cpp and gemma4-common.h, src/llama-vocab.cpp;
a fork carrying the PR at its head of 2026-06-10): every name, shape and layout above is the PR's,
rope_freqs' values (1 and 1e30) included; its converter also writes .attention.shared_kv_layers and
.embedding_length_per_layer_input as 0 (Gemma 3n's features), attention.causal false, the sampler's
defaults as diffusion.eb_* (from generation_config.json: EB_KEYS) and Gemma 4's vocabulary
(tokenizer.ggml.model "gemma4", no tokenizer.json). It writes no vocab_size and no image token ids;
we add diffuse.image_token_ids (the config's) so that prompts carrying them are refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import Keys

from diffuse import _core, gguf_file
from diffuse._core import DiffuseError
from diffuse.convert.families import Family, read_json_object, shown
from diffuse.convert.safetensors_reader import Checkpoint

ARCH = "diffusion-gemma"
HF_ARCHITECTURE = "DiffusionGemmaForBlockDiffusion"
CANVAS_LENGTH_KEY = "diffusion.canvas_length"
IMAGE_TOKEN_IDS_KEY = "diffuse.image_token_ids"
# PR #24423's sampler keys (from generation_config.json) -> our options.
EB_KEYS = {"diffusion.eb_max_steps": ("steps", "u32"), "diffusion.eb_t_max": ("temperature", "f32"),
           "diffusion.eb_t_min": ("temperature_end", "f32"), "diffusion.eb_entropy_bound": ("entropy_budget", "f32"),
           "diffusion.eb_stability_threshold": ("stability", "u32"),
           "diffusion.eb_confidence_threshold": ("stop_entropy", "f32")}
# Gemma 4's image tokens by their strings (boi, the soft token, eoi: ids 255999, 258880, 258882 in
# the real vocabulary), for files that do not list them (PR #24423's).
GEMMA4_IMAGE_TOKENS = ("<|image>", "<|image|>", "<image|>")
# read_vocab's view of the family: Gemma 4's end of turn and mask tokens.
FAMILY = Family(arch=ARCH, hf_architecture=HF_ARCHITECTURE, config_keys={}, defaults={}, fixed={}, tensors={},
                permute_qk=False, shift_logits=False, mask_token="<mask>", eot_token="<turn|>")
DEC = "model.decoder."
ENC = "model.encoder.language_model."
SKIPPED_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")
NOPE_FREQ_FACTOR = 1e30   # a pair whose angle is position / 1e30: not rotated


@dataclass(frozen=True)
class Layer:
    sliding: bool
    head_dim: int
    n_head_kv: int


@dataclass(frozen=True)
class GemmaParams:
    n_embd: int
    n_head: int
    n_ff: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ctx: int
    vocab_size: int
    rms_eps: float
    softcap: float
    window: int
    canvas: int
    theta: float          # full layers (proportional RoPE over n_rot_full of head_dim_full)
    theta_swa: float
    rope_factor: float
    layers: tuple[Layer, ...]
    image_token_ids: tuple[int, ...] = ()   # the config's image_token_id, boi_token_id, eoi_token_id

    @property
    def head_dim_full(self) -> int:
        return next((l.head_dim for l in self.layers if not l.sliding), self.layers[0].head_dim)

    @property
    def head_dim_swa(self) -> int:
        return next((l.head_dim for l in self.layers if l.sliding), self.layers[0].head_dim)


def is_diffusion_gemma(config: dict) -> bool:
    archs = config.get("architectures")
    return isinstance(archs, list) and HF_ARCHITECTURE in archs or config.get("model_type") == "diffusion_gemma"


def _int(path, where: str, value, low: int = 1, high: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DiffuseError(f"{path}: {where} = {shown(value)} is not an integer from {low} to {high}")
    return value


def _float(path, where: str, value, low: float = 0.0, high: float = 3.4e38) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                               and low < value <= high):
        raise DiffuseError(f"{path}: {where} = {shown(value)} is not a number above {low:g} and at most {high:g}")
    return float(value)


def read_params(hf_dir: Path, config: dict) -> GemmaParams:
    """The text model's hyper-parameters from config.json, every one checked."""
    path = hf_dir / "config.json"
    text = config.get("text_config")
    if not isinstance(text, dict):
        has_vision = isinstance(config.get("vision_config"), dict)
        raise DiffuseError(f"{path}: no text_config{' beside its vision_config' if has_vision else ''}; "
                           "diffuse converts the text model of a DiffusionGemma checkpoint and needs its config")

    def get(key: str, default=None):
        value = text.get(key, default)
        if value is None:
            raise DiffuseError(f"{path}: text_config has no {key!r}")
        return value

    for key, want in (("hidden_activation", "gelu_pytorch_tanh"), ("attention_bias", False),
                      ("tie_word_embeddings", True)):
        if text.get(key, want) != want:
            raise DiffuseError(f"{path}: text_config.{key} = {shown(text[key])} is a DiffusionGemma variant diffuse "
                               f"does not run (expected {want!r})")
    if text.get("use_bidirectional_attention") == "all":
        raise DiffuseError(f"{path}: text_config.use_bidirectional_attention = 'all' makes the encoder "
                           "bidirectional; diffuse runs DiffusionGemma's causal encoder")
    n_layer = _int(path, "text_config.num_hidden_layers", get("num_hidden_layers"), 1, 4096)
    types = text.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                        for i in range(n_layer)]
    if not isinstance(types, list) or len(types) != n_layer or \
            any(t not in ("sliding_attention", "full_attention") for t in types):
        raise DiffuseError(f"{path}: text_config.layer_types = {shown(types)} is not one of sliding_attention / "
                           f"full_attention per layer ({n_layer} layers)")
    n_head = _int(path, "text_config.num_attention_heads", get("num_attention_heads"))
    hd = _int(path, "text_config.head_dim", get("head_dim", 256))
    n_kv = _int(path, "text_config.num_key_value_heads", get("num_key_value_heads"))
    # transformers writes the full layers' overrides as per_layer_config; a hand-written config may
    # say global_head_dim / num_global_key_value_heads instead.
    overrides = text.get("per_layer_config") or {}
    if not isinstance(overrides, dict):
        raise DiffuseError(f"{path}: text_config.per_layer_config = {shown(overrides)} is not an object")
    layers = []
    for i, kind in enumerate(types):
        head_dim, kv = hd, n_kv
        if kind == "full_attention":
            o = overrides.get(str(i), overrides.get(i))
            if isinstance(o, dict):
                head_dim, kv = o.get("head_dim", hd), o.get("num_key_value_heads", n_kv)
            else:
                head_dim = text.get("global_head_dim", 512)
                kv = text.get("num_global_key_value_heads") or n_kv
        head_dim = _int(path, f"layer {i}'s head_dim", head_dim, 2, 1 << 16)
        kv = _int(path, f"layer {i}'s num_key_value_heads", kv, 1, n_head)
        if n_head % kv or head_dim % 2:
            raise DiffuseError(f"{path}: layer {i}: {n_head} heads of {head_dim} do not share {kv} KV heads "
                               "evenly, or the head size is odd")
        layers.append(Layer(kind == "sliding_attention", head_dim, kv))

    rope = text.get("rope_parameters") or {}
    swa_rope, full_rope = rope.get("sliding_attention") or {}, rope.get("full_attention") or {}
    if swa_rope.get("rope_type", "default") != "default" or full_rope.get("rope_type", "proportional") != "proportional":
        raise DiffuseError(f"{path}: text_config.rope_parameters = {shown(rope)}; diffuse runs default RoPE on "
                           "sliding layers and proportional RoPE on full ones")
    factor = _float(path, "full_attention.partial_rotary_factor", full_rope.get("partial_rotary_factor", 0.25), 0, 1)
    canvas = config.get("canvas_length", 256)
    n_ctx = _int(path, "text_config.max_position_embeddings", get("max_position_embeddings", 131072))
    p = GemmaParams(
        n_embd=_int(path, "text_config.hidden_size", get("hidden_size")), n_head=n_head,
        n_ff=_int(path, "text_config.intermediate_size", get("intermediate_size")),
        n_expert=_int(path, "text_config.num_experts", get("num_experts"), 1, 4096),
        n_expert_used=_int(path, "text_config.top_k_experts", get("top_k_experts"), 1, 4096),
        n_ff_exp=_int(path, "text_config.moe_intermediate_size", get("moe_intermediate_size")),
        n_ctx=n_ctx, vocab_size=_int(path, "text_config.vocab_size", get("vocab_size")),
        rms_eps=_float(path, "text_config.rms_norm_eps", get("rms_norm_eps", 1e-6), 0, 1),
        softcap=_float(path, "text_config.final_logit_softcapping", get("final_logit_softcapping", 30.0)),
        window=_int(path, "text_config.sliding_window", get("sliding_window", 512), 1, n_ctx),
        canvas=_int(path, "canvas_length", canvas, 1, n_ctx),
        theta=_float(path, "full_attention.rope_theta", full_rope.get("rope_theta", 1e6)),
        theta_swa=_float(path, "sliding_attention.rope_theta", swa_rope.get("rope_theta", 1e4)),
        rope_factor=factor, layers=tuple(layers),
        image_token_ids=tuple(sorted({i for k in ("image_token_id", "boi_token_id", "eoi_token_id")
                                      if type(i := config.get(k)) is int and 0 <= i < text["vocab_size"]})))
    if p.n_expert_used > p.n_expert:
        raise DiffuseError(f"{path}: top_k_experts = {p.n_expert_used} exceeds num_experts = {p.n_expert}")
    if int(factor * p.head_dim_full // 2) < 1:
        raise DiffuseError(f"{path}: partial_rotary_factor = {factor} rotates no dimension of the full layers")
    return p


def plan(p: GemmaParams, ckpt: Checkpoint, hf_dir: Path, matrix_type: int):
    """(GGUF OutTensor, HF names or None for rope_freqs, 3-D experts in one HF tensor) in writing order."""
    e, V = p.n_embd, p.vocab_size
    block = _core.type_info(int(matrix_type))["block_size"]
    out, used = [], set()

    def add(name: str, hf: str | None, shape: tuple[int, ...], f32: bool = False) -> None:
        """shape: numpy order of the HF tensor ((out, in) for a matrix, (E, out, in) for experts)."""
        if hf is not None:
            entry = ckpt.tensors.get(hf)
            if entry is None:
                raise DiffuseError(f"{hf_dir}: missing tensor {hf}")
            if entry.shape != shape:
                raise DiffuseError(f"{entry.path}: tensor {hf} has shape {list(entry.shape)}, expected {list(shape)}")
            used.add(hf)
        gtype = T.F32
        if len(shape) >= 2 and not f32:
            gtype = matrix_type if shape[-1] % block == 0 else T.F16
        out.append((gguf_file.OutTensor(name, int(gtype), shape[::-1]), hf))

    add("token_embd.weight", DEC + "embed_tokens.weight", (V, e))
    add("output_norm.weight", DEC + "norm.weight", (e,))
    add("rope_freqs.weight", None, (p.head_dim_full // 2,))
    sc = DEC + "self_conditioning."
    add("self_cond_pre_norm.weight", sc + "pre_norm.weight", (e,))
    add("self_cond_gate.weight", sc + "gate_proj.weight", (p.n_ff, e))
    add("self_cond_up.weight", sc + "up_proj.weight", (p.n_ff, e))
    add("self_cond_down.weight", sc + "down_proj.weight", (e, p.n_ff))
    for i, layer in enumerate(p.layers):
        d, a, b = f"{DEC}layers.{i}.", f"{DEC}layers.{i}.self_attn.", f"blk.{i}."
        q, kv = p.n_head * layer.head_dim, layer.n_head_kv * layer.head_dim
        add(b + "attn_norm.weight", d + "input_layernorm.weight", (e,))
        add(b + "attn_q.weight", a + "q_proj.weight", (q, e))
        add(b + "attn_k.weight", a + "k_proj.weight", (kv, e))
        if layer.sliding:
            add(b + "attn_v.weight", a + "v_proj.weight", (kv, e))
        elif a + "v_proj.weight" in ckpt.tensors:
            raise DiffuseError(f"{hf_dir}: layer {i} is a full-attention layer (K = V) but has {a}v_proj.weight")
        add(b + "attn_q_norm.weight", a + "q_norm.weight", (layer.head_dim,))
        add(b + "attn_k_norm.weight", a + "k_norm.weight", (layer.head_dim,))
        add(b + "attn_output.weight", a + "o_proj.weight", (e, q))
        add(b + "post_attention_norm.weight", d + "post_attention_layernorm.weight", (e,))
        add(b + "ffn_norm.weight", d + "pre_feedforward_layernorm.weight", (e,))
        add(b + "ffn_gate.weight", d + "mlp.gate_proj.weight", (p.n_ff, e))
        add(b + "ffn_up.weight", d + "mlp.up_proj.weight", (p.n_ff, e))
        add(b + "ffn_down.weight", d + "mlp.down_proj.weight", (e, p.n_ff))
        add(b + "post_ffw_norm_1.weight", d + "post_feedforward_layernorm_1.weight", (e,))
        add(b + "pre_ffw_norm_2.weight", d + "pre_feedforward_layernorm_2.weight", (e,))
        add(b + "ffn_gate_inp.weight", d + "router.proj.weight", (p.n_expert, e), f32=True)
        add(b + "ffn_gate_inp.scale", d + "router.scale", (e,))
        add(b + "ffn_gate_up_exps.weight", d + "experts.gate_up_proj", (p.n_expert, 2 * p.n_ff_exp, e))
        add(b + "ffn_down_exps.weight", d + "experts.down_proj", (p.n_expert, e, p.n_ff_exp))
        add(b + "ffn_down_exps.scale", d + "router.per_expert_scale", (p.n_expert,))
        add(b + "post_ffw_norm_2.weight", d + "post_feedforward_layernorm_2.weight", (e,))
        add(b + "post_ffw_norm.weight", d + "post_feedforward_layernorm.weight", (e,))
        add(b + "layer_output_scale.weight", d + "layer_scalar", (1,))
        add(b + "enc_layer_output_scale.weight", f"{ENC}layers.{i}.layer_scalar", (1,))

    # The encoder's copies of shared weights (a checkpoint saved without ties) are the decoder's.
    unknown = sorted(n for n in ckpt.tensors if n not in used and not n.startswith(SKIPPED_PREFIXES)
                     and not (n.startswith(ENC) and n.replace(ENC, DEC, 1) in used)
                     and n != "lm_head.weight")
    if unknown:
        raise DiffuseError(f"{hf_dir}: unexpected tensor {unknown[0]} ({len(unknown)} in all) for a "
                           f"{HF_ARCHITECTURE} checkpoint")
    return out


def rope_freqs(p: GemmaParams) -> np.ndarray:
    """Proportional RoPE (transformers' "proportional"): the first factor * head_dim / 2 pairs
    rotate at theta^(-2j / head_dim), the others not at all; as NEOX RoPE over the whole head with
    frequency factors."""
    rotated = int(p.rope_factor * p.head_dim_full // 2)
    f = np.full(p.head_dim_full // 2, NOPE_FREQ_FACTOR, np.float32)
    f[:rotated] = 1.0
    return f


def metadata(p: GemmaParams, put) -> None:
    """The model's keys (PR #24423's names; `put(key, value, type)` formats {arch})."""
    put(Keys.LLM.CONTEXT_LENGTH, p.n_ctx, "u32")
    put(Keys.LLM.EMBEDDING_LENGTH, p.n_embd, "u32")
    put(Keys.LLM.BLOCK_COUNT, len(p.layers), "u32")
    put(Keys.LLM.FEED_FORWARD_LENGTH, p.n_ff, "u32")
    put(Keys.LLM.EXPERT_COUNT, p.n_expert, "u32")
    put(Keys.LLM.EXPERT_USED_COUNT, p.n_expert_used, "u32")
    put(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, p.n_ff_exp, "u32")
    put(Keys.Attention.HEAD_COUNT, p.n_head, "u32")
    put(Keys.Attention.HEAD_COUNT_KV, [l.n_head_kv for l in p.layers], "array[i32]")
    put("{arch}.attention.sliding_window_pattern", [l.sliding for l in p.layers], "array[bool]")
    put(Keys.Attention.SLIDING_WINDOW, p.window, "u32")
    put(Keys.Attention.KEY_LENGTH, p.head_dim_full, "u32")
    put(Keys.Attention.VALUE_LENGTH, p.head_dim_full, "u32")
    put("{arch}.attention.key_length_swa", p.head_dim_swa, "u32")
    put("{arch}.attention.value_length_swa", p.head_dim_swa, "u32")
    put(Keys.Rope.FREQ_BASE, p.theta, "f32")
    put("{arch}.rope.freq_base_swa", p.theta_swa, "f32")
    put(Keys.Rope.DIMENSION_COUNT, p.head_dim_full, "u32")
    put("{arch}.rope.dimension_count_swa", p.head_dim_swa, "u32")
    put(Keys.Attention.LAYERNORM_RMS_EPS, p.rms_eps, "f32")
    put("{arch}.final_logit_softcapping", p.softcap, "f32")
    put(Keys.LLM.VOCAB_SIZE, p.vocab_size, "u32")
    put(Keys.Attention.CAUSAL, False, "bool")
    put("{arch}.attention.shared_kv_layers", 0, "u32")
    put("{arch}.embedding_length_per_layer_input", 0, "u32")
    put(CANVAS_LENGTH_KEY, p.canvas, "u32")
    if p.image_token_ids:
        put(IMAGE_TOKEN_IDS_KEY, list(p.image_token_ids), "array[u32]")


def sampler_metadata(recipe: dict, put) -> None:
    """The PR's diffusion.eb_* keys, from the checked recipe (generation_config.json's values)."""
    for key, (option, type_name) in EB_KEYS.items():
        if recipe.get(option) is not None:
            put(key, recipe[option], type_name)


def recipe_from_pr_keys(kv: dict) -> dict:
    """A PR-dialect file's sampler keys as generation options (unchecked)."""
    return {option: kv[key] for key, (option, _) in EB_KEYS.items() if key in kv}


def image_token_ids(kv: dict) -> frozenset[int]:
    """The image tokens a text-only run refuses: the file's list, else Gemma 4's by their strings."""
    ids = kv.get(IMAGE_TOKEN_IDS_KEY)
    if ids is not None:
        return frozenset(int(i) for i in ids)
    tokens = kv.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return frozenset()
    wanted = set(GEMMA4_IMAGE_TOKENS)
    return frozenset(i for i, t in enumerate(tokens) if t in wanted)


def generation_defaults(hf_dir: Path) -> dict:
    """generation_config.json's values, or {} when the folder has none."""
    path = hf_dir / "generation_config.json"
    return read_json_object(path) if path.is_file() else {}


# generation_config.json key -> our option; transformers' defaults where the file has none
# (DiffusionGemmaGenerationConfig._get_default_generation_params).
RECIPE_KEYS = {"max_new_tokens": ("gen_length", 256), "max_denoising_steps": ("steps", 48),
               "t_max": ("temperature", 0.8), "t_min": ("temperature_end", 0.4),
               "stability_threshold": ("stability", 1), "confidence_threshold": ("stop_entropy", 0.005)}


def recipe(hf_dir: Path) -> dict:
    """The checkpoint's decoding (generation_config.json) as generation options."""
    g = generation_defaults(hf_dir)
    out = {option: g.get(key, default) if g.get(key) is not None else default
           for key, (option, default) in RECIPE_KEYS.items()}
    sampler = g.get("sampler_config")
    bound = sampler.get("entropy_bound") if isinstance(sampler, dict) else None
    out["entropy_budget"] = bound if bound is not None else 0.1
    return out


def eos_ids(hf_dir: Path, config: dict) -> list[int]:
    """End-of-text ids: generation_config.json's eos_token_id (the real model: 1 and 106), else the
    text config's."""
    eos = generation_defaults(hf_dir).get("eos_token_id", (config.get("text_config") or {}).get("eos_token_id"))
    eos = eos if isinstance(eos, list) else [eos]
    return [i for i in eos if type(i) is int and i >= 0]
