"""GGUF files of a given shape with random weights, for measurements and for tests of shapes no
checkpoint fixture has: llama.cpp dialect keys, F16 matrices, F32 norms, no tokenizer."""
from __future__ import annotations

from pathlib import Path

import numpy as np

F32, F16 = 0, 1     # GGML type ids


def write_random(path: Path, arch: str, kv: dict, layer: dict[str, tuple], n_layer: int, n_embd: int,
                 n_vocab: int, f32: tuple[str, ...] = ()) -> Path:
    """Write `arch`'s header (kv: keys without the `arch.` prefix, plus general.*, tokenizer.* and
    diffusion.* keys as they are) and n_layer blocks of `layer` (tensor name -> GGUF shape, fastest dimension
    first) between the embedding and the output head. 1-D tensors (norms, all ones) and the names
    in `f32` are F32; matrices are N(0, 1/fan_in)."""
    from diffuse.gguf_file import OutTensor, write

    kv = {k if k.startswith(("general.", "tokenizer.", "diffusion.")) else f"{arch}.{k}": v for k, v in kv.items()}
    kv["general.architecture"], kv["general.file_type"] = arch, F16
    types = {k: "str" if isinstance(v, str) else "f32" if isinstance(v, float) else "u32" for k, v in kv.items()}
    shapes = {"token_embd.weight": (n_embd, n_vocab), "output_norm.weight": (n_embd,),
              "output.weight": (n_embd, n_vocab)}
    shapes.update({f"blk.{i}.{name}": shape for i in range(n_layer) for name, shape in layer.items()})
    tensors = [OutTensor(n, F32 if len(s) == 1 or n.endswith(f32) else F16, s) for n, s in shapes.items()]
    rng = np.random.default_rng(0)

    def data():
        for t in tensors:
            if len(t.shape) == 1:
                yield np.ones(t.shape, np.float32)
            else:
                x = rng.standard_normal(t.shape[::-1], np.float32) / np.float32(np.sqrt(t.shape[0]))
                yield x if t.type == F32 else x.astype(np.float16)

    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, kv, types, tensors, data())
    return path


def _attention(d: int) -> dict[str, tuple]:
    return {"attn_norm.weight": (d,), "attn_q.weight": (d, d), "attn_k.weight": (d, d),
            "attn_v.weight": (d, d), "attn_output.weight": (d, d), "ffn_norm.weight": (d,)}


def write_random_llada(path: Path, n_layer: int, n_embd: int, n_head: int, n_ff: int, n_vocab: int,
                       n_ctx: int) -> Path:
    """A dense LLaDA model (MHA, SwiGLU of width n_ff)."""
    d, f = n_embd, n_ff
    kv = {"context_length": n_ctx, "embedding_length": d, "block_count": n_layer, "feed_forward_length": f,
          "attention.head_count": n_head, "attention.head_count_kv": n_head, "rope.freq_base": 500000.0,
          "attention.layer_norm_rms_epsilon": 1e-5, "tokenizer.ggml.mask_token_id": n_vocab - 1}
    layer = _attention(d) | {"ffn_gate.weight": (d, f), "ffn_up.weight": (d, f), "ffn_down.weight": (f, d)}
    return write_random(path, "llada", kv, layer, n_layer, d, n_vocab)


def write_random_sdar(path: Path, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int,
                      n_ff: int, n_vocab: int, n_ctx: int, block_size: int = 4) -> Path:
    """An SDAR (Qwen3, block-causal) model: GQA with a stated head_dim, per-head q/k norms."""
    d, f, q, kv_w = n_embd, n_ff, n_head * head_dim, n_head_kv * head_dim
    kv = {"context_length": n_ctx, "embedding_length": d, "block_count": n_layer, "feed_forward_length": f,
          "attention.head_count": n_head, "attention.head_count_kv": n_head_kv, "attention.key_length": head_dim,
          "rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6,
          "tokenizer.ggml.mask_token_id": n_vocab - 1, "diffusion.block_size": block_size}
    layer = {"attn_norm.weight": (d,), "attn_q.weight": (d, q), "attn_k.weight": (d, kv_w),
             "attn_v.weight": (d, kv_w), "attn_output.weight": (q, d), "attn_q_norm.weight": (head_dim,),
             "attn_k_norm.weight": (head_dim,), "ffn_norm.weight": (d,), "ffn_gate.weight": (d, f),
             "ffn_up.weight": (d, f), "ffn_down.weight": (f, d)}
    return write_random(path, "sdar", kv, layer, n_layer, d, n_vocab)


# Nemotron-Labs-Diffusion's layer shapes (config.json of the 3B and 8B checkpoints): hidden, FFN,
# query / KV heads of 128, vocabulary 131072; their layer counts are 26 and 34.
NEMOTRON_SHAPES = {"3b": dict(n_embd=3072, n_ff=9216, n_head=32, n_head_kv=8),
                   "8b": dict(n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8)}


