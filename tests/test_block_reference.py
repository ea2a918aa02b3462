"""The block-diffusion references themselves: the float64 forward against float64 transformers
(Qwen3 for SDAR, Qwen2 for Fast-dLLM v2, Llama for Stable-DiffCoder) under a 4-D additive block-causal mask, and the ports of
the official loops (tests/reference/block_generate.py) on the tiny checkpoints."""
from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_models import write_fast_dllm_v2, write_sdar, write_stable_diffcoder
from reference import block_generate as bg
from reference.forward import block_causal, forward, load
from tokenizers import Tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_model(hf_dir):
    """The checkpoint as a float64 transformers Qwen3/Qwen2 model. transformers computes RoPE angles
    and RMSNorm in float32 whatever the model's dtype (and eager attention's softmax): those two are
    swapped for float64 ones, and attention runs through SDPA, so that only the architecture is
    compared."""
    config, weights = load(str(hf_dir))
    cls, cfg_cls = {"SDARForCausalLM": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config),
                    # Stable-DiffCoder's modeling_stable_diffcoder.py subclasses LlamaForCausalLM
                    "StableDiffcoderForCausalLM": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
                    }.get(config["architectures"][0], (transformers.Qwen2ForCausalLM, transformers.Qwen2Config))
    cfg = cfg_cls(**{k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")})
    cfg._attn_implementation = "sdpa"
    model = cls(cfg).to(torch.float64).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=not cfg.tie_word_embeddings)
    hd = config.get("head_dim") or cfg.hidden_size // cfg.num_attention_heads
    inv_freq = 1.0 / config["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)

    def rope(x, position_ids):
        angles = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat([angles, angles], -1)
        return emb.cos(), emb.sin()

    model.model.rotary_emb.forward = rope
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = (lambda m: lambda x: m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                                        + m.variance_epsilon))(m)
    return model


def hf_logits(model, ids, block_size: int) -> np.ndarray:
    n = len(ids)
    mask = torch.from_numpy(np.where(block_causal(range(n), n, block_size), 0.0, -np.inf))[None, None]
    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), attention_mask=mask, position_ids=torch.arange(n)[None])
    return out.logits[0].numpy()


@pytest.fixture(scope="module", params=["sdar", "sdar-tied", "fast-dllm-v2", "fast-dllm-v2-untied", "stable-diffcoder"])
def checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("block") / request.param
    if request.param == "stable-diffcoder":
        return write_stable_diffcoder(folder, dtype="f32")
    if request.param.startswith("sdar"):
        return write_sdar(folder, dtype="f32", tied=request.param.endswith("tied"))
    return write_fast_dllm_v2(folder, dtype="f32", tied=not request.param.endswith("untied"))


@pytest.mark.parametrize("block_size", [4, 8])
def test_forward_matches_transformers(checkpoint, block_size):
    ids = np.random.default_rng(block_size).integers(0, 400, 19)   # ends inside a block
    ref = forward(checkpoint, ids, block_size=block_size)
    hf = hf_logits(hf_model(checkpoint), ids, block_size)
    # Alone the two float64 computations agree to ~1e-16; with transformers 5.24, after the hostile tests
    # in the same process, sdar at block 4 measured 5.7e-9 of the largest logit (cause not found: some
    # state left by an earlier test). An architecture mistake shows at 1e-2 and above, so the limit is
    # set at 1e-7, above what was measured.
    assert np.abs(ref - hf).max() <= 1e-7 * np.abs(hf).max()


def test_attention_is_block_causal(checkpoint):
    ids = np.random.default_rng(0).integers(0, 400, 12)
    base = forward(checkpoint, ids, block_size=4)
    later = ids.copy()
    later[9] = (later[9] + 1) % 400                                 # a token of block 2
    changed = forward(checkpoint, later, block_size=4)
    assert np.array_equal(base[:8], changed[:8])                    # blocks 0 and 1 cannot see it
    assert not np.allclose(base[8:], changed[8:])                   # its own block sees it both ways
    assert not np.allclose(base[8], changed[8])


