"""Nemotron-Labs-Diffusion's draft LoRA: the checkpoint's `linear_spec_lora/` folder (PEFT:
adapter_config.json and adapter_model.safetensors, LoRA A and B of every layer's o_proj), which
self-speculation's draft passes add and its verify passes never do (NVIDIA's remote code toggles
the adapters on for the draft, off for prefill and verify; SGLang's LinearSpec "draft_only").

It is converted into the model's own GGUF, not into a separate adapter file as llama.cpp's
`--lora`: it belongs to the checkpoint (its drafter, shipped in the model's repository) and
changes no answer, only how many drafts a verify keeps, so the file a user converts decodes as
NVIDIA's does with nothing more to find or pass. `mode=self_spec, draft_lora=False` drafts with
the base weights.

GGUF: llama.cpp's adapter tensor names, blk.N.attn_output.weight.lora_a ((in, r) in ggml order:
PEFT's A (r, in) as stored) and .lora_b (ggml (r, out): B (out, r)), F32 in an f32 file and F16
otherwise (quantize leaves them so); the key diffusion.draft_lora.scale holds PEFT's scale,
lora_alpha / r (lora_alpha / sqrt(r) for rsLoRA).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from diffuse import gguf_file
from diffuse._core import DiffuseError
from diffuse.convert.families import HParams, read_json_object, shown
from diffuse.convert.safetensors_reader import Checkpoint

FOLDER = "linear_spec_lora"
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
SCALE_KEY = "diffusion.draft_lora.scale"
# PEFT's names: base_model.model.encoder.layers.N.self_attn.o_proj.lora_A.weight (the prefix is
# the wrapped model's path; only the part from `layers` on is read).
NAME = re.compile(r"(?:.*\.)?layers\.(\d+)\.self_attn\.(\w+)\.lora_([AB])\.weight")


def plan(hf_dir: Path, hp: HParams, outtype: str) -> tuple[list[tuple[gguf_file.OutTensor, np.ndarray]], float] | None:
    """The draft LoRA of a checkpoint folder as GGUF tensors with their data, and its scale; None
    when the folder has no linear_spec_lora/. Anything that does not fit the model is one error."""
    folder = hf_dir / FOLDER
    if not folder.is_dir():
        return None
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            raise DiffuseError(f"{folder}: no {name} (a PEFT LoRA folder holds {CONFIG} and {WEIGHTS}); "
                               f"move the folder away to convert without the draft LoRA")
    r, scale = _read_config(folder / CONFIG)
    ckpt = Checkpoint(folder, single=WEIGHTS)
    q, e = hp.n_head * hp.head_dim, hp.n_embd
    want = {}   # HF name -> (GGUF name, expected shape)
    for name in ckpt.tensors:
        m = NAME.fullmatch(name)
        if m is None:
            raise DiffuseError(f"{folder / WEIGHTS}: unexpected tensor {shown(name)} (the draft LoRA holds o_proj's "
                               "lora_A and lora_B of every layer, nothing else)")
        layer, module, ab = int(m[1]), m[2], m[3]
        if module != "o_proj":
            raise DiffuseError(f"{folder / WEIGHTS}: tensor {shown(name)} is a LoRA on {module}; the draft LoRA "
                               "targets o_proj only")
        if layer >= hp.n_layer:
            raise DiffuseError(f"{folder / WEIGHTS}: tensor {shown(name)} is for layer {layer}; the model has "
                               f"{hp.n_layer} layers")
        gguf_name = f"blk.{layer}.attn_output.weight.lora_{ab.lower()}"
        if gguf_name in (g for g, _ in want.values()):
            raise DiffuseError(f"{folder / WEIGHTS}: two tensors are layer {layer}'s lora_{ab} ({shown(name)})")
        want[name] = gguf_name, (r, q) if ab == "A" else (e, r)   # A: (r, in), B: (out, r)
    found = {g for g, _ in want.values()}
    for i in range(hp.n_layer):
        for ab in ("a", "b"):
            if f"blk.{i}.attn_output.weight.lora_{ab}" not in found:
                raise DiffuseError(f"{folder / WEIGHTS}: no lora_{ab.upper()} for layer {i}'s o_proj (the draft LoRA "
                                   f"must cover all {hp.n_layer} layers)")
    gtype, dtype = (T.F32, np.float32) if outtype == "f32" else (T.F16, np.float16)
    tensors = []
    for name in sorted(want, key=lambda n: want[n][0]):
        gguf_name, shape = want[name]
        entry = ckpt.tensors[name]
        if entry.shape != shape:
            a = gguf_name.endswith("_a")
            model_dim_ok = len(entry.shape) == 2 and entry.shape[1 if a else 0] == (q if a else e)
            why = (f"rank {entry.shape[0 if a else 1]}, but {CONFIG} says r = {r}" if model_dim_ok
                   else f"the model's o_proj maps {q} -> {e}")
            raise DiffuseError(f"{entry.path}: tensor {shown(name)} has shape {list(entry.shape)}, expected "
                               f"{list(shape)} ({why})")
        data = ckpt.read(name)
        if not np.isfinite(data).all():
            raise DiffuseError(f"{entry.path}: tensor {shown(name)} holds NaN or infinite values")
        tensors.append((gguf_file.OutTensor(gguf_name, int(gtype), shape[::-1]), np.ascontiguousarray(data, dtype)))
    return tensors, scale


def _read_config(path: Path) -> tuple[int, float]:
    """r and PEFT's scale from adapter_config.json; what the engine does not apply is refused."""
    config = read_json_object(path)

    def bad(what: str) -> DiffuseError:
        return DiffuseError(f"{path}: {what}; the draft LoRA diffuse applies is PEFT's plain LoRA on o_proj")

    if config.get("peft_type", "LORA") != "LORA":
        raise bad(f"peft_type = {shown(config.get('peft_type'))}")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 65536:
        raise bad(f"r = {shown(r)} is not a rank from 1 to 65536")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (math.isfinite(alpha) and alpha > 0):
        raise bad(f"lora_alpha = {shown(alpha)} is not a positive number")
    targets = config.get("target_modules")
    if targets not in ("o_proj", ["o_proj"]):
        raise bad(f"target_modules = {shown(targets)}, expected ['o_proj']")
    for key, plain in (("use_dora", False), ("fan_in_fan_out", False), ("bias", "none"), ("rank_pattern", {}),
                       ("alpha_pattern", {}), ("layers_to_transform", None), ("modules_to_save", None)):
        if config.get(key, plain) not in (plain, [] if plain is None else plain):
            raise bad(f"{key} = {shown(config[key])}")
    rslora = config.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise bad(f"use_rslora = {shown(rslora)}")
    return r, alpha / (math.sqrt(r) if rslora else r)