def write_random_nemotron(path: Path, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int,
                          n_vocab: int = 131072, head_dim: int = 128, n_ctx: int = 262144,
                          draft_lora_rank: int = 0) -> Path:
    """A Nemotron-Labs-Diffusion model (Ministral3 blocks: GQA, YaRN factor 16 over 16384, the
    llama-4 query scale 0.1), mask id 100 and block 32 as the real config.json states them;
    draft_lora_rank > 0: with a draft LoRA of that rank on o_proj (convert/draft_lora.py)."""
    d, f, q, kv_w = n_embd, n_ff, n_head * head_dim, n_head_kv * head_dim
    kv = {"context_length": n_ctx, "embedding_length": d, "block_count": n_layer, "feed_forward_length": f,
          "attention.head_count": n_head, "attention.head_count_kv": n_head_kv, "attention.key_length": head_dim,
          "rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-5, "rope.scaling.type": "yarn",
          "rope.scaling.factor": 16.0, "rope.scaling.original_context_length": 16384,
          "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0, "rope.scaling.attn_factor": 1.0,
          "attention.temperature_scale": 0.1, "attention.temperature_length": 16384,
          "tokenizer.ggml.mask_token_id": 100, "diffusion.block_size": 32}
    layer = {"attn_norm.weight": (d,), "attn_q.weight": (d, q), "attn_k.weight": (d, kv_w),
             "attn_v.weight": (d, kv_w), "attn_output.weight": (q, d), "ffn_norm.weight": (d,),
             "ffn_gate.weight": (d, f), "ffn_up.weight": (d, f), "ffn_down.weight": (f, d)}
    if draft_lora_rank:
        r = draft_lora_rank
        kv["diffusion.draft_lora.scale"] = 2.0
        layer |= {"attn_output.weight.lora_a": (q, r), "attn_output.weight.lora_b": (r, d)}
    return write_random(path, "nemotron-diffusion", kv, layer, n_layer, d, n_vocab)


def write_random_dream(path: Path, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int,
                       n_vocab: int, n_ctx: int) -> Path:
    """A Dream model (Qwen2.5 blocks: GQA, q/k/v biases, SwiGLU of width n_ff); the mask token
    is Dream's 151666 where the vocabulary holds it, else the last id. Tokenizer "none" and the
    vocabulary size stated, which llama.cpp accepts."""
    d, f, kv_dim = n_embd, n_ff, n_embd // n_head * n_head_kv
    kv = {"context_length": n_ctx, "embedding_length": d, "block_count": n_layer, "feed_forward_length": f,
          "attention.head_count": n_head, "attention.head_count_kv": n_head_kv, "rope.freq_base": 1000000.0,
          "attention.layer_norm_rms_epsilon": 1e-6,
          "tokenizer.ggml.mask_token_id": 151666 if n_vocab > 151666 else n_vocab - 1,
          "vocab_size": n_vocab, "tokenizer.ggml.model": "none"}
    layer = _attention(d) | {"attn_k.weight": (d, kv_dim), "attn_v.weight": (d, kv_dim), "attn_q.bias": (d,),
                             "attn_k.bias": (kv_dim,), "attn_v.bias": (kv_dim,), "ffn_gate.weight": (d, f),
                             "ffn_up.weight": (d, f), "ffn_down.weight": (f, d)}
    return write_random(path, "dream", kv, layer, n_layer, d, n_vocab)


def write_random_llada_moe(path: Path, n_layer: int, n_embd: int, n_head: int, n_expert: int, n_expert_used: int,
                           n_ff_exp: int, n_vocab: int, n_ctx: int) -> Path:
    """A llama.cpp `llada-moe` model: q/k norms, an F32 router and n_expert SwiGLU experts of
    width n_ff_exp as 3-D tensors; tokenizer.ggml.model "none", which llama.cpp accepts."""
    d, f, e = n_embd, n_ff_exp, n_expert
    hd = d // n_head
    kv = {"context_length": n_ctx, "embedding_length": d, "block_count": n_layer,
          "feed_forward_length": n_expert_used * f, "attention.head_count": n_head,
          "attention.head_count_kv": n_head, "rope.freq_base": 50000.0, "attention.layer_norm_rms_epsilon": 1e-5,
          "expert_count": e, "expert_used_count": n_expert_used, "expert_feed_forward_length": f,
          "vocab_size": n_vocab, "tokenizer.ggml.model": "none", "tokenizer.ggml.mask_token_id": n_vocab - 1}
    layer = _attention(d) | {"attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,), "ffn_gate_inp.weight": (d, e),
                             "ffn_gate_exps.weight": (d, f, e), "ffn_up_exps.weight": (d, f, e),
                             "ffn_down_exps.weight": (f, d, e)}
    return write_random(path, "llada-moe", kv, layer, n_layer, d, n_vocab, f32=("ffn_gate_inp.weight",))
