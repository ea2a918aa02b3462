"""LLaDA and SDAR in PyTorch, small enough to train on a laptop CPU.

LLaDA: the module tree mirrors GSAI-ML/LLaDA-8B's modeling_llada.py (OLMo code base), so `state_dict()`
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
class Shape:
    """Either architecture's size (head size d_model / n_heads)."""
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    mlp_hidden_size: int
    max_sequence_length: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    def as_dict(self) -> dict:
        return asdict(self)


def init_weights(model: nn.Module, n_layers: int, is_residual_out) -> None:
    """GPT-2 style: matrices N(0, 0.02), the residual outputs (is_residual_out(name)) shrunk by depth
    so that the stream starts near unit scale; norms stay at 1."""
    std_out = 0.02 / math.sqrt(2 * n_layers)
    for name, p in model.named_parameters():
        if p.dim() > 1:
            nn.init.normal_(p, mean=0.0, std=std_out if is_residual_out(name) else 0.02)


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
    def __init__(self, s: Shape):
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
    def __init__(self, s: Shape):
        super().__init__()
        self.wte = nn.Embedding(s.vocab_size, s.d_model)
        self.blocks = nn.ModuleList(LLaDABlock(s) for _ in range(s.n_layers))
        self.ln_f = RMSNorm(s.d_model, s.rms_norm_eps)
        self.ff_out = nn.Linear(s.d_model, s.vocab_size, bias=False)  # LM head, untied


class _Model(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.transformer = _Transformer(s)


class LLaDA(nn.Module):
    """`LLaDA(shape)(ids (B, T)) -> logits (B, T, vocab)`; position i predicts token i."""

    def __init__(self, shape: Shape):
        super().__init__()
        self.shape = shape
        self.model = _Model(shape)
        cos, sin = rope_tables(shape.max_sequence_length, shape.d_model // shape.n_heads, shape.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        init_weights(self, shape.n_layers, lambda name: name.endswith("attn_out.weight")
                     or (".blocks." in name and name.endswith("ff_out.weight")))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        T = ids.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = t.wte(ids)
        for block in t.blocks:
            x = block(x, cos, sin)
        return t.ff_out(t.ln_f(x))


# ---- SDAR: Qwen3 blocks with block-causal attention (JetLM/SDAR's modeling_sdar.py layout) ----
#
# The module tree mirrors the Hugging Face checkpoint, so `state_dict()` keys are its names:
# `model.embed_tokens.weight`, `model.layers.N.input_layernorm.weight`,
# `model.layers.N.self_attn.{q_proj,k_proj,v_proj,o_proj,q_norm,k_norm}.weight`,
# `model.layers.N.post_attention_layernorm.weight`, `model.layers.N.mlp.{gate_proj,up_proj,down_proj}.weight`,
# `model.norm.weight`, `lm_head.weight`. Per-head q/k RMSNorm before RoPE (rotate-half), no biases.


def block_causal_mask(n: int, block: int) -> torch.Tensor:
    """(n, n) bool, True where query i may attend key j: block(j) <= block(i), blocks aligned at 0."""
    b = torch.arange(n) // block
    return b[None, :] <= b[:, None]


def block_diffusion_mask(n: int, block: int) -> torch.Tensor:
    """(2n, 2n) bool over [noisy x_t ; clean x_0] (BD3-LM's training mask): a noisy row sees its
    own noisy block and the clean blocks before it; a clean row sees the clean blocks up to its own.
    So one pass scores every block against a clean prefix, as decoding will present it."""
    b = torch.arange(n) // block
    same = b[None, :] == b[:, None]
    before = b[None, :] < b[:, None]
    none = torch.zeros(n, n, dtype=torch.bool)
    top = torch.cat((same, before), dim=1)                         # noisy queries
    bottom = torch.cat((none, block_causal_mask(n, block)), dim=1)  # clean queries
    return torch.cat((top, bottom), dim=0)


class _SDARAttention(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        d, self.n_heads = s.d_model, s.n_heads
        hd = d // s.n_heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.q_norm = RMSNorm(hd, s.rms_norm_eps)
        self.k_norm = RMSNorm(hd, s.rms_norm_eps)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, d = h.shape
        # (B, T, d) -> (B, T, H, hd), normalised per head, -> (B, H, T, hd)
        q, k, v = (p(h).view(B, T, self.n_heads, -1) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k, v = self.q_norm(q).transpose(1, 2), self.k_norm(k).transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(a.transpose(1, 2).reshape(B, T, d))


class _SDARMLP(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.gate_proj = nn.Linear(s.d_model, s.mlp_hidden_size, bias=False)
        self.up_proj = nn.Linear(s.d_model, s.mlp_hidden_size, bias=False)
        self.down_proj = nn.Linear(s.mlp_hidden_size, s.d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class _SDARLayer(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.input_layernorm = RMSNorm(s.d_model, s.rms_norm_eps)
        self.self_attn = _SDARAttention(s)
        self.post_attention_layernorm = RMSNorm(s.d_model, s.rms_norm_eps)
        self.mlp = _SDARMLP(s)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class _SDARBody(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.d_model)
        self.layers = nn.ModuleList(_SDARLayer(s) for _ in range(s.n_layers))
        self.norm = RMSNorm(s.d_model, s.rms_norm_eps)


class SDAR(nn.Module):
    """`SDAR(shape, block)(ids (B, T)) -> logits (B, T, vocab)` with block-causal attention over
    blocks of `block` (position i predicts token i, no shift); `train_logits(noisy, clean)` scores
    the noisy rows against the clean prefix in one pass (block_diffusion_mask)."""

    def __init__(self, shape: Shape, block: int):
        super().__init__()
        self.shape, self.block = shape, block
        self.model = _SDARBody(shape)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        cos, sin = rope_tables(shape.max_sequence_length, shape.d_model // shape.n_heads, shape.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._masks: dict = {}
        init_weights(self, shape.n_layers, lambda name: name.endswith(("o_proj.weight", "down_proj.weight")))

    def _mask(self, kind, n: int) -> torch.Tensor:
        if (kind, n) not in self._masks:
            self._masks[(kind, n)] = kind(n, self.block)
        return self._masks[(kind, n)]

    def _run(self, ids: torch.Tensor, cos, sin, mask) -> torch.Tensor:
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return x

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        x = self._run(ids, self.rope_cos[:T], self.rope_sin[:T], self._mask(block_causal_mask, T))
        return self.lm_head(self.model.norm(x))

    def train_logits(self, noisy: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
        """noisy, clean: (B, T) -> logits of the noisy rows (B, T, vocab)."""
        T = noisy.shape[1]
        cos, sin = (torch.cat((t[:T], t[:T])) for t in (self.rope_cos, self.rope_sin))   # both copies at 0..T-1
        x = self._run(torch.cat((noisy, clean), dim=1), cos, sin, self._mask(block_diffusion_mask, T))
        return self.lm_head(self.model.norm(x[:, :T]))
