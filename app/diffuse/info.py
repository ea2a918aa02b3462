"""A summary of any GGUF file: family, dialect, hyper-parameters, weight types, tokenizer."""
from __future__ import annotations

import json
import os
import warnings

from gguf import LlamaFileType

from diffuse import gguf_file, recipe
from diffuse._core import DiffuseError
from diffuse.generation import default_options
from diffuse.convert.hf_to_gguf import BLOCK_SIZE_KEY, SUB_BLOCK_SIZE_KEY
from diffuse.model import load
from diffuse.tokenizer import Tokenizer

MAX_SHOWN = 500   # characters of any one string from the file (a name may be megabytes long)


def describe(path: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> dict:
    """Everything `diffuse info` shows, as plain data (JSON-serialisable).

    The file's metadata and tensor table come first; the engine then loads the model to report
    the hyper-parameters it will use. A file the engine refuses is still described, with the
    reason under "load_error" (and "tokenizer_error" likewise).
    """
    info = gguf_file.read(path)
    kv = info.kv
    types: dict[str, dict] = {}
    for t in info.tensors:
        entry = types.setdefault(t.type_name, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += t.nbytes
    file_type = kv.get("general.file_type")
    d = {
        "path": info.path,
        "file_size": info.file_size,
        "gguf_version": info.version,
        "architecture": info.architecture,
        "family": info.family,
        "dialect": info.dialect,
        "name": name if isinstance(name := kv.get("general.name"), str) else None,
        "file_type": file_type,
        "file_type_name": ftype_name(file_type),
        "tensor_count": len(info.tensors),
        "parameters": sum(t.n_elements for t in info.tensors),
        "weights_bytes": sum(t.nbytes for t in info.tensors),
        "types": dict(sorted(types.items(), key=lambda item: -item[1]["bytes"])),   # largest first
        "tensors": [{"name": t.name, "type": t.type_name, "shape": list(t.shape), "bytes": t.nbytes}
                    for t in info.tensors],
        "hparams": None,
        "recipe": None,         # the generation options the file suggests (diffuse.recipe)
        "tokenizer": None,
        "diffusion": _diffusion(kv),
    }
    hparams = None
    if info.family is not None:
        try:
            with warnings.catch_warnings():     # an ignored recipe is shown as recipe_problem
                warnings.simplefilter("ignore", recipe.RecipeWarning)
                model = load(path, threads=1)
            hparams = d["hparams"] = model.hparams
            d["recipe"] = model.recipe
            if model.recipe_problem:
                d["recipe_problem"] = model.recipe_problem
        except DiffuseError as e:
            d["load_error"] = str(e)
    else:
        d["load_error"] = f"{info.path}: architecture '{info.architecture}' is not a diffusion model diffuse can run"
    try:
        tok = Tokenizer.for_model(path, tokenizer, hparams)
        specials = tok.special_tokens
        d["tokenizer"] = {
            "source": tok.source,
            "vocab_size": tok.vocab_size,
            "special_count": len(specials),
            "bos": _token(tok, tok.bos_token_id),
            "eos": [_token(tok, i) for i in tok.eos_token_ids],
            "mask": _token(tok, tok.mask_token_id),
            "chat_template": tok.chat_template is not None,
            "chat_template_in_file": isinstance(kv.get("tokenizer.chat_template"), str),
        }
    except DiffuseError as e:
        d["tokenizer_error"] = str(e)
    return d


def _diffusion(kv: dict) -> dict:
    """What the file says about its decoding, read from the keys themselves (the engine's view is
    under "hparams"): the trained block size (block diffusion when present), sub-block size, mask
    id and logit shift."""
    def number(key):
        value = kv.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    shift = kv.get("diffusion.shift_logits")
    return {
        "block_size": number(BLOCK_SIZE_KEY),
        "sub_block_size": number(SUB_BLOCK_SIZE_KEY),
        "mask_token_id": number("tokenizer.ggml.mask_token_id"),
        "shift_logits": shift if isinstance(shift, bool) else None,
    }


def ftype_name(ftype) -> str | None:
    try:
        return LlamaFileType(ftype).name.removeprefix("MOSTLY_")
    except (ValueError, TypeError):
        return None


def _token(tok, token_id: int | None) -> dict | None:
    return None if token_id is None else {"id": token_id, "text": tok.id_to_token(token_id)}


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return ""


def escaped(text: str, limit: int | None = MAX_SHOWN) -> str:
    """`text` with every character a terminal could act on (C0 and C1 controls, DEL, bidi
    overrides, other format characters) written as \\xNN / \\uNNNN, and cut to `limit` characters."""
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}... ({len(text)} characters)"
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _cleaned(value, clean):
    """`value` (describe's plain data) with `clean` applied to every string, keys included."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {_cleaned(k, clean): _cleaned(v, clean) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v, clean) for v in value]
    return value


def format_json(d: dict) -> str:
    """describe's result as JSON, long strings cut and non-printable characters as \\u escapes
    (json.dumps leaves C1 controls and bidi overrides raw)."""
    text = json.dumps(_cleaned(d, lambda s: s if len(s) <= MAX_SHOWN else s[:MAX_SHOWN] + "..."),
                      indent=2, ensure_ascii=False)
    return "".join(c if c.isprintable() or c == "\n" else json.dumps(c)[1:-1] for c in text)


def format_info(d: dict, tensors: bool = False) -> str:
    """The human-readable text of :func:`describe`'s result; `tensors` adds the per-tensor table.
    Every string from the file is escaped, so a hostile file cannot drive the terminal."""
    d = _cleaned(d, escaped)
    lines = [
        f"file          {d['path']} ({_size(d['file_size'])}, GGUF v{d['gguf_version']})",
        f"architecture  {d['architecture']} (family {d['family'] or '-'}, dialect {d['dialect']})",
    ]
    if d.get("name"):
        lines.append(f"name          {d['name']}")
    if d["file_type"] is not None:
        lines.append(f"file type     {d['file_type_name'] or '?'} ({d['file_type']})")
    lines.append(f"tensors       {d['tensor_count']}, {d['parameters'] / 1e6:.2f} M parameters, "
                 f"{_size(d['weights_bytes'])}")
    for name, t in d["types"].items():
        lines.append(f"  {name:<10}  {t['count']:>5} tensors  {_size(t['bytes']):>12}")
    hp = d.get("hparams")
    if hp:
        lines.append("hyper-parameters")
        lines.append(f"  layers {hp['n_layer']}, d_model {hp['n_embd']}, ffn {hp['n_ff']}, heads {hp['n_head']} "
                     f"(kv {hp['n_head_kv']}, dim {hp['head_dim']}), vocab {hp['n_vocab']}")
        lines.append(f"  context {hp['n_ctx_train']}, rope theta {hp['rope_theta']:g} ({hp['rope_mode']}), "
                     f"rms eps {hp['rms_eps']:g}, shift logits {hp['shift_logits']}, mask id {hp['mask_token_id']}")
        if hp.get("n_expert"):
            lines.append(f"  experts {hp['n_expert']} per layer, {hp['n_expert_used']} used per position, "
                         f"width {hp['n_ff_exp']}; q/k norm {hp['qk_norm']}")
            if hp.get("router") == "sigmoid":   # LLaDA2
                lines.append(f"  router sigmoid with selection bias, {hp['n_group_used']} of {hp['n_expert_groups']} "
                             f"groups, weights x {hp['expert_weights_scale']:g}; {hp['n_expert_shared']} shared "
                             f"expert(s); {hp['n_layer_dense']} dense layer(s) first; rope over {hp['n_rot']} of "
                             f"{hp['head_dim']} dims")
    diff = d.get("diffusion") or {}
    if hp and hp.get("rope_yarn"):
        lines.append(f"  YaRN RoPE x{hp['rope_scaling_factor']:g}, llama-4 query scale {hp['attn_temp_scale']:g}")
    if hp and hp.get("trained_block"):   # Nemotron-Labs-Diffusion: blocks over a causal cache, no block mask
        lines.append(f"diffusion     causal attention; blocks of {hp['trained_block']} over the causal cache (mode "
                     f"diffusion), self-speculation (mode self_spec); mask id {diff.get('mask_token_id')}")
        if hp.get("draft_lora_rank"):
            lines.append(f"  draft LoRA of rank {hp['draft_lora_rank']} on o_proj, scale {hp['draft_lora_scale']:g}: "
                         "self_spec's draft passes only (draft_lora)")
    elif diff.get("block_size"):
        sub = f", sub-blocks of {diff['sub_block_size']}" if diff.get("sub_block_size") else ""
        shift = "-" if diff["shift_logits"] is None else diff["shift_logits"]
        lines.append(f"block diffusion  trained on blocks of {diff['block_size']}{sub} (causal across blocks, "
                     f"bidirectional inside); mask id {diff['mask_token_id']}, shift logits {shift}")
    if hp and hp["family"] == "wedlm":   # no blocks: a window over the causal cache
        o = default_options(hp["arch"], d.get("recipe"))
        lines.append(f"diffusion     causal attention; a sliding window of {o['window_size']} positions per causal "
                     f"pass; a mask is filled where its entropy + {o['pos_penalty']:g} per position past the window's "
                     f"first mask is below {o['threshold']:g} nats, the filled ones at its start are committed to "
                     f"the cache; mask id {hp['mask_token_id']}")
    if hp and hp.get("canvas_length"):
        lines.append(f"uniform-state diffusion  canvas of {hp['canvas_length']} random tokens denoised over a causally "
                     f"encoded cache; sliding window {hp['sliding_window']}, logit softcap {hp['logit_softcap']:g}")
    if d.get("recipe_problem"):
        lines.append(f"recipe        ignored: {d['recipe_problem']}")
    elif d.get("recipe") is not None:
        suggested = recipe.text(d["recipe"]) if d["recipe"] else f"none (the {hp['arch']} defaults)"
        lines.append(f"recipe        {suggested}")
    if d.get("load_error"):
        lines.append(f"cannot load    {d['load_error']}")
    tok = d.get("tokenizer")
    if tok:
        def show(t):
            return "-" if t is None else f"{t['id']} '{t['text']}'"
        lines.append(f"tokenizer     {tok['vocab_size']} tokens from {tok['source']}, {tok['special_count']} special")
        lines.append(f"  bos {show(tok['bos'])}; eos {', '.join(show(t) for t in tok['eos']) or '-'}; "
                     f"mask {show(tok['mask'])}")
        template = "in the file" if tok["chat_template_in_file"] else "family default" if tok["chat_template"] else "none"
        lines.append(f"  chat template {template}")
    if d.get("tokenizer_error"):
        lines.append(f"tokenizer     {d['tokenizer_error']}")
    if tensors:
        lines.append("")
        width = max((len(t["name"]) for t in d["tensors"]), default=4)
        for t in d["tensors"]:
            shape = " x ".join(str(s) for s in t["shape"])
            lines.append(f"{t['name']:<{width}}  {t['type']:<6}  {shape:<20}  {_size(t['bytes']):>12}")
    return "\n".join(lines)
