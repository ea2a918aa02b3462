"""Hugging Face checkpoint folder -> GGUF in our dialect, streamed: one tensor in memory at a time
(in its output type), filled from memory-mapped safetensors in row chunks on all cores.
"""
from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import Keys, LlamaFileType
from gguf.quants import quantize as gguf_quantize

from diffuse import _core, gguf_file, recipe as recipes
from diffuse._core import DiffuseError
from diffuse.convert import diffusion_gemma, draft_lora
from diffuse.convert.families import (Family, HParams, authors_recipe, expected_shapes, qk_row_order, read_config,
                                      read_json_object)
from diffuse.convert.safetensors_reader import Checkpoint
from diffuse.convert.vocab import Vocab, read_vocab

FORMAT_VERSION = 1
# outtype -> (GGML type of the matrices, general.file_type); 1-D tensors (norms, biases) stay F32.
OUTTYPES = {
    "f32": (T.F32, LlamaFileType.ALL_F32),
    "f16": (T.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (T.BF16, LlamaFileType.MOSTLY_BF16),
    "q8_0": (T.Q8_0, LlamaFileType.MOSTLY_Q8_0),
}
CHUNK_FLOATS = 4 << 20   # values per work item (16 MB of float32)
BLOCK_SIZE_KEY = "diffusion.block_size"           # block diffusion: the trained block length
SUB_BLOCK_SIZE_KEY = "diffusion.sub_block_size"   # Fast-dLLM v2: a block is decoded in sub-blocks

Progress = Callable[[int, int, str], None]


class _Cancelled(Exception):
    pass


@dataclass
class _Tensor:
    """One GGUF tensor and where its data comes from."""
    out: gguf_file.OutTensor          # name, ggml type, ggml-order shape
    hf_names: list[str]               # one; or one per expert, stacked in order (MoE)
    row_order: np.ndarray | None      # LLaDA q/k permutation: output row r is HF row row_order[r]
    stacked: bool = False             # hf_names[p] is one 3-D (experts, out, in) tensor: part p is expert p
    data: np.ndarray | None = None    # a tensor the converter computes (no HF name)


def convert_hf(hf_dir, out_path, outtype: str = "f16", progress: Progress | None = None,
               cancel: Callable[[], bool] | None = None, recipe: dict | None = None) -> Path | None:
    """Convert a LLaDA, LLaDA-MoE, Dream, SDAR/TraDo, Fast-dLLM v2 or LLaDA2 checkpoint folder to a GGUF file.

    outtype: f32 | f16 | bf16 | q8_0 for the matrices. recipe: the generation options the model
    suggests (diffuse.recipe), written under diffuse.recipe.*; checked before any work. progress(done, total, tensor_name) once per
    tensor. Returns the output path, or None when cancel() returned True (nothing is left behind).
    The file appears under its name only when complete.
    """
    if outtype not in OUTTYPES:
        raise DiffuseError(f"unknown output type {outtype!r} (expected one of {', '.join(OUTTYPES)})")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    gguf_file.refuse_overwrite(out_path, [hf_dir, *_files_under(hf_dir)])
    if (hf_dir / "config.json").is_file() and diffusion_gemma.is_diffusion_gemma(read_json_object(hf_dir / "config.json")):
        _unused_lora(hf_dir)
        return _convert_diffusion_gemma(hf_dir, out_path, outtype, progress, cancel, recipe)
    family, hp, config = read_config(hf_dir)
    if not family.draft_lora:
        _unused_lora(hf_dir)
    # The authors' decoding (the family's table; LLaDA2.1's editing), overridden by the user's --recipe.
    # Checked against the model's own block, as the engine will plan it (not only its context).
    sizes = {"block_size": hp.block_size, "trained_block": hp.block_size}
    recipe = recipes.check({**authors_recipe(family, hp, hf_dir, config), **(recipe or {})}, family.arch, hp.n_ctx,
                           sizes)
    ckpt = Checkpoint(hf_dir)
    tensors, n_vocab = _plan(family, hp, ckpt, hf_dir, outtype)
    lora = draft_lora.plan(hf_dir, hp, outtype) if family.draft_lora else None
    if lora:
        tensors += [_Tensor(out, [], None, data=data) for out, data in lora[0]]
    vocab = read_vocab(hf_dir, family, config, n_vocab)
    by_text = vocab.id_of(family.mask_token) if family.mask_token else None
    mask_id = next((i for i in (hp.mask_token_id, by_text, family.default_mask_id) if i is not None), None)
    if mask_id is None or not 0 <= mask_id < n_vocab:
        where = (f"token {family.mask_token!r} in the vocabulary: {by_text}" if family.mask_token else
                 f"its official fallback {family.default_mask_id}, outside the {n_vocab} embedding rows")
        raise DiffuseError(f"{hf_dir}: no usable mask token id (config mask_token_id = {hp.mask_token_id}, {where})")
    kv, kv_types = _metadata(family, hp, vocab, n_vocab, mask_id, outtype, hf_dir.resolve().name)
    if lora:
        kv[draft_lora.SCALE_KEY], kv_types[draft_lora.SCALE_KEY] = lora[1], "f32"
    recipe_kv, recipe_types = recipes.metadata(recipe)
    return _write(out_path, kv | recipe_kv, kv_types | recipe_types, tensors, ckpt, progress, cancel)


class NotConverted(UserWarning):
    """Something in the checkpoint folder that the file will not hold (told, not refused)."""


def _unused_lora(hf_dir: Path) -> None:
    """A draft LoRA folder beside a model whose family reads none is left out: say so."""
    if (hf_dir / draft_lora.FOLDER).is_dir():
        warnings.warn(f"{hf_dir / draft_lora.FOLDER}: a draft LoRA, which only Nemotron-Labs-Diffusion's "
                      "self-speculation reads; not converted", NotConverted, stacklevel=3)


def _convert_diffusion_gemma(hf_dir: Path, out_path: Path, outtype: str, progress: Progress | None,
                             cancel: Callable[[], bool] | None, recipe: dict | None) -> Path | None:
    """DiffusionGemma's text model in PR #24423's dialect (convert/diffusion_gemma.py)."""
    config = read_json_object(hf_dir / "config.json")
    p = diffusion_gemma.read_params(hf_dir, config)
    recipe = recipes.check({**diffusion_gemma.recipe(hf_dir), **(recipe or {})}, diffusion_gemma.ARCH, p.n_ctx)
    ckpt = Checkpoint(hf_dir)
    tensors = []
    for out, hf in diffusion_gemma.plan(p, ckpt, hf_dir, OUTTYPES[outtype][0]):
        if hf is None:
            tensors.append(_Tensor(out, [], None, data=diffusion_gemma.rope_freqs(p)))
        elif len(out.shape) == 3:
            tensors.append(_Tensor(out, [hf] * out.shape[2], None, stacked=True))
        else:
            tensors.append(_Tensor(out, [hf], None))
    vocab = read_vocab(hf_dir, diffusion_gemma.FAMILY, config.get("text_config") or {}, p.vocab_size)
    kv, kv_types = {}, {}

    def put(key: str, value, type_name: str) -> None:
        key = key.format(arch=diffusion_gemma.ARCH)
        kv[key], kv_types[key] = value, type_name

    mask_id = vocab.id_of(diffusion_gemma.FAMILY.mask_token)
    _common_metadata(put, diffusion_gemma.ARCH, vocab, mask_id, outtype, hf_dir.resolve().name)
    diffusion_gemma.metadata(p, put)
    diffusion_gemma.sampler_metadata(recipe, put)
    eos = diffusion_gemma.eos_ids(hf_dir, config)
    if eos:
        put(Keys.Tokenizer.EOS_ID, eos[0], "u32")
        if len(eos) > 1:   # Gemma 4's end of turn (106), which ends an answer too
            put(Keys.Tokenizer.EOT_ID, eos[1], "u32")
    recipe_kv, recipe_types = recipes.metadata(recipe)
    return _write(out_path, kv | recipe_kv, kv_types | recipe_types, tensors, ckpt, progress, cancel)


def _write(out_path: Path, kv: dict, kv_types: dict, tensors: list[_Tensor], ckpt: Checkpoint,
           progress: Progress | None, cancel: Callable[[], bool] | None) -> Path | None:
    def data(pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        for done, t in enumerate(tensors, 1):
            if cancel is not None and cancel():
                raise _Cancelled
            yield _encode(t, ckpt, pool, cancel)
            if progress is not None:
                progress(done, len(tensors), t.out.name)

    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    try:
        gguf_file.write(out_path, kv, kv_types, [t.out for t in tensors], data(pool))
    except _Cancelled:
        return None
    finally:
        pool.shutdown(cancel_futures=True)
    return out_path


def _files_under(folder: Path) -> Iterator[Path]:
    """Every file in the checkpoint folder, the reader's or not: none may become the output."""
    for root, _, names in os.walk(folder):
        for name in names:
            yield Path(root, name)


def _plan(family: Family, hp: HParams, ckpt: Checkpoint, hf_dir: Path, outtype: str) -> tuple[list[_Tensor], int]:
    """The GGUF tensors in writing order, checked against the checkpoint; and the vocabulary size."""
    embd = family.tensors["token_embd.weight"]
    if embd not in ckpt.tensors:
        raise DiffuseError(f"{hf_dir}: missing tensor {embd}")
    n_vocab = ckpt.tensors[embd].shape[0]
    if n_vocab < hp.vocab_size:
        raise DiffuseError(f"{hf_dir}: {embd} has {n_vocab} rows but vocab_size is {hp.vocab_size}")
    shapes = expected_shapes(hp, n_vocab)
    matrix_type = OUTTYPES[outtype][0]
    block = _core.type_info(int(matrix_type))["block_size"]

    tensors, used = [], set()
    # (GGUF pattern, HF pattern, experts stacked in the tensor or None, its layers)
    every, dense, routed = range(hp.n_layer), range(hp.n_layer_dense), range(hp.n_layer_dense, hp.n_layer)
    patterns = [(p, hf, None, every) for p, hf in family.tensors.items()]
    patterns += [(p, hf, None, dense) for p, hf in (family.dense_tensors or {}).items()]
    patterns += [(p, hf, None, routed) for p, hf in (family.moe_tensors or {}).items()]
    patterns += [(p, hf, hp.n_expert, routed) for p, hf in (family.experts or {}).items()]
    for pattern, hf_pattern, n_experts, layers in patterns:
        if pattern == "output.weight" and hp.tied:
            continue   # the engine reuses token_embd
        for i in layers if "{i}" in pattern else [None]:
            name = pattern.format(i=i)
            hf_names = [hf_pattern.format(i=i, e=e) for e in range(n_experts or 1)]
            for hf_name in hf_names:
                entry = ckpt.tensors.get(hf_name)
                if entry is None:
                    raise DiffuseError(f"{hf_dir}: missing tensor {hf_name}")
                if entry.shape != shapes[pattern]:
                    raise DiffuseError(f"{entry.path}: tensor {hf_name} has shape {list(entry.shape)}, "
                                       f"expected {list(shapes[pattern])}")
            gtype = T.F32
            if len(entry.shape) == 2 and pattern not in family.f32_matrices:
                # Q8_0 stores whole 32-value blocks per row; llama.cpp falls back to F16 likewise.
                gtype = matrix_type if entry.shape[1] % block == 0 else T.F16
            order = None
            if family.permute_qk and pattern in ("blk.{i}.attn_q.weight", "blk.{i}.attn_k.weight"):
                order = qk_row_order(entry.shape[0], hp.n_head if "attn_q" in pattern else hp.n_head_kv)
            # numpy (out, in) is ggml (in, out): the data is written as it is; experts stack
            # along a third ggml dimension.
            shape = entry.shape[::-1] + (() if n_experts is None else (n_experts,))
            tensors.append(_Tensor(gguf_file.OutTensor(name, int(gtype), shape), hf_names, order))
            used.update(hf_names)

    unknown = sorted(set(ckpt.tensors) - used - {family.tensors["output.weight"]})
    if unknown:
        raise DiffuseError(f"{hf_dir}: unexpected tensor {unknown[0]} ({len(unknown)} in all) "
                           f"for a {family.hf_architecture} checkpoint")
    return tensors, n_vocab


def _encode(t: _Tensor, ckpt: Checkpoint, pool: ThreadPoolExecutor, cancel) -> np.ndarray:
    """A tensor in its output type, as uint8 (rows, bytes per row); converted in row chunks on the
    pool. An expert tensor's rows are its experts' rows one expert after another."""
    if t.data is not None:
        return t.data.view(np.uint8)
    if len(t.out.shape) == 1:
        return ckpt.read(t.hf_names[0]).view(np.uint8)
    cols, rows = t.out.shape[:2]               # per part (expert)
    total_rows = rows * len(t.hf_names)
    out = np.empty((total_rows, t.out.nbytes // total_rows), dtype=np.uint8)
    step = max(1, CHUNK_FLOATS // cols)

    def work(item: tuple[int, int]) -> None:
        part, r0 = item
        r1 = min(rows, r0 + step)
        x = ckpt.read(t.hf_names[part], slice(r0, r1) if t.row_order is None else t.row_order[r0:r1],
                      expert=part if t.stacked else None)
        dst = slice(part * rows + r0, part * rows + r1)
        if t.out.type == T.F32:
            out[dst] = x.view(np.uint8)
        elif t.out.type == T.F16:
            out[dst] = x.astype(np.float16).view(np.uint8)
        elif t.out.type == T.BF16:
            out[dst] = gguf_quantize(x, T.BF16)      # round to nearest even, as ggml does
        else:
            out[dst] = _core.quantize_rows(x, t.out.type)

    items = [(part, r0) for part in range(len(t.hf_names)) for r0 in range(0, rows, step)]
    for _ in pool.map(work, items):
        if cancel is not None and cancel():
            raise _Cancelled
    return out


def _metadata(family: Family, hp: HParams, vocab: Vocab, n_vocab: int, mask_id: int, outtype: str,
              name: str) -> tuple[dict, dict]:
    """Keys and their GGUF types: llama.cpp's names (see docs/ARCHITECTURE.md, "Keys we write")."""
    kv, types = {}, {}

    def put(key: str, value, type_name: str) -> None:
        key = key.format(arch=family.arch)
        kv[key], types[key] = value, type_name

    _common_metadata(put, family.arch, vocab, mask_id, outtype, name)
    put(Keys.LLM.CONTEXT_LENGTH, hp.n_ctx, "u32")
    put(Keys.LLM.EMBEDDING_LENGTH, hp.n_embd, "u32")
    put(Keys.LLM.BLOCK_COUNT, hp.n_layer, "u32")
    if hp.n_ff > 0:   # LLaDA-MoE: the unused dense width, as llama.cpp writes it
        put(Keys.LLM.FEED_FORWARD_LENGTH, hp.n_ff, "u32")
    if hp.n_expert > 0:
        put(Keys.LLM.EXPERT_COUNT, hp.n_expert, "u32")
        put(Keys.LLM.EXPERT_USED_COUNT, hp.n_expert_used, "u32")
        put(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, hp.n_ff_exp, "u32")
    if family.moe_tensors:   # LLaDA2's router and layout, with llama.cpp's bailingmoe2 keys
        put(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, hp.n_layer_dense, "u32")
        put(Keys.LLM.EXPERT_SHARED_COUNT, hp.n_expert_shared, "u32")
        put(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, hp.n_ff_exp, "u32")   # per shared expert
        put(Keys.LLM.EXPERT_GATING_FUNC, 2, "u32")                           # sigmoid
        put(Keys.LLM.EXPERT_GROUP_COUNT, hp.n_expert_groups, "u32")
        put(Keys.LLM.EXPERT_GROUP_USED_COUNT, hp.n_group_used or hp.n_expert_groups, "u32")
        put(Keys.LLM.EXPERT_WEIGHTS_NORM, hp.n_expert_used > 1, "bool")      # the official code: top_k > 1
        put(Keys.LLM.EXPERT_WEIGHTS_SCALE, hp.expert_scale, "f32")
    put(Keys.Attention.HEAD_COUNT, hp.n_head, "u32")
    put(Keys.Attention.HEAD_COUNT_KV, hp.n_head_kv, "u32")
    put(Keys.Rope.FREQ_BASE, hp.rope_theta, "f32")
    put(Keys.Attention.LAYERNORM_RMS_EPS, hp.rms_eps, "f32")
    put(Keys.Rope.DIMENSION_COUNT, hp.n_rot, "u32")
    if hp.yarn_factor:
        put(Keys.Rope.SCALING_TYPE, "yarn", "str")
        put(Keys.Rope.SCALING_FACTOR, hp.yarn_factor, "f32")
        put(Keys.Rope.SCALING_ORIG_CTX_LEN, hp.yarn_orig_ctx, "u32")
        put(Keys.Rope.SCALING_YARN_BETA_FAST, hp.yarn_beta_fast, "f32")
        put(Keys.Rope.SCALING_YARN_BETA_SLOW, hp.yarn_beta_slow, "f32")
        put(Keys.Rope.SCALING_ATTN_FACTOR, hp.yarn_attn_factor, "f32")
        put(Keys.Attention.TEMPERATURE_SCALE, hp.attn_temp_scale, "f32")
        put(Keys.Attention.TEMPERATURE_LENGTH, hp.yarn_orig_ctx, "u32")
    put(Keys.LLM.VOCAB_SIZE, n_vocab, "u32")
    put(Keys.Attention.CAUSAL, False, "bool")
    put(Keys.Diffusion.SHIFT_LOGITS, family.shift_logits, "bool")
    if hp.block_size or hp.head_dim * hp.n_head != hp.n_embd:
        # The head size is stated because Qwen3's need not be n_embd / n_head.
        put(Keys.Attention.KEY_LENGTH, hp.head_dim, "u32")
        put(Keys.Attention.VALUE_LENGTH, hp.head_dim, "u32")
    if hp.block_size:
        # Block diffusion: the block size's presence means block-causal attention.
        put(BLOCK_SIZE_KEY, hp.block_size, "u32")
        if family.sub_block_size:
            put(SUB_BLOCK_SIZE_KEY, family.sub_block_size, "u32")

    return kv, types


def _common_metadata(put, arch: str, vocab: Vocab, mask_id: int | None, outtype: str, name: str) -> None:
    """The keys of every family: general.*, our format version, the tokenizer."""
    put(Keys.General.ARCHITECTURE, arch, "str")
    put(Keys.General.NAME, name, "str")
    put(Keys.General.FILE_TYPE, int(OUTTYPES[outtype][1]), "u32")
    put(Keys.General.QUANTIZATION_VERSION, 2, "u32")   # GGML_QNT_VERSION, as llama.cpp's converters write
    put("diffuse.format_version", FORMAT_VERSION, "u32")
    if vocab.pre == "gemma4":   # as llama.cpp's Gemma 4 converter writes it: no pre-tokenizer, placeholder scores
        put(Keys.Tokenizer.MODEL, "gemma4", "str")
        put(Keys.Tokenizer.SCORES, [-1000.0] * len(vocab.tokens), "array[f32]")
        put(Keys.Tokenizer.ADD_PREFIX, False, "bool")
    else:
        put(Keys.Tokenizer.MODEL, "gpt2", "str")
        put(Keys.Tokenizer.PRE, vocab.pre, "str")
    put(Keys.Tokenizer.LIST, vocab.tokens, "array[str]")
    put(Keys.Tokenizer.TOKEN_TYPE, vocab.types, "array[i32]")
    if vocab.merges:
        put(Keys.Tokenizer.MERGES, vocab.merges, "array[str]")
    for kind, key in (("bos", Keys.Tokenizer.BOS_ID), ("eos", Keys.Tokenizer.EOS_ID),
                      ("pad", Keys.Tokenizer.PAD_ID), ("eot", Keys.Tokenizer.EOT_ID)):
        if kind in vocab.special_ids:
            put(key, vocab.special_ids[kind], "u32")
    if mask_id is not None:
        put(Keys.Tokenizer.MASK_ID, mask_id, "u32")
    if vocab.add_bos is not None:
        put(Keys.Tokenizer.ADD_BOS, vocab.add_bos, "bool")
    if vocab.chat_template:
        put(Keys.Tokenizer.CHAT_TEMPLATE, vocab.chat_template, "str")
    put(Keys.Tokenizer.HF_JSON, vocab.hf_json, "str")
