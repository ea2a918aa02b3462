"""LLaDA in PyTorch, small enough to train on a laptop CPU.

The module tree mirrors GSAI-ML/LLaDA-8B's modeling_llada.py (OLMo code base), so `state_dict()`
keys are already the Hugging Face names: `model.transformer.wte.weight`,
`model.transformer.blocks.N.{attn_norm,q_proj,k_proj,v_proj,attn_out,ff_norm,ff_proj,up_proj,ff_out}.weight`,
`model.transformer.ln_f.weight`, `model.transformer.ff_out.weight`.
Bidirectional attention, RMSNorm, SwiGLU (ff_proj is the gate), RoPE in rotate-half form, no biases.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LLaDAShape:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    mlp_hidden_size: int
    max_sequence_length: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    def n_params(self) -> int:
        d, f, v = self.d_model, self.mlp_hidden_size, self.vocab_size
        per_block = 4 * d * d + 3 * d * f + 2 * d
        return 2 * v * d + self.n_layers * per_block + d

    def as_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(n_pos: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (n_pos, head_dim), the two halves repeated (rotate-half layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, H, T, hd); rotate_half pairs dimension i with i + hd/2
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class LLaDABlock(nn.Module):
    def __init__(self, s: LLaDAShape):
        super().__init__()
        d, f = s.d_model, s.mlp_hidden_size
        self.n_heads = s.n_heads
        self.attn_norm = RMSNorm(d, s.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_norm = RMSNorm(d, s.rms_norm_eps)
        self.ff_proj = nn.Linear(d, f, bias=False)  # gate
        self.up_proj = nn.Linear(d, f, bias=False)
        self.ff_out = nn.Linear(f, d, bias=False)  # down

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        h = self.attn_norm(x)
        # (B, T, d) -> (B, H, T, hd)
        q, k, v = (p(h).view(B, T, self.n_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=False)  # bidirectional
        x = x + self.attn_out(a.transpose(1, 2).reshape(B, T, d))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))


class _Transformer(nn.Module):
    def __init__(self, s: LLaDAShape):
        super().__init__()
        self.wte = nn.Embedding(s.vocab_size, s.d_model)
        self.blocks = nn.ModuleList(LLaDABlock(s) for _ in range(s.n_layers))
        self.ln_f = RMSNorm(s.d_model, s.rms_norm_eps)
        self.ff_out = nn.Linear(s.d_model, s.vocab_size, bias=False)  # LM head, untied


class _Model(nn.Module):
    def __init__(self, s: LLaDAShape):
        super().__init__()
        self.transformer = _Transformer(s)


class LLaDA(nn.Module):
    """`LLaDA(shape)(ids (B, T)) -> logits (B, T, vocab)`; position i predicts token i."""

    def __init__(self, shape: LLaDAShape):
        super().__init__()
        self.shape = shape
        self.model = _Model(shape)
        cos, sin = rope_tables(shape.max_sequence_length, shape.d_model // shape.n_heads, shape.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2 style: N(0, 0.02), residual outputs shrunk by depth so the stream starts near unit scale
        std_out = 0.02 / math.sqrt(2 * self.shape.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue
            is_residual_out = name.endswith("attn_out.weight") or (".blocks." in name and name.endswith("ff_out.weight"))
            nn.init.normal_(p, mean=0.0, std=std_out if is_residual_out else 0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        T = ids.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = t.wte(ids)
        for block in t.blocks:
            x = block(x, cos, sin)
        return t.ff_out(t.ln_f(x))
