"""Float64 forward pass of LLaDA, LLaDA-MoE, Dream, SDAR, Fast-dLLM v2 and LLaDA2 in numpy, written from
the published model code (GSAI-ML modeling_llada.py LLaDALlamaBlock, inclusionAI's modeling_lladamoe.py,
Dream's Qwen2-based modeling_dream.py, JetAstra/SDAR modeling_sdar.py, Fast-dLLM v2 modeling.py,
inclusionAI's modeling_llada2_moe.py)
and reading the Hugging Face checkpoint directly, so it shares nothing with the engine or the
converter.

All: token embedding -> per layer [x += Wo attn(rope(Wq h), rope(Wk h), Wv h) with h = rmsnorm(x);
x += Wdown (silu(Wgate h) * Wup h) with h = rmsnorm(x)] -> rmsnorm -> head. Attention is
bidirectional; RoPE rotates the halves (rotate_half); K/V heads are shared by n_head / n_kv
consecutive query heads (repeat_interleave). Dream adds q/k/v biases. LLaDA-MoE RMS-normalises q
and k per head (one weight for all heads) before RoPE, and its FFN is the sum of the top-k experts
of a softmax router, weighted by their probabilities as they are (norm_topk_prob is hard-coded
False in the official code). SDAR is Qwen3: q/k RMS-normalised per head like LLaDA-MoE, no biases,
its own head_dim. Fast-dLLM v2 is Qwen2.5, Dream's layout. Stable-DiffCoder is Llama (Seed-Coder:
ByteDance-Seed's modeling_stable_diffcoder.py subclasses LlamaForCausalLM): Dream's names, no biases. LLaDA2 (BailingMoeV2): one fused
query_key_value split as [q heads, k heads, v heads], q/k RMS-normalised per head, RoPE over the first
head_dim * partial_rotary_factor dims only, the first first_k_dense_replace layers dense, the others
llada2_moe_ffn (a sigmoid router with a selection bias and group-limited top-k, plus shared experts).

SDAR, Fast-dLLM v2, LLaDA2 and Stable-DiffCoder are block diffusion: position p attends to position j iff j // B <= p // B
(blocks of B aligned at absolute position 0; causal across blocks, bidirectional inside). `past`
holds the keys and values of positions 0..m-1, so that the rows of a block can be computed against
finished blocks, as the official loops do. Raw logits, no Dream/Fast-dLLM shift.

Full attention with a K/V cache of its own (Fast-dLLM's PrefixCache and DualCache): `cache` holds
every position's keys and values of a pass; a later pass computes only some `rows` and attends to
their new K/V and the cached K/V of every other position.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
from safetensors import deserialize

LLADA_NAMES = {
    "embed": "model.transformer.wte.weight", "norm": "model.transformer.ln_f.weight",
    "head": "model.transformer.ff_out.weight", "layer": "model.transformer.blocks.{i}.",
    "attn_norm": "attn_norm.weight", "q": "q_proj.weight", "k": "k_proj.weight", "v": "v_proj.weight",
    "o": "attn_out.weight", "ffn_norm": "ff_norm.weight", "gate": "ff_proj.weight", "up": "up_proj.weight",
    "down": "ff_out.weight",
}
DREAM_NAMES = {
    "embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "head": "lm_head.weight",
    "layer": "model.layers.{i}.", "attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
    "ffn_norm": "post_attention_layernorm.weight", "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
    "down": "mlp.down_proj.weight",
}

SDAR_NAMES = {**{k: v for k, v in DREAM_NAMES.items() if not k.endswith("_bias")},
              "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}
BLOCK_SIZE_KEYS = {"SDARForCausalLM": "block_size", "Fast_dLLM_QwenForCausalLM": "bd_size",
                   "LLaDA2MoeModelLM": "block_size", "StableDiffcoderForCausalLM": "block_size"}
# When config.json has no block size: the official code's default (Stable-DiffCoder's generate_block: 4).
BLOCK_SIZE_DEFAULTS = {"StableDiffcoderForCausalLM": 4}

MOE_NAMES = {
    "embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "head": "lm_head.weight",
    "layer": "model.layers.{i}.", "attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    "ffn_norm": "post_attention_layernorm.weight", "router": "mlp.gate.weight",
}
EXPERT = "mlp.experts.{e}.{which}_proj.weight"

LLADA2_NAMES = {
    "embed": "model.word_embeddings.weight", "norm": "model.norm.weight", "head": "lm_head.weight",
    "layer": "model.layers.{i}.", "attn_norm": "input_layernorm.weight", "qkv": "attention.query_key_value.weight",
    "q_norm": "attention.query_layernorm.weight", "k_norm": "attention.key_layernorm.weight",
    "o": "attention.dense.weight", "ffn_norm": "post_attention_layernorm.weight", "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight", "router": "mlp.gate.weight",
    "bias": "mlp.gate.expert_bias",
}


@lru_cache(maxsize=8)
def load(hf_dir: str) -> tuple[dict, dict[str, np.ndarray]]:
    """config.json and every tensor of the checkpoint as float64."""
    folder = Path(hf_dir)
    config = json.loads((folder / "config.json").read_text())
    index = folder / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
        else ["model.safetensors"]
    weights = {}
    for shard in shards:
        for name, t in deserialize((folder / shard).read_bytes()):
            raw = bytes(t["data"])
            if t["dtype"] == "BF16":
                x = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                x = np.frombuffer(raw, {"F16": "<f2", "F32": "<f4"}[t["dtype"]])
            weights[name] = x.reshape(t["shape"]).astype(np.float64)
    return config, weights


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, theta: float, positions: np.ndarray) -> np.ndarray:
    """x (n_head, n, d) at `positions` (n,): rotate pairs (j, j + d/2) by position * theta^(-2j/d)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)      # (d/2,)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]   # (n, d/2)
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)                       # (n, d)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)   # rotate_half
    return x * cos + rotated * sin


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """q (n_head, n, d), k/v (n_kv, m, d) -> (n_head, n, d); allowed (n, m) boolean, None: all."""
    n_rep = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, n_rep, axis=0), np.repeat(v, n_rep, axis=0)            # repeat_interleave
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])                   # (n_head, n, m)
    if allowed is not None:
        scores = np.where(allowed[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v


def moe_ffn(h: np.ndarray, w: dict, prefix: str, n_expert: int, k: int, routing: list | None) -> np.ndarray:
    """h (n, n_embd) -> (n, n_embd): the k most probable experts of each row, weighted by their
    softmax probabilities over all experts (not renormalised). Appends (chosen (n, k) best first,
    margin (n,): probability gap between the k-th and the (k+1)-th expert) to `routing`."""
    logits = h @ w[prefix + MOE_NAMES["router"]].T                            # (n, n_expert)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    order = np.argsort(-p, axis=-1, kind="stable")
    chosen = order[:, :k]
    if routing is not None:
        ranked = np.take_along_axis(p, order, axis=-1)
        margin = ranked[:, k - 1] - ranked[:, k] if k < n_expert else np.full(len(h), np.inf)
        routing.append((chosen, margin))
    out = np.zeros_like(h)
    for e in range(n_expert):
        rows, slot = np.nonzero(chosen == e)
        if not len(rows):
            continue
        x = h[rows]
        g = x @ w[prefix + EXPERT.format(e=e, which="gate")].T
        y = (g / (1.0 + np.exp(-g)) * (x @ w[prefix + EXPERT.format(e=e, which="up")].T)) \
            @ w[prefix + EXPERT.format(e=e, which="down")].T
        out[rows] += p[rows, e][:, None] * y
    return out


def swiglu(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    g = x @ gate.T
    return (g / (1.0 + np.exp(-g)) * (x @ up.T)) @ down.T


def llada2_moe_ffn(h: np.ndarray, w: dict, prefix: str, config: dict, routing: list | None) -> np.ndarray:
    """LLaDA2MoeSparseMoeBlock: s = sigmoid(router h) (fp32 in the official code); the choice ranks
    s + expert_bias: n_group groups scored by the sum of their best two, the topk_group best kept,
    the top-k of their experts; weights = the chosen unbiased s / their sum (top_k > 1) x
    routed_scaling_factor; plus the shared experts' SwiGLU of h. Appends (chosen (n, k) best first,
    margin (n,): the smaller of the gaps at the group cut and at the expert cut) to `routing`."""
    E, k = config["num_experts"], config["num_experts_per_tok"]
    G, kept = config.get("n_group") or 1, config.get("topk_group") or config.get("n_group") or 1
    s = 1.0 / (1.0 + np.exp(-(h @ w[prefix + LLADA2_NAMES["router"]].T)))       # (n, E)
    select = s + w[prefix + LLADA2_NAMES["bias"]]
    groups = select.reshape(len(h), G, E // G)
    group_score = np.sort(groups, axis=-1)[..., -2:].sum(-1)                     # (n, G)
    group_order = np.argsort(-group_score, axis=-1, kind="stable")
    keep = np.zeros((len(h), G), bool)
    np.put_along_axis(keep, group_order[:, :kept], True, axis=-1)
    masked = np.where(np.repeat(keep, E // G, axis=-1), select, -np.inf)
    order = np.argsort(-masked, axis=-1, kind="stable")
    chosen = order[:, :k]
    if routing is not None:
        ranked = np.take_along_axis(masked, order, axis=-1)
        ranked_groups = np.take_along_axis(group_score, group_order, axis=-1)
        margin = np.full(len(h), np.inf)
        if kept < G:
            margin = ranked_groups[:, kept - 1] - ranked_groups[:, kept]
        if k < kept * (E // G):
            margin = np.minimum(margin, ranked[:, k - 1] - ranked[:, k])
        routing.append((chosen, margin))
    weights = np.take_along_axis(s, chosen, axis=-1)
    if k > 1:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    weights = weights * config.get("routed_scaling_factor", 1.0)
    out = np.zeros_like(h)
    for e in range(E):
        rows, slot = np.nonzero(chosen == e)
        if len(rows):
            out[rows] += weights[rows, slot][:, None] * swiglu(
                h[rows], *(w[prefix + EXPERT.format(e=e, which=x)] for x in ("gate", "up", "down")))
    if config.get("num_shared_experts"):
        out += swiglu(h, *(w[prefix + f"mlp.shared_experts.{x}_proj.weight"] for x in ("gate", "up", "down")))
    return out


def block_size_of(hf_dir) -> int | None:
    """The trained block size of a block-diffusion checkpoint (None: full attention)."""
    config, _ = load(str(hf_dir))
    key = BLOCK_SIZE_KEYS.get(config["architectures"][0])
    # Fast-dLLM v2's code defaults bd_size to 32; LLaDA2's config has none, its generate() uses 32.
    return None if key is None else config.get(key, BLOCK_SIZE_DEFAULTS.get(config["architectures"][0], 32))


def block_causal(rows: range, n_keys: int, block_size: int) -> np.ndarray:
    """(len(rows), n_keys) boolean: query position p may see key position j iff j // B <= p // B."""
    return (np.arange(n_keys)[None, :] // block_size) <= (np.asarray(rows)[:, None] // block_size)


def forward(hf_dir, ids, weights: dict[str, np.ndarray] | None = None, routing: list | None = None,
            block_size: int | None = None, past: list | None = None, kv_out: list | None = None,
            rows=None, cache: list | None = None) -> np.ndarray:
    """Logits (n, vocab) float64 of token ids under the checkpoint in hf_dir (or its config with
    `weights`, Hugging Face name -> array, in place of its own). MoE: `routing`, a list, receives
    one (chosen experts, margin) per layer (see moe_ffn).

    Block diffusion (SDAR, Fast-dLLM v2): attention is block-causal with blocks of `block_size`
    (default: the model's own). `past`: per layer (k, v), each (n_kv, m, head_dim) after RoPE, of
    positions 0..m-1; `ids` are then positions m..m+n-1. `kv_out`, a list, receives per layer the
    (k, v) of all m + n positions.

    Full attention: `cache`, a list, per layer [k, v] of every position of `ids` (n_kv, len(ids),
    head_dim), after RoPE. Without `rows` every row is computed and `cache` is filled; with `rows`
    (positions) only those rows are computed, attending to every position's K/V in `cache`, where
    theirs are replaced; the logits are then those rows'."""
    config, w = load(str(hf_dir))
    w = w if weights is None else weights
    arch = config["architectures"][0]
    llada, moe = arch == "LLaDAModelLM", arch == "LLaDAMoEModelLM"
    sdar, blocky = arch == "SDARForCausalLM", arch in BLOCK_SIZE_KEYS
    llada2 = arch == "LLaDA2MoeModelLM"
    names = LLADA_NAMES if llada else MOE_NAMES if moe else SDAR_NAMES if sdar else \
        LLADA2_NAMES if llada2 else DREAM_NAMES
    if llada:
        n_embd, n_head, n_layer = config["d_model"], config["n_heads"], config["n_layers"]
        n_kv = config.get("n_kv_heads") or n_head
        tied = config.get("weight_tying", False)
    else:
        n_embd, n_head, n_layer = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]
        n_kv = config.get("num_key_value_heads") or n_head
        tied = config.get("tie_word_embeddings", False)
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    hd = config.get("head_dim") or n_embd // n_head
    n_rot = int(hd * config.get("partial_rotary_factor", 1.0))   # LLaDA2 rotates the first half only

    ids = np.asarray(ids)
    start = 0 if past is None else past[0][0].shape[1]
    positions = np.arange(start, start + len(ids)) if rows is None else np.asarray(rows)
    n = len(positions)
    allowed = None
    if blocky:
        allowed = block_causal(range(start, start + n), start + n, block_size or block_size_of(hf_dir))
    refill = cache is not None and rows is None
    if refill:
        cache.clear()
    x = w[names["embed"]][ids if rows is None else ids[positions]]            # (n, n_embd)
    for i in range(n_layer):
        L = {key: w.get(names["layer"].format(i=i) + names[key]) for key in names if key not in
             ("embed", "norm", "head", "layer")}
        h = rms_norm(x, L["attn_norm"], eps)
        if llada2:   # query_key_value: rows [q heads, k heads, v heads]
            q, k, v = np.split(h @ L["qkv"].T, [n_head * hd, (n_head + n_kv) * hd], axis=-1)
        else:
            q, k, v = h @ L["q"].T, h @ L["k"].T, h @ L["v"].T
        if L.get("q_bias") is not None:
            q, k, v = q + L["q_bias"], k + L["k_bias"], v + L["v_bias"]
        q = q.reshape(n, n_head, hd).transpose(1, 0, 2)                        # (n_head, n, hd)
        k = k.reshape(n, n_kv, hd).transpose(1, 0, 2)
        if moe or sdar or llada2:
            q, k = rms_norm(q, L["q_norm"], eps), rms_norm(k, L["k_norm"], eps)
        q = np.concatenate([rope(q[..., :n_rot], theta, positions), q[..., n_rot:]], axis=-1)
        k = np.concatenate([rope(k[..., :n_rot], theta, positions), k[..., n_rot:]], axis=-1)
        v = v.reshape(n, n_kv, hd).transpose(1, 0, 2)
        if refill:
            cache.append([k.copy(), v.copy()])
        elif cache is not None:                          # these rows' K/V replace theirs, the rest stays
            cache[i][0][:, positions], cache[i][1][:, positions] = k, v
            k, v = cache[i][0], cache[i][1]
        if past is not None:
            k, v = np.concatenate([past[i][0], k], axis=1), np.concatenate([past[i][1], v], axis=1)
        if kv_out is not None:
            kv_out.append((k, v))
        o = attention(q, k, v, allowed).transpose(1, 0, 2).reshape(n, n_head * hd)
        x = x + o @ L["o"].T
        h = rms_norm(x, L["ffn_norm"], eps)
        if moe:
            x = x + moe_ffn(h, w, names["layer"].format(i=i), config["num_experts"], config["num_experts_per_tok"],
                            routing)
            continue
        if llada2 and i >= config.get("first_k_dense_replace", 0):
            x = x + llada2_moe_ffn(h, w, names["layer"].format(i=i), config, routing)
            continue
        x = x + swiglu(h, L["gate"], L["up"], L["down"])
    x = rms_norm(x, w[names["norm"]], eps)
    head = w[names["embed"]] if tied else w[names["head"]]
    return x @ head.T
