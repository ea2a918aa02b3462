"""Write a trained model as a Hugging Face checkpoint in the layout of the real ones.

LLaDA: GSAI-ML/LLaDA-8B's config.json field names (`LLaDAModelLM`, d_model, n_layers,
mlp_hidden_size, ...) and OLMo-style tensor names. SDAR: JetLM/SDAR-4B-Chat's (`SDARForCausalLM`,
Qwen3's fields plus block_size and mask_token_id). model.safetensors and the tokenizer files beside.
Written to `<dir>.part` and renamed, so a crash never leaves half a checkpoint under the name.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_file
from tokenizers import Tokenizer

from diffuse import DiffuseError
from diffuse.train.bpe import BOS, EOS, MASK, save_tokenizer
from diffuse.train.model import SDAR, LLaDA

# The recipe a model trained with `diffuse train`'s defaults suggests in its GGUF (diffuse.recipe),
# the settings of its model card's samples (models/README.md): greedy decoding falls into loops,
# so it samples at 0.7, and 64 positions in blocks of 16, one step a position.
RECIPE = {"gen_length": 64, "steps": 64, "block_length": 16, "temperature": 0.7}
# An SDAR-layout model decodes its own blocks as SDAR's generate.py does (one step per position at
# most, the dynamic rule), sampling at the same temperature.
SDAR_RECIPE = {"gen_length": 64, "steps": 4, "scheduler": "low_confidence_dynamic", "confidence_threshold": 0.9,
               "temperature": 0.7}


def recipe_for(seq_len: int, arch: str = "llada", block_size: int = 4) -> dict:
    """The recipe for a model trained on `seq_len` positions: all of it where its answer leaves as
    many positions for the prompt, else only its temperature (a shorter schedule is untested)."""
    full = RECIPE if arch == "llada" else {**SDAR_RECIPE, "block_length": block_size, "steps": block_size}
    return full if 2 * full["gen_length"] <= seq_len else {"temperature": full["temperature"]}


def llada_config(model: LLaDA, tok: Tokenizer) -> dict:
    s = model.shape
    return {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "activation_type": "silu",
        "alibi": False,
        "attention_dropout": 0.0,
        "attention_layer_norm": False,
        "bias_for_layer_norm": False,
        "block_group_size": 1,
        "block_type": "llama",
        "d_model": s.d_model,
        "embedding_dropout": 0.0,
        "embedding_size": s.vocab_size,
        "eos_token_id": tok.token_to_id(EOS),
        "bos_token_id": tok.token_to_id(BOS),
        "flash_attention": False,
        "include_bias": False,
        "include_qkv_bias": False,
        "input_emb_norm": False,
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "mask_token_id": tok.token_to_id(MASK),
        "max_sequence_length": s.max_sequence_length,
        "mlp_hidden_size": s.mlp_hidden_size,
        "mlp_ratio": round(s.mlp_hidden_size / s.d_model, 3),
        "multi_query_attention": None,
        "n_heads": s.n_heads,
        "n_kv_heads": s.n_heads,
        "n_layers": s.n_layers,
        "pad_token_id": tok.token_to_id(EOS),
        "precision": "fp32",
        "residual_dropout": 0.0,
        "rms_norm_eps": s.rms_norm_eps,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": s.rope_theta,
        "scale_logits": False,
        "use_cache": False,
        "vocab_size": s.vocab_size,
        "weight_tying": False,
    }


def sdar_config(model: SDAR, tok: Tokenizer) -> dict:
    s = model.shape
    return {
        "architectures": ["SDARForCausalLM"],
        "model_type": "sdar",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": model.block,
        "bos_token_id": tok.token_to_id(BOS),
        "eos_token_id": tok.token_to_id(EOS),
        "head_dim": s.d_model // s.n_heads,
        "hidden_act": "silu",
        "hidden_size": s.d_model,
        "initializer_range": 0.02,
        "intermediate_size": s.mlp_hidden_size,
        "mask_token_id": tok.token_to_id(MASK),
        "max_position_embeddings": s.max_sequence_length,
        "num_attention_heads": s.n_heads,
        "num_hidden_layers": s.n_layers,
        "num_key_value_heads": s.n_heads,
        "rms_norm_eps": s.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": s.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": False,
        "use_sliding_window": False,
        "vocab_size": s.vocab_size,
    }


def save_hf(model: LLaDA | SDAR, tok: Tokenizer, out_dir: Path, training: dict) -> None:
    """`training` (data, steps, time, scores) goes to training_info.json for the model card."""
    part = out_dir.with_name(out_dir.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    try:
        part.mkdir(parents=True)
        tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, str(part / "model.safetensors"), metadata={"format": "pt"})
        config = sdar_config(model, tok) if isinstance(model, SDAR) else llada_config(model, tok)
        (part / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_tokenizer(tok, part, model.shape.max_sequence_length)
        (part / "training_info.json").write_text(json.dumps(training, indent=2) + "\n")
    except (OSError, RuntimeError, ValueError) as e:   # a full disk: no half checkpoint left behind
        shutil.rmtree(part, ignore_errors=True)
        raise DiffuseError(f"{out_dir}: cannot save the checkpoint ({e}); the last complete one is kept") from None
    shutil.rmtree(out_dir, ignore_errors=True)
    part.rename(out_dir)
