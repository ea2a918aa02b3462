"""Nemotron-Labs-Diffusion's forward and its three loops, in float64, to compare the engine with.

`Reference`: transformers 5.24's own Ministral3Model (YaRN RoPE, the llama-4 query scale) with
the checkpoint's `encoder.*` weights and its untied `diffusion_head` as the head, in float64.
transformers computes RoPE's angles and RMSNorm in float32 whatever the model's dtype: both are
swapped for float64 ones (`yarn_inv_freq` below follows transformers' _compute_yarn_parameters,
and a test checks it against transformers' float32 one). `logits(ids, open_block)`: one pass over
the whole sequence under a 4-D additive mask, causal but for the last open_block rows, which see
every position (the cache-free equivalent of a block over a causal K/V cache: a causal prefix's
K/V do not depend on what comes after it); draft_lora: those rows' o_proj also adds the
checkpoint's draft LoRA (linear_spec_lora/: PEFT's scale * B A x, read from its own files), as the
official draft pass does with the adapters toggled on, the causal rows staying base (the prefix's K/V
come from causal passes, never from the draft). The same class runs LLaDA (as LlamaForCausalLM, its
OLMo names mapped) and Qwen3 / Qwen2 checkpoints (SDAR, Fast-dLLM v2, through Qwen3/Qwen2ForCausalLM),
for the AR mode of other families.

The loops, ported from the model repository's remote code (modeling_nemotron_labs_diffusion.py,
chat_utils.py), batch 1, driven by `Reference.logits`:
- `ar_generate`: its ar_generate.
- `linear_spec_generate`: its linear_spec_generate (threshold 0: every mask drafted), the draft
  with the draft LoRA when asked (its `_toggle_adapters`: on for the draft, off for prefill and
  verify; read through copies of the remote code and of SGLang's LinearSpec "draft_only").
- `diffusion_generate`: its generate_diffusion -> generate_with_prefix_cache_block_diff with
  causal_context=True, remasking low_confidence and a threshold.
Our deliberate differences, shared by the engine (docs/self_speculation.md):
- Greedy choices never take the mask token (SGLang's LinearSpec bans it; the remote code does not).
- The answer is exactly gen_length tokens (the official linear_spec_generate may overshoot
  max_new_tokens by up to a block; the diffusion loop's answer is whole blocks in both).
- An answer is cut after its first end-of-text (the official loops stop there too).
- The diffusion loop's last block gets no causal pass (nothing reads its K/V).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file

from reference.forward import load


def yarn_inv_freq(rope: dict, head_dim: int) -> tuple[torch.Tensor, float]:
    """transformers' _compute_yarn_parameters (truncate=True) in float64: (inv_freq, attention_factor)."""
    base, factor, orig = rope["rope_theta"], rope["factor"], rope["original_max_position_embeddings"]
    beta_fast, beta_slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = rope.get("attention_factor")
    if attn is None:
        m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def corr_dim(rot):
        return head_dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr_dim(beta_fast)), 0), min(math.ceil(corr_dim(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    extrapolation = 1 - ramp
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv_freq, float(attn)


def _float64_norms_and_rope(model, rotary, inv_freq: torch.Tensor, attn: float) -> None:
    def rope(x, position_ids):
        angles = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat([angles, angles], -1)
        return emb.cos() * attn, emb.sin() * attn

    rotary.forward = rope
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = (lambda m: lambda x: m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                                        + m.variance_epsilon))(m)


class Reference:
    def __init__(self, hf_dir):
        config, weights = load(str(hf_dir))
        self.config = config
        arch = config["architectures"][0]
        keep = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")}
        if arch == "NemotronLabsDiffusionModel":
            cfg = transformers.Ministral3Config(**keep)
            cfg._attn_implementation = "sdpa"
            self.body = transformers.Ministral3Model(cfg).to(torch.float64).eval()
            self.body.load_state_dict({k.removeprefix("encoder."): torch.from_numpy(v)
                                       for k, v in weights.items() if k.startswith("encoder.")})
            self.head = torch.from_numpy(weights["diffusion_head.weight"])
            hd = cfg.head_dim
            inv_freq, attn = yarn_inv_freq(cfg.rope_parameters, hd)
            _float64_norms_and_rope(self.body, self.body.rotary_emb, inv_freq, attn)
        elif arch == "LLaDAModelLM":   # a Llama block: LlamaForCausalLM with LLaDA's (OLMo) names mapped
            cfg = transformers.LlamaConfig(
                hidden_size=config["d_model"], num_attention_heads=config["n_heads"],
                num_key_value_heads=config["n_kv_heads"], num_hidden_layers=config["n_layers"],
                intermediate_size=config["mlp_hidden_size"], vocab_size=config["vocab_size"],
                rms_norm_eps=config["rms_norm_eps"], rope_theta=config["rope_theta"],
                max_position_embeddings=config["max_sequence_length"], tie_word_embeddings=config["weight_tying"])
            cfg._attn_implementation = "sdpa"
            lm = transformers.LlamaForCausalLM(cfg).to(torch.float64).eval()
            names = {"attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
                     "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj",
                     "ff_norm": "post_attention_layernorm", "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                     "ff_out": "mlp.down_proj"}
            state = {"model.embed_tokens.weight": weights["model.transformer.wte.weight"],
                     "model.norm.weight": weights["model.transformer.ln_f.weight"],
                     "lm_head.weight": weights.get("model.transformer.ff_out.weight",
                                                   weights["model.transformer.wte.weight"])}
            for name, w in weights.items():
                if name.startswith("model.transformer.blocks."):
                    i, what = name.removeprefix("model.transformer.blocks.").split(".", 1)
                    state[f"model.layers.{i}.{names[what.removesuffix('.weight')]}.weight"] = w
            lm.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
            self.body, self.head = lm.model, lm.lm_head.weight.detach()
            hd = cfg.hidden_size // cfg.num_attention_heads
            inv_freq = 1.0 / config["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            _float64_norms_and_rope(self.body, self.body.rotary_emb, inv_freq, 1.0)
        else:   # Qwen3 (SDAR, WeDLM-8B) or Qwen2 (Fast-dLLM v2, WeDLM-7B) blocks: their AR mode
            sdar = arch == "SDARForCausalLM" or arch == "WeDLMForCausalLM" and config.get("qk_norm")
            cls = transformers.Qwen3ForCausalLM if sdar else transformers.Qwen2ForCausalLM
            cfg = (transformers.Qwen3Config if sdar else transformers.Qwen2Config)(**keep)
            cfg._attn_implementation = "sdpa"
            lm = cls(cfg).to(torch.float64).eval()
            lm.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=not cfg.tie_word_embeddings)
            self.body = lm.model
            self.head = lm.lm_head.weight.detach()
            hd = config.get("head_dim") or cfg.hidden_size // cfg.num_attention_heads
            inv_freq = 1.0 / config["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            _float64_norms_and_rope(self.body, self.body.rotary_emb, inv_freq, 1.0)
        self.passes = 0
        self.lora = self._draft_lora(Path(hf_dir) / "linear_spec_lora")

    @staticmethod
    def _draft_lora(folder: Path):
        """[(A, B) per layer] in float64 and PEFT's scale alpha / r, or None without the folder."""
        if not folder.is_dir():
            return None
        config = json.loads((folder / "adapter_config.json").read_text())
        tensors = {k.split("layers.", 1)[1]: torch.from_numpy(v.astype(np.float64))
                   for k, v in load_file(str(folder / "adapter_model.safetensors")).items()}
        n = len(tensors) // 2
        pairs = [(tensors[f"{i}.self_attn.o_proj.lora_A.weight"], tensors[f"{i}.self_attn.o_proj.lora_B.weight"])
                 for i in range(n)]
        return pairs, config["lora_alpha"] / config["r"]

    def logits(self, ids, open_block: int = 0, draft_lora: bool = False, positions=None) -> np.ndarray:
        """(n, n_vocab): causal, the last open_block rows seeing every position (and, draft_lora,
        adding the draft LoRA to their o_proj); RoPE at `positions` (default 0..n-1)."""
        n = len(ids)
        allowed = np.tril(np.ones((n, n), bool))
        allowed[n - open_block:, :] = True
        mask = torch.from_numpy(np.where(allowed, 0.0, -np.inf))[None, None]
        hooks = []
        if draft_lora:
            pairs, scale = self.lora

            def add(a, b):
                def hook(module, inputs, output):
                    out = output.clone()
                    out[:, n - open_block:] += scale * inputs[0][:, n - open_block:] @ a.T @ b.T
                    return out
                return hook

            hooks = [layer.self_attn.o_proj.register_forward_hook(add(a, b))
                     for layer, (a, b) in zip(self.body.layers, pairs)]
        try:
            with torch.no_grad():
                pos = torch.arange(n) if positions is None else torch.tensor(list(positions))
                h = self.body(torch.tensor([list(ids)]), attention_mask=mask, position_ids=pos[None])
        finally:
            for hook in hooks:
                hook.remove()
        self.passes += 1
        return (h.last_hidden_state[0] @ self.head.T).numpy()


def _argmax(row: np.ndarray, mask_id: int) -> int:
    row = row.copy()
    row[mask_id] = -np.inf
    return int(np.argmax(row))


def ar_generate(model: Reference, prompt: list[int], mask_id: int, gen_length: int, eos_id: int | None = None) -> list[int]:
    x = list(prompt)
    for _ in range(gen_length):
        x.append(_argmax(model.logits(x)[-1], mask_id))
        if x[-1] == eos_id:
            break
    return x[len(prompt):]


def linear_spec_generate(model: Reference, prompt: list[int], mask_id: int, gen_length: int, block_length: int = 32,
                         eos_id: int | None = None,
                         draft_lora: bool = False) -> tuple[list[int], list[tuple[list[int], int]]]:
    """The answer, and per iteration (the drafted block, drafts accepted)."""
    x = list(prompt)
    x.append(_argmax(model.logits(x)[-1], mask_id))                    # causal prefill: the first seed
    iterations = []
    while len(x) - len(prompt) < gen_length and x[-1] != eos_id:
        k = min(block_length, len(prompt) + gen_length - len(x) + 1)  # ours: never past gen_length
        block = [x[-1]] + [mask_id] * (k - 1)
        draft = model.logits(x[:-1] + block, open_block=k, draft_lora=draft_lora)[-k:]   # bidirectional over the prefix
        block = [block[0]] + [_argmax(r, mask_id) for r in draft[1:]]
        verify = model.logits(x[:-1] + block)[-k:]                     # causal verify
        ar = [_argmax(r, mask_id) for r in verify]
        accepted = 0
        while accepted < k - 1 and ar[accepted] == block[accepted + 1]:
            accepted += 1
        iterations.append((block, accepted))
        x.extend(ar[:accepted + 1])
        if eos_id in x[len(prompt):]:
            x = x[:x.index(eos_id, len(prompt)) + 1]
    return x[len(prompt):len(prompt) + gen_length], iterations


def diffusion_generate(model: Reference, prompt: list[int], mask_id: int, gen_length: int, block_length: int = 32,
                       threshold: float = 0.9, eos_id: int | None = None) -> list[int]:
    """generate_with_prefix_cache_block_diff(causal_context=True, remasking='low_confidence', threshold):
    per block [seed, masks]; every step commits the most confident mask and every other above the
    threshold; the finished block's causal pass seeds the next."""
    x = list(prompt)
    seed = _argmax(model.logits(x)[-1], mask_id)
    n_blocks = -(-gen_length // block_length)
    for _ in range(n_blocks):
        b0 = len(x)
        x += [seed] + [mask_id] * (block_length - 1)
        while mask_id in x[b0:]:
            logits = model.logits(x, open_block=block_length)[b0:]
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            masked = [j for j in range(block_length) if x[b0 + j] == mask_id]
            x0 = {j: _argmax(logits[j], mask_id) for j in masked}
            conf = {j: probs[j, x0[j]] for j in masked}
            ranked = sorted(masked, key=lambda j: -conf[j])
            for rank, j in enumerate(ranked):
                if rank == 0 or conf[j] >= threshold:
                    x[b0 + j] = x0[j]
            answer = x[len(prompt):]
            if eos_id in answer and mask_id not in answer[:answer.index(eos_id)]:
                return answer[:answer.index(eos_id) + 1]
        seed = _argmax(model.logits(x)[-1], mask_id)                   # the block's causal pass
    return x[len(prompt):]