def test_cached_rows_equal_the_full_pass(tiny_hf_sdar):
    ids = list(np.random.default_rng(1).integers(0, 400, 12))
    full = forward(tiny_hf_sdar, ids, block_size=4)
    kv: list = []
    forward(tiny_hf_sdar, ids[:8], block_size=4, kv_out=kv)
    rows = forward(tiny_hf_sdar, ids[8:], block_size=4, past=kv)
    assert np.abs(rows - full[8:]).max() <= 1e-12 * np.abs(full).max()


def test_schedule_gives_the_remainder_first():
    assert bg.schedule(4, 4) == [1, 1, 1, 1]
    assert bg.schedule(8, 3) == [3, 3, 2]
    assert bg.schedule(4, 8) == [1, 1, 1, 1, 0, 0, 0, 0]


def test_entropy_bounded_takes_the_largest_k_within_the_budget():
    # entropies of near-one-hot rows are tiny; a uniform row over the vocabulary has log(V)
    sure = np.full(50, -30.0)
    sure[3] = 30.0
    logits = np.stack([sure, np.zeros(50), sure, np.zeros(50)])
    masked = np.array([True, True, True, True])
    # the largest entropy is not counted: both sure rows and one uncertain row (the lower position)
    assert sorted(bg.choose("entropy_bounded", logits, masked, 0, 0.0, 0.1)) == [0, 1, 2]
    # at least one, even when the first entropy alone exceeds the budget
    assert len(bg.choose("entropy_bounded", logits[[1, 3]], masked[:2], 0, 0.0, 0.0)) == 1
    # a second uncertain row counts its log(50)
    assert len(bg.choose("entropy_bounded", logits, masked, 0, 0.0, np.log(50) + 1e-6)) == 4


def test_rules_respect_counts_and_thresholds():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(4, 30)) * 3
    masked = np.array([True, False, True, True])
    assert len(bg.choose("low_confidence_static", logits, masked, 2, 0.0, 0.0)) == 2
    assert 1 not in bg.choose("low_confidence_static", logits, masked, 4, 0.0, 0.0)   # capped: 3, never a decided one
    assert len(bg.choose("low_confidence_dynamic", logits, masked, 1, 0.0, 0.0)) == 3  # all above tau = 0
    assert len(bg.choose("confidence_threshold", logits, masked, 0, 1.0, 0.0)) == 1    # at least the best


