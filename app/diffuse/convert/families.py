"""The model families as tables: config.json keys, Hugging Face -> GGUF tensor names, and the
few choices that differ (q/k permutation, logit shift, biases, routed experts, block diffusion).

GGUF names are llama.cpp's, so llama.cpp's diffusion tool can run our files.
"""
from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from diffuse._core import DiffuseError
from diffuse.generation import PRESETS


@dataclass(frozen=True)
class Family:
    arch: str                      # general.architecture (llama.cpp's name)
    hf_architecture: str           # config.json "architectures"[0]
    config_keys: dict[str, str]    # HParams field -> config.json key
    defaults: dict[str, object]    # HParams field -> value when the key is absent (n_head_kv: n_head)
    fixed: dict[str, object]       # config.json key -> the only value whose model we know how to run
    tensors: dict[str, str]        # GGUF name -> HF name ("{i}" = layer); the head is "output.weight"
    permute_qk: bool               # llama.cpp permutes LLaDA's q/k rows so RoPE runs in NORM mode
    shift_logits: bool             # Dream: position i reads the logits of position i - 1
    mask_token: str | None         # mask token text, used when config.json has no mask_token_id
    eot_token: str                 # end of a chat turn
    # MoE: GGUF name of a 3-D expert tensor -> HF name of one expert's matrix ("{e}" = expert);
    # the n_expert matrices are stacked, expert e at index e of the slowest dimension.
    experts: dict[str, str] | None = None
    f32_matrices: tuple[str, ...] = ()   # GGUF patterns kept F32 in every outtype (the MoE router)
    default_mask_id: int | None = None   # when neither config.json nor the vocabulary names it
    # Block diffusion (config_keys has "block_size"): causal across blocks, bidirectional inside.
    sub_block_size: int = 0              # Fast-dLLM v2 decodes a block in sub-blocks of this size
    # The decoding its authors publish, as generation options (written as diffuse.recipe.<name>).
    recipe: dict[str, object] | None = None
    # ... when the checkpoint's own modeling code edits tokens (LLaDA2.1; see authors_recipe).
    editing_recipe: dict[str, object] | None = None
    # Layers below n_layer_dense (config_keys) take dense_tensors; the others moe_tensors and experts.
    dense_tensors: dict[str, str] | None = None
    moe_tensors: dict[str, str] | None = None
    # YaRN RoPE and the llama-4 query scale, from config.json's rope_parameters (or rope_scaling).
    yarn: bool = False
    # Nemotron-Labs-Diffusion: its self-speculation draft LoRA (convert/draft_lora.py) is converted too.
    draft_lora: bool = False


LLADA = Family(
    arch="llada",
    hf_architecture="LLaDAModelLM",
    config_keys=dict(n_embd="d_model", n_head="n_heads", n_head_kv="n_kv_heads", n_layer="n_layers",
                     n_ff="mlp_hidden_size", n_ctx="max_sequence_length", rope_theta="rope_theta",
                     rms_eps="rms_norm_eps", vocab_size="vocab_size", mask_token_id="mask_token_id",
                     tied="weight_tying"),
    defaults=dict(n_head_kv=None, n_ctx=4096, rope_theta=10000.0, rms_eps=1e-5, mask_token_id=None, tied=False),
    # OLMo-code options that would change the graph; LLaDA-8B uses exactly these.
    fixed={"block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu", "include_bias": False,
           "include_qkv_bias": False, "attention_layer_norm": False, "alibi": False, "rope": True,
           "scale_logits": False, "input_emb_norm": False},
    tensors={
        "token_embd.weight": "model.transformer.wte.weight",
        "blk.{i}.attn_norm.weight": "model.transformer.blocks.{i}.attn_norm.weight",
        "blk.{i}.attn_q.weight": "model.transformer.blocks.{i}.q_proj.weight",
        "blk.{i}.attn_k.weight": "model.transformer.blocks.{i}.k_proj.weight",
        "blk.{i}.attn_v.weight": "model.transformer.blocks.{i}.v_proj.weight",
        "blk.{i}.attn_output.weight": "model.transformer.blocks.{i}.attn_out.weight",
        "blk.{i}.ffn_norm.weight": "model.transformer.blocks.{i}.ff_norm.weight",
        "blk.{i}.ffn_gate.weight": "model.transformer.blocks.{i}.ff_proj.weight",
        "blk.{i}.ffn_up.weight": "model.transformer.blocks.{i}.up_proj.weight",
        "blk.{i}.ffn_down.weight": "model.transformer.blocks.{i}.ff_out.weight",
        "output_norm.weight": "model.transformer.ln_f.weight",
        "output.weight": "model.transformer.ff_out.weight",
    },
    permute_qk=True,
    shift_logits=False,
    mask_token="<|mdm_mask|>",
    eot_token="<|eot_id|>",
)