def _check_sdar_run(run, prompt_len, gen_length, B, mask_id):
    total = -(-(prompt_len + gen_length) // B) * B
    assert len(run.tokens) == total - prompt_len
    assert mask_id not in run.tokens
    committed = [pos for kind, commits in run.passes if kind == "denoise" for pos, _ in commits]
    assert sorted(committed) == list(range(prompt_len, total))          # every answer position, once
    blocks = [sorted({pos // B for pos, _ in commits}) for kind, commits in run.passes if kind == "denoise"]
    assert all(len(b) == 1 for b in blocks)                              # a step stays in its block
    assert [b[0] for b in blocks] == sorted(b[0] for b in blocks)        # blocks in order
    assert run.passes[0][0] == ("prefill" if prompt_len >= B else "denoise")


@pytest.mark.parametrize("rule", bg.RULES)
@pytest.mark.parametrize("B,prompt_len", [(4, 6), (4, 8), (8, 5), (8, 16), (4, 2)])
def test_sdar_loop(tiny_hf_sdar, rule, B, prompt_len):
    config, _ = load(str(tiny_hf_sdar))
    mask_id = config["mask_token_id"]
    prompt = list(np.random.default_rng(B + prompt_len).integers(0, 400, prompt_len))
    kwargs = dict(gen_length=9, block_length=B, steps=3, rule=rule, confidence_threshold=0.05, eb_threshold=1.0)
    cached = bg.sdar_generate(bg.Cached(tiny_hf_sdar, B), prompt, mask_id, **kwargs)
    _check_sdar_run(cached, prompt_len, 9, B, mask_id)
    recomputed = bg.sdar_generate(bg.Recompute(tiny_hf_sdar, B), prompt, mask_id, **kwargs)
    assert recomputed.tokens == cached.tokens and recomputed.passes == cached.passes
    n_store = sum(kind == "store" for kind, _ in cached.passes)
    assert n_store == len(range(prompt_len // B * B, prompt_len + 9, B))   # one per decoded block


def test_sdar_static_steps_follow_the_schedule(tiny_hf_sdar):
    config, _ = load(str(tiny_hf_sdar))
    run = bg.sdar_generate(bg.Cached(tiny_hf_sdar, 8), [1, 2, 3, 4, 5, 6, 7, 8], config["mask_token_id"], 8,
                           block_length=8, steps=3, rule="low_confidence_static")
    assert [len(c) for kind, c in run.passes if kind == "denoise"] == [3, 3, 2]
    assert run.forwards == 1 + 3 + 1                                     # prefill, 3 steps, store


def test_sdar_stops_after_the_block_holding_a_stop_id(tiny_hf_sdar):
    config, _ = load(str(tiny_hf_sdar))
    mask_id, prompt = config["mask_token_id"], [5, 6, 7]
    full = bg.sdar_generate(bg.Cached(tiny_hf_sdar, 4), prompt, mask_id, 16, rule="low_confidence_static")
    stop = full.tokens[4]                                                 # a token of the second block
    run = bg.sdar_generate(bg.Cached(tiny_hf_sdar, 4), prompt, mask_id, 16, rule="low_confidence_static",
                           stop_ids=(stop,))
    end = ((len(prompt) + full.tokens.index(stop)) // 4 + 1) * 4         # the end of its block
    assert run.tokens == full.tokens[:end - len(prompt)]


def fast_dllm_mask(hf_dir) -> int:
    """Fast-dLLM v2 keeps no mask id in config.json: the tokenizer's |<MASK>|."""
    return Tokenizer.from_file(str(hf_dir / "tokenizer.json")).token_to_id("|<MASK>|")


@pytest.mark.parametrize("prompt_len", [5, 32, 40, 64])
def test_fast_dllm_v2_loop(tiny_hf_fast_dllm_v2, prompt_len):
    B, sub = 32, 8
    mask_id = fast_dllm_mask(tiny_hf_fast_dllm_v2)
    prompt = list(np.random.default_rng(prompt_len).integers(0, 400, prompt_len))
    kwargs = dict(max_new_tokens=64, block_size=B, sub_block_size=sub, threshold=0.05)
    cached = bg.fast_dllm_v2_generate(bg.Cached(tiny_hf_fast_dllm_v2, B), prompt, mask_id, **kwargs)
    recomputed = bg.fast_dllm_v2_generate(bg.Recompute(tiny_hf_fast_dllm_v2, B), prompt, mask_id, **kwargs)
    assert recomputed.tokens == cached.tokens and recomputed.passes == cached.passes
    r = prompt_len % B
    assert len(cached.tokens) == 2 * B - r + 1 if r else 2 * B + 1      # ends with the next block's first token
    assert mask_id not in cached.tokens
    kinds = [kind for kind, _ in cached.passes]
    assert kinds.count("store") == 2 and kinds[0] == ("prefill" if prompt_len >= B else "denoise")
    if r == 0:
        assert cached.passes[0][1] == [(prompt_len, cached.tokens[0])]  # first token from the prefill's last row
    stores = [c for kind, c in cached.passes if kind == "store"]
    assert all(len(c) == 1 and c[0][0] % B == 0 for c in stores)         # each gives the next block's first token
    # sub-blocks in order: a pass commits inside one sub-block, never before an earlier one
    subs = [sorted({pos // sub for pos, _ in c}) for kind, c in cached.passes if kind == "denoise"]
    assert all(len(s) == 1 for s in subs) and [s[0] for s in subs] == sorted(s[0] for s in subs)


def test_fast_dllm_v2_stops_at_the_stop_token(tiny_hf_fast_dllm_v2):
    prompt, mask_id = [3, 4, 5, 6, 7], fast_dllm_mask(tiny_hf_fast_dllm_v2)
    full = bg.fast_dllm_v2_generate(bg.Cached(tiny_hf_fast_dllm_v2, 32), prompt, mask_id, 64, threshold=0.05)
    stop = full.tokens[3]
    run = bg.fast_dllm_v2_generate(bg.Cached(tiny_hf_fast_dllm_v2, 32), prompt, mask_id, 64, threshold=0.05,
                                   stop_id=stop)
    assert run.tokens == full.tokens[:full.tokens.index(stop) + 1]
    assert run.forwards < full.forwards