DREAM = Family(
    arch="dream",
    hf_architecture="DreamModel",
    config_keys=dict(n_embd="hidden_size", n_head="num_attention_heads", n_head_kv="num_key_value_heads",
                     n_layer="num_hidden_layers", n_ff="intermediate_size", n_ctx="max_position_embeddings",
                     rope_theta="rope_theta", rms_eps="rms_norm_eps", vocab_size="vocab_size",
                     mask_token_id="mask_token_id", tied="tie_word_embeddings"),
    defaults=dict(n_head_kv=None, n_ctx=32768, rope_theta=10000.0, rms_eps=1e-6, mask_token_id=None, tied=False),
    fixed={"hidden_act": "silu", "rope_scaling": None},
    tensors={
        "token_embd.weight": "model.embed_tokens.weight",
        "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
        "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
        "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
        "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
        "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
        "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
        "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
        "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
        "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
        "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
        "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    },
    permute_qk=False,
    shift_logits=True,
    mask_token="<|mask|>",
    eot_token="<|im_end|>",
)

# inclusionAI/LLaDA-MoE-7B-A1B: Qwen2-style names, q/k RMSNorm per head, every layer routed
# (softmax over the experts, top k, weights not renormalised; the official code hard-codes
# norm_topk_prob = False whatever config.json says). model_type is "llada" like the dense model:
# architectures tells them apart. GGUF arch "llada-moe" with llama.cpp's names and keys.
LLADA_MOE = Family(
    arch="llada-moe",
    hf_architecture="LLaDAMoEModelLM",
    config_keys=dict(n_embd="hidden_size", n_head="num_attention_heads", n_head_kv="num_key_value_heads",
                     n_layer="num_hidden_layers", n_ff="dense_intermediate_size", n_ctx="max_position_embeddings",
                     rope_theta="rope_theta", rms_eps="rms_norm_eps", vocab_size="vocab_size",
                     mask_token_id="mask_token_id", tied="tie_word_embeddings", n_expert="num_experts",
                     n_expert_used="num_experts_per_tok", n_ff_exp="expert_intermediate_size"),
    defaults=dict(n_head_kv=None, n_ff=0, n_ctx=8192, rope_theta=50000.0, rms_eps=1e-5, mask_token_id=None,
                  tied=False),
    fixed={"hidden_act": "silu", "rope_scaling": None, "qk_layernorm": True, "partial_rotary_factor": 1.0,
           "moe_router_score_function": "softmax", "shared_expert_intermediate_size": None},
    tensors={
        "token_embd.weight": "model.embed_tokens.weight",
        "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
        "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
        "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
        "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
        "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
        "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
        "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
        "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "blk.{i}.ffn_gate_inp.weight": "model.layers.{i}.mlp.gate.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    },
    experts={
        "blk.{i}.ffn_gate_exps.weight": "model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
        "blk.{i}.ffn_up_exps.weight": "model.layers.{i}.mlp.experts.{e}.up_proj.weight",
        "blk.{i}.ffn_down_exps.weight": "model.layers.{i}.mlp.experts.{e}.down_proj.weight",
    },
    # llama.cpp keeps the router in F32 (converter and quantizer): a rounded router flips choices.
    f32_matrices=("blk.{i}.ffn_gate_inp.weight",),
    permute_qk=False,
    shift_logits=False,
    mask_token="<|mask|>",
    eot_token="<|role_end|>",
    default_mask_id=156895,   # LLaDA-MoE-7B-A1B's, the id llama.cpp's converter writes
)

# JetLM SDAR-*-Chat and Gen-Verse TraDo-*-Instruct (same code): Qwen3 blocks (q/k RMSNorm per head
# before NEOX RoPE, GQA, no biases, head_dim from config.json), no logit shift, block_size and
# mask_token_id in config.json. Some published copies of config.json lack both: the block is then
# generate.py's default (4, what the -Chat models are trained on) and the mask the vocabulary's
# <|MASK|> (151669). Official decoding: JetAstra/SDAR generate.py.
SDAR = Family(
    arch="sdar",
    hf_architecture="SDARForCausalLM",
    config_keys=dict(n_embd="hidden_size", n_head="num_attention_heads", n_head_kv="num_key_value_heads",
                     n_layer="num_hidden_layers", n_ff="intermediate_size", n_ctx="max_position_embeddings",
                     rope_theta="rope_theta", rms_eps="rms_norm_eps", vocab_size="vocab_size",
                     mask_token_id="mask_token_id", tied="tie_word_embeddings", head_dim="head_dim",
                     block_size="block_size"),
    defaults=dict(n_head_kv=None, n_ctx=32768, rope_theta=10000.0, rms_eps=1e-6, tied=False, head_dim=None,
                  mask_token_id=None, block_size=4),
    fixed={"hidden_act": "silu", "rope_scaling": None, "attention_bias": False, "use_sliding_window": False},
    # Qwen3's names are Qwen2's (Dream's) without the q/k/v biases, plus the per-head q/k norms.
    tensors={**{k: v for k, v in DREAM.tensors.items() if not k.endswith(".bias")},
             "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
             "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight"},
    permute_qk=False,
    shift_logits=False,
    mask_token="<|MASK|>",
    eot_token="<|im_end|>",
    default_mask_id=151669,
    # generate.py's defaults (block 4, 4 steps, dynamic rule at 0.85); greedy.
    recipe={"block_length": 4, "steps": 4, "scheduler": "low_confidence_dynamic", "confidence_threshold": 0.85,
            "temperature": 0.0},
)

# NVlabs Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_*): Qwen2.5 blocks (q/k/v biases) with
# Dream's token shift, block size bd_size (32) in config.json; the mask id is a constant of its
# code (151665, the token "|<MASK>|"). Its generate() decodes a block in sub-blocks of 8, committing
# every masked position above the threshold (0.9 on the model card) and at least the most confident.
FAST_DLLM_V2 = Family(
    arch="fast-dllm-v2",
    hf_architecture="Fast_dLLM_QwenForCausalLM",
    config_keys={**DREAM.config_keys, "head_dim": "head_dim", "block_size": "bd_size"},
    defaults={**DREAM.defaults, "head_dim": None, "block_size": 32},   # its code's default bd_size
    fixed={"hidden_act": "silu", "rope_scaling": None, "use_sliding_window": False},
    tensors=DREAM.tensors,
    permute_qk=False,
    shift_logits=True,
    mask_token="|<MASK>|",
    eot_token="<|im_end|>",
    default_mask_id=151665,
    sub_block_size=8,
    recipe={"block_length": 32, "scheduler": "confidence_threshold", "confidence_threshold": 0.9, "temperature": 0.0},
)

# inclusionAI LLaDA2.0/2.1 (mini 16B-A1.4B, flash 100B-A6B): BailingMoeV2 blocks trained
# block-causally (modeling_llada2_moe.py): one fused query_key_value ([q heads, k heads, v heads]),
# per-head query/key_layernorm, NEOX RoPE over head_dim * partial_rotary_factor dims, the first
# first_k_dense_replace layers a dense SwiGLU, the others a sigmoid router (F32) whose expert_bias
# steers the choice only, group-limited top-k (n_group groups by the sum of their best two,
# topk_group kept), weights normalised (top_k > 1) x routed_scaling_factor, plus shared experts.
# config.json holds neither block size nor mask id: its generate()'s defaults (block 32, <|mask|>
# 156895). GGUF names and keys follow llama.cpp's bailingmoe2 under the arch "llada2".
LLADA2 = Family(
    arch="llada2",
    hf_architecture="LLaDA2MoeModelLM",
    config_keys=dict(n_embd="hidden_size", n_head="num_attention_heads", n_head_kv="num_key_value_heads",
                     n_layer="num_hidden_layers", n_ff="intermediate_size", n_ctx="max_position_embeddings",
                     rope_theta="rope_theta", rms_eps="rms_norm_eps", vocab_size="vocab_size",
                     mask_token_id="mask_token_id", tied="tie_word_embeddings", head_dim="head_dim",
                     n_expert="num_experts", n_expert_used="num_experts_per_tok", n_ff_exp="moe_intermediate_size",
                     n_expert_groups="n_group", n_group_used="topk_group", n_expert_shared="num_shared_experts",
                     n_layer_dense="first_k_dense_replace", rope_factor="partial_rotary_factor",
                     expert_scale="routed_scaling_factor", block_size="block_size"),
    defaults=dict(n_head_kv=None, n_ctx=32768, rope_theta=600000.0, rms_eps=1e-6, tied=False, head_dim=None,
                  mask_token_id=None, n_expert_groups=1, n_group_used=None, n_expert_shared=0, n_layer_dense=0,
                  rope_factor=1.0, expert_scale=1.0, block_size=32),
    fixed={"hidden_act": "silu", "rope_scaling": None, "use_qkv_bias": False, "use_bias": False,
           "use_qk_norm": True, "norm_head": False, "score_function": "sigmoid",
           "moe_router_enable_expert_bias": True},
    tensors={
        "token_embd.weight": "model.word_embeddings.weight",
        "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
        "blk.{i}.attn_qkv.weight": "model.layers.{i}.attention.query_key_value.weight",
        "blk.{i}.attn_q_norm.weight": "model.layers.{i}.attention.query_layernorm.weight",
        "blk.{i}.attn_k_norm.weight": "model.layers.{i}.attention.key_layernorm.weight",
        "blk.{i}.attn_output.weight": "model.layers.{i}.attention.dense.weight",
        "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    },
    dense_tensors={
        "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
        "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
        "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    },
    moe_tensors={
        "blk.{i}.ffn_gate_inp.weight": "model.layers.{i}.mlp.gate.weight",
        "blk.{i}.exp_probs_b.bias": "model.layers.{i}.mlp.gate.expert_bias",
        "blk.{i}.ffn_gate_shexp.weight": "model.layers.{i}.mlp.shared_experts.gate_proj.weight",
        "blk.{i}.ffn_up_shexp.weight": "model.layers.{i}.mlp.shared_experts.up_proj.weight",
        "blk.{i}.ffn_down_shexp.weight": "model.layers.{i}.mlp.shared_experts.down_proj.weight",
    },
    experts=LLADA_MOE.experts,
    f32_matrices=("blk.{i}.ffn_gate_inp.weight",),
    permute_qk=False,
    shift_logits=False,
    mask_token="<|mask|>",
    eot_token="<|role_end|>",
    default_mask_id=156895,
    # generate()'s defaults: block 32, 32 steps, threshold 0.95 (the dynamic rule), greedy.
    recipe={"block_length": 32, "steps": 32, "scheduler": "low_confidence_dynamic", "confidence_threshold": 0.95,
            "temperature": 0.0},
    # LLaDA2.1: its card's quality mode (threshold 0.7, editing_threshold 0.5, max_post_steps 16).
    editing_recipe=PRESETS["llada2.1-quality"],
)

# NVIDIA Nemotron-Labs-Diffusion-{3B,8B,14B} (remote code NemotronLabsDiffusionModel): a Ministral3
# stack run as Llama (no biases, no q/k norm, SiLU) under `encoder.`, an untied `diffusion_head`,
# YaRN RoPE and the llama-4 query scale (transformers' ministral3), mask_token_id (100) and
# block_size (32) in config.json. One checkpoint decodes in three modes over a causal K/V cache
# (AR, diffusion, self-speculation: loops/causal.cpp). No GGUF architecture exists for it: ours is
# "nemotron-diffusion"; the keys are llama.cpp's (rope.scaling.*, attention.temperature_*). Its draft
# LoRA (linear_spec_lora/) goes into the same file (convert/draft_lora.py).
NEMOTRON_DIFFUSION = Family(
    arch="nemotron-diffusion",
    hf_architecture="NemotronLabsDiffusionModel",
    config_keys={**SDAR.config_keys, "tied": "tie_word_embeddings"},
    defaults={**SDAR.defaults, "rope_theta": None, "block_size": 32, "mask_token_id": 100},
    fixed={"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "sliding_window": None},
    tensors={
        "token_embd.weight": "encoder.embed_tokens.weight",
        "blk.{i}.attn_norm.weight": "encoder.layers.{i}.input_layernorm.weight",
        "blk.{i}.attn_q.weight": "encoder.layers.{i}.self_attn.q_proj.weight",
        "blk.{i}.attn_k.weight": "encoder.layers.{i}.self_attn.k_proj.weight",
        "blk.{i}.attn_v.weight": "encoder.layers.{i}.self_attn.v_proj.weight",
        "blk.{i}.attn_output.weight": "encoder.layers.{i}.self_attn.o_proj.weight",
        "blk.{i}.ffn_norm.weight": "encoder.layers.{i}.post_attention_layernorm.weight",
        "blk.{i}.ffn_gate.weight": "encoder.layers.{i}.mlp.gate_proj.weight",
        "blk.{i}.ffn_up.weight": "encoder.layers.{i}.mlp.up_proj.weight",
        "blk.{i}.ffn_down.weight": "encoder.layers.{i}.mlp.down_proj.weight",
        "output_norm.weight": "encoder.norm.weight",
        "output.weight": "diffusion_head.weight",
    },
    permute_qk=False,
    shift_logits=False,
    mask_token="[MASK]",
    eot_token="</s>",
    default_mask_id=100,
    # Its generate_diffusion: blocks of 32 seeded by the AR token, threshold 0.9, greedy.
    recipe={"scheduler": "confidence_threshold", "confidence_threshold": 0.9, "temperature": 0.0},
    yarn=True,
    draft_lora=True,
)

# ByteDance-Seed Stable-DiffCoder-8B-{Base,Instruct} (MIT): Seed-Coder's Llama stack (GQA, no biases,
# untied head) trained for block diffusion, its remote modeling_stable_diffcoder.py a
# LlamaForCausalLM subclass whose generate_block decodes blocks of 4 aligned at position 0 (the
# prompt included) with mask id 5 and no logit shift. config.json names neither (the class's
# defaults: mask_id=5, block_length=4) and may lack head_dim. GGUF: llama.cpp's llama names with q/k
# permuted as its converter does (NORM RoPE, LLaDA's graph), under our arch "stable-diffcoder".
STABLE_DIFFCODER = Family(
    arch="stable-diffcoder",
    hf_architecture="StableDiffcoderForCausalLM",
    config_keys={**SDAR.config_keys},
    defaults={**SDAR.defaults, "n_ctx": 8192, "rope_theta": 500000.0, "block_size": 4, "mask_token_id": 5},
    fixed={"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "rope_scaling": None},
    tensors={k: v for k, v in DREAM.tensors.items() if not k.endswith(".bias")},
    permute_qk=True,
    shift_logits=False,
    mask_token="",   # never looked up: the id is generate_block's constant (defaults above)
    eot_token="<[end\u2581of\u2581sentence]>",
    default_mask_id=5,
    # The model card's call: steps=512 over gen_length=512 in blocks of 4 (4 steps per block, one
    # token each), low_confidence without threshold, greedy.
    recipe={"gen_length": 512, "block_length": 4, "steps": 4, "scheduler": "low_confidence_static",
            "temperature": 0.0},
)

# Tencent WeDLM (WeDLMForCausalLM; remote code hf_compat/modeling_wedlm.py): WeDLM-8B(-Instruct) on
# Qwen3 blocks (qk_norm true, attention_bias false), WeDLM-7B(-Instruct) on Qwen2.5 blocks (q/k/v
# biases, no q/k norm: its config class's defaults), no logit shift. Trained to decode under plain
# causal attention (loops/wedlm.h). config.json's mask_token_id is null: Tencent's engine then uses
# 151665 whatever the vocabulary holds there (model_runner.py _init_mask_token; Qwen3's
# <tool_response>, past Qwen2.5's tokenizer), and so do we. No GGUF architecture exists: ours are
# "wedlm" and "wedlm-qwen2". Its engine's defaults (window 16, entropy threshold 0.4, position
# penalty 0.02) are the family's in the engine.
WEDLM = Family(
    arch="wedlm",
    hf_architecture="WeDLMForCausalLM",
    config_keys={k: v for k, v in SDAR.config_keys.items() if k != "block_size"},
    defaults={k: v for k, v in SDAR.defaults.items() if k != "block_size"},
    # Tencent's engine gives q/k norms exactly to the layers without biases (wedlm/models/wedlm.py),
    # its remote code by qk_norm: the two agree on these two variants only.
    fixed={"hidden_act": "silu", "rope_scaling": None, "use_sliding_window": False, "attention_bias": False,
           "qk_norm": True},
    tensors=SDAR.tensors,
    permute_qk=False,
    shift_logits=False,
    mask_token=None,
    eot_token="<|im_end|>",
    default_mask_id=151665,
)
WEDLM_QWEN2 = Family(
    **{**WEDLM.__dict__, "arch": "wedlm-qwen2", "tensors": DREAM.tensors,
       "fixed": {**WEDLM.fixed, "attention_bias": True, "qk_norm": False}},
)

FAMILIES = {f.hf_architecture: f for f in (LLADA, DREAM, LLADA_MOE, SDAR, FAST_DLLM_V2, LLADA2,
                                             NEMOTRON_DIFFUSION, STABLE_DIFFCODER, WEDLM)}
# Checkpoint classes whose config picks the layout: config.json -> its family.
VARIANTS = {"WeDLMForCausalLM": lambda config: WEDLM if config.get("qk_norm") else WEDLM_QWEN2}

MAX_JSON_BYTES = 64 << 20   # real config files are KBs, tokenizer.json tens of MBs at most
MAX_INT = 2**31 - 1         # the engine holds sizes and ids in 32-bit ints
MAX_F32 = 3.4e38            # rope_theta and rms_eps are stored as float32
# HParams field -> (kind, lowest, highest) allowed.
RANGES = {field: ("int", 1, MAX_INT) for field in ("n_embd", "n_head", "n_head_kv", "n_layer", "n_ff", "n_ctx",
                                                   "vocab_size")}
RANGES.update(rope_theta=("float", 0.0, MAX_F32), rms_eps=("float", 0.0, 1.0), mask_token_id=("int", 0, MAX_INT),
              tied=("bool", False, True), n_expert=("int", 1, 4096), n_expert_used=("int", 1, 4096),
              n_ff_exp=("int", 1, MAX_INT), head_dim=("int", 1, MAX_INT), block_size=("int", 1, MAX_INT),
              n_expert_groups=("int", 1, 4096), n_group_used=("int", 1, 4096), n_expert_shared=("int", 0, 64),
              n_layer_dense=("int", 0, MAX_INT), rope_factor=("float", 0.0, 1.0), expert_scale=("float", 0.0, 1e6))

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80


def shown(value) -> str:
    """A value from a file as it may appear in a message: a short repr, control characters escaped."""
    return _repr.repr(value)


@dataclass(frozen=True)
class HParams:
    n_embd: int
    n_head: int
    n_head_kv: int
    n_layer: int
    n_ff: int
    n_ctx: int
    rope_theta: float
    rms_eps: float
    vocab_size: int
    mask_token_id: int | None
    tied: bool              # no separate output head: the embedding is reused
    n_expert: int = 0       # MoE: routed experts per layer (0: dense)
    n_expert_used: int = 0  # experts per position
    n_ff_exp: int = 0       # one expert's hidden size
    head_dim: int = 0       # config.json's, else n_embd / n_head
    block_size: int = 0     # block diffusion: the trained block length (0: attention over everything)
    # LLaDA2's router and layout (the others: one group, no shared experts, no dense layers).
    n_expert_groups: int = 1
    n_group_used: int | None = None   # groups kept (None: all)
    n_expert_shared: int = 0
    n_layer_dense: int = 0            # the first layers are a dense SwiGLU of n_ff
    rope_factor: float = 1.0          # RoPE rotates head_dim * rope_factor dims
    expert_scale: float = 1.0         # routed weights x this
    # YaRN (Family.yarn): interpolation factor (0: plain RoPE), the pre-training context, the ramp's
    # rotation bounds, transformers' attention_factor (cos and sin are multiplied by it); the
    # llama-4 query scale 1 + attn_temp_scale * ln(1 + floor(pos / yarn_orig_ctx)).
    yarn_factor: float = 0.0
    yarn_orig_ctx: int = 0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_attn_factor: float = 1.0
    attn_temp_scale: float = 0.0

    @property
    def n_rot(self) -> int:
        return int(self.head_dim * self.rope_factor)


def read_text(path: Path, limit: int = MAX_JSON_BYTES) -> str:
    """A UTF-8 text file of at most `limit` bytes (a hostile file could be any size)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise DiffuseError(f"{path}: larger than {limit >> 20} MB; not a real model file")
        return data.decode("utf-8")
    except OSError as err:
        raise DiffuseError(f"{path}: unreadable ({err.strerror or err})") from err
    except UnicodeDecodeError as err:
        raise DiffuseError(f"{path}: not UTF-8 text ({err})") from err


def read_json(path: Path):
    try:
        return json.loads(read_text(path))
    except (ValueError, RecursionError) as err:   # RecursionError: nesting too deep
        raise DiffuseError(f"{path}: not valid JSON ({shown(str(err))})") from err


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object (config.json, tokenizer_config.json)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise DiffuseError(f"{path}: not a JSON object")
    return data


def authors_recipe(family: Family, hp: HParams, hf_dir: Path, config: dict) -> dict:
    """The decoding the authors publish for this checkpoint. A block-diffusion checkpoint decodes the
    blocks it was trained with (its config's block size; the table's steps per block scale with it).
    No key of LLaDA2.1's config.json tells it from LLaDA2.0 (same class, model_type and architecture
    keys); what tells them apart is the remote code the checkpoint ships (config's auto_map): 2.1's
    generate() takes editing_threshold, 2.0's does not. Without that file a checkpoint gets the
    family's recipe."""
    recipe = dict(family.recipe or {})
    if hp.block_size and "block_length" in recipe:
        if recipe.get("steps") == recipe["block_length"]:
            recipe["steps"] = hp.block_size
        recipe["block_length"] = hp.block_size
    if family.editing_recipe is None:
        return recipe
    auto_map = config.get("auto_map")
    target = auto_map.get("AutoModelForCausalLM") if isinstance(auto_map, dict) else None
    module = target.rsplit(".", 1)[0] if isinstance(target, str) and "." in target else ""
    path = hf_dir / f"{module}.py"
    if module.isidentifier() and path.is_file() and "editing_threshold" in read_text(path):
        recipe |= family.editing_recipe
    return recipe


def read_config(hf_dir: Path) -> tuple[Family, HParams, dict]:
    """The family, hyper-parameters and raw config of a checkpoint folder."""
    path = hf_dir / "config.json"
    if not path.is_file():
        raise DiffuseError(f"{hf_dir}: no config.json (not a Hugging Face model folder)")
    config = read_json_object(path)

    archs = config.get("architectures") or [None]
    family = FAMILIES.get(archs[0]) if isinstance(archs, list) and isinstance(archs[0], str) else None
    if family is not None and archs[0] in VARIANTS:
        family = VARIANTS[archs[0]](config)
    if family is None:
        from diffuse.convert import TAKES   # the package's list, DiffusionGemma included (no cycle at call time)
        raise DiffuseError(f"{path}: unsupported architecture {shown(archs)}; diffuse converts {TAKES} checkpoints")
    for key, want in family.fixed.items():
        if key in config and config[key] != want:
            raise DiffuseError(f"{path}: {key} = {shown(config[key])} is a {family.arch} variant diffuse "
                               f"does not run (expected {want!r})")

    values = _yarn(path, config) if family.yarn else {}
    for field, key in family.config_keys.items():
        if field in values:
            continue
        value = config.get(key)
        if value is None:
            if field not in family.defaults:
                raise DiffuseError(f"{path}: missing {key!r}")
            value = family.defaults[field]
        elif not _in_range(value, *RANGES[field]):
            raise DiffuseError(f"{path}: {key} = {shown(value)} is not {_range_text(*RANGES[field])}")
        values[field] = value
    if values["n_head_kv"] is None:
        values["n_head_kv"] = values["n_head"]
    if values.get("head_dim") is None:   # an explicit head_dim need not divide the model width (Qwen3)
        if values["n_embd"] % values["n_head"]:
            raise DiffuseError(f"{path}: {values['n_embd']} is not a whole number of {values['n_head']} heads")
        values["head_dim"] = values["n_embd"] // values["n_head"]
    hp = HParams(**{f: _typed(f, v) for f, v in values.items()})
    if hp.n_head % hp.n_head_kv or hp.head_dim % 2:
        raise DiffuseError(f"{path}: {hp.n_head} heads of {hp.head_dim} / {hp.n_head_kv} KV heads "
                           "do not give an even head size shared by the KV groups")
    if hp.block_size > hp.n_ctx:
        raise DiffuseError(f"{path}: {family.config_keys['block_size']} = {hp.block_size} is larger than the "
                           f"context ({hp.n_ctx} positions)")
    if family.sub_block_size and hp.block_size % family.sub_block_size:
        raise DiffuseError(f"{path}: {family.config_keys['block_size']} = {hp.block_size} is not a whole number "
                           f"of the {family.sub_block_size}-token sub-blocks {family.arch} decodes in")
    if hp.n_expert_used > hp.n_expert:
        raise DiffuseError(f"{path}: num_experts_per_tok = {hp.n_expert_used} exceeds num_experts = {hp.n_expert}")
    if hp.n_expert_groups > 1:
        _check_groups(path, hp)
    if hp.n_layer_dense > hp.n_layer:
        raise DiffuseError(f"{path}: first_k_dense_replace = {hp.n_layer_dense} exceeds the {hp.n_layer} layers")
    if hp.n_rot < 2 or hp.n_rot % 2:
        raise DiffuseError(f"{path}: partial_rotary_factor = {hp.rope_factor} gives {hp.n_rot} of {hp.head_dim} "
                           "dimensions to rotate (RoPE needs an even number, at least 2)")
    return family, hp, config


def _yarn(path: Path, config: dict) -> dict:
    """YaRN and the llama-4 query scale of a Ministral3 config (transformers 5's rope_parameters, or the
    older rope_scaling beside a top-level rope_theta), as HParams fields; one error naming what is missing."""
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    need = "rope_parameters with rope_type 'yarn', factor, original_max_position_embeddings, llama_4_scaling_beta"
    if not isinstance(rope, dict) or (rope.get("rope_type") or rope.get("type")) != "yarn":
        raise DiffuseError(f"{path}: no YaRN RoPE parameters (expected {need}); Nemotron-Labs-Diffusion uses YaRN")

    def number(key: str, low: float, high: float, default=None, where: dict = rope) -> float:
        value = where.get(key, default)
        if value is None:
            raise DiffuseError(f"{path}: the YaRN parameters lack {key!r} (expected {need})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and low <= value <= high):
            raise DiffuseError(f"{path}: {key} = {shown(value)} is not a number from {low:g} to {high:g}")
        return float(value)

    factor = number("factor", 1.0, 1e6)
    # transformers' _compute_yarn_parameters: attention_factor, else from mscale / mscale_all_dim.
    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    attn = rope.get("attention_factor")
    if attn is None:
        m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    theta_in = rope if "rope_theta" in rope else config
    return dict(
        rope_theta=number("rope_theta", 1e-6, MAX_F32, where=theta_in),
        yarn_factor=factor,
        yarn_orig_ctx=int(number("original_max_position_embeddings", 1, MAX_INT)),
        yarn_beta_fast=number("beta_fast", 0.0, 1e6, 32.0),
        yarn_beta_slow=number("beta_slow", 0.0, 1e6, 1.0),
        yarn_attn_factor=number("attention_factor", 1e-6, 1e6, attn),
        attn_temp_scale=number("llama_4_scaling_beta", 0.0, 1e6),
    )


def _check_groups(path: Path, hp: HParams) -> None:
    """Group-limited top-k: equal groups of at least two (a group scores the sum of its best two),
    the kept groups holding at least top-k experts."""
    per, used = hp.n_expert // hp.n_expert_groups, hp.n_group_used or hp.n_expert_groups
    if hp.n_expert % hp.n_expert_groups or per < 2:
        raise DiffuseError(f"{path}: num_experts = {hp.n_expert} does not split into n_group = "
                           f"{hp.n_expert_groups} equal groups of at least 2")
    if used > hp.n_expert_groups:
        raise DiffuseError(f"{path}: topk_group = {used} exceeds n_group = {hp.n_expert_groups}")
    if hp.n_expert_used > used * per:
        raise DiffuseError(f"{path}: num_experts_per_tok = {hp.n_expert_used} exceeds the {used * per} experts of "
                           f"the topk_group = {used} groups kept")


def _in_range(value, kind: str, low, high) -> bool:
    """JSON allows Infinity, NaN, 1e999 and true where a count is meant; only plain values pass.
    An integer may be written as a whole float (4096.0)."""
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "int" and isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return False
    if kind == "float":
        # rope_theta and rms_eps must be strictly positive
        return math.isfinite(value) and low < value <= high
    return low <= value <= high


def _range_text(kind: str, low, high) -> str:
    if kind == "bool":
        return "true or false"
    if kind == "float":
        return f"a number above {low:g} and at most {high:g}"
    return f"an integer from {low} to {high}"


def _typed(field: str, value):
    if value is None or field not in RANGES or RANGES[field][0] == "bool":   # not in RANGES: checked by _yarn
        return value
    return float(value) if RANGES[field][0] == "float" else int(value)


def expected_shapes(hp: HParams, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name pattern -> Hugging Face shape (numpy order, (out, in) for a matrix)."""
    e, q, kv, ff = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.n_ff
    return {
        "token_embd.weight": (n_vocab, e),
        "blk.{i}.attn_norm.weight": (e,),
        "blk.{i}.attn_q.weight": (q, e),
        "blk.{i}.attn_q.bias": (q,),
        "blk.{i}.attn_k.weight": (kv, e),
        "blk.{i}.attn_k.bias": (kv,),
        "blk.{i}.attn_v.weight": (kv, e),
        "blk.{i}.attn_v.bias": (kv,),
        "blk.{i}.attn_output.weight": (e, q),
        "blk.{i}.ffn_norm.weight": (e,),
        "blk.{i}.ffn_gate.weight": (ff, e),
        "blk.{i}.ffn_up.weight": (ff, e),
        "blk.{i}.ffn_down.weight": (e, ff),
        "output_norm.weight": (e,),
        "output.weight": (n_vocab, e),
        "blk.{i}.attn_q_norm.weight": (hp.head_dim,),
        "blk.{i}.attn_k_norm.weight": (hp.head_dim,),
        "blk.{i}.ffn_gate_inp.weight": (hp.n_expert, e),
        # one expert's matrix; the GGUF tensor stacks n_expert of them
        "blk.{i}.ffn_gate_exps.weight": (hp.n_ff_exp, e),
        "blk.{i}.ffn_up_exps.weight": (hp.n_ff_exp, e),
        "blk.{i}.ffn_down_exps.weight": (e, hp.n_ff_exp),
        "blk.{i}.attn_qkv.weight": (q + 2 * kv, e),
        "blk.{i}.exp_probs_b.bias": (hp.n_expert,),
        "blk.{i}.ffn_gate_shexp.weight": (hp.n_ff_exp * hp.n_expert_shared, e),
        "blk.{i}.ffn_up_shexp.weight": (hp.n_ff_exp * hp.n_expert_shared, e),
        "blk.{i}.ffn_down_shexp.weight": (e, hp.n_ff_exp * hp.n_expert_shared),
    }


def qk_row_order(n_rows: int, n_head: int) -> np.ndarray:
    """Row order that turns a q or k projection from rotate-half (NEOX) RoPE pairs (j, j + d/2)
    into adjacent pairs (2j, 2j + 1), as llama.cpp's LLaDA converter does: within each head the
    rows (2, d/2) are transposed to (d/2, 2). permuted = original[order]."""
    head_dim = n_rows // n_head
    return np.arange(n_rows).reshape(n_head, 2, head_dim // 2).swapaxes(1, 2).reshape(-1)
