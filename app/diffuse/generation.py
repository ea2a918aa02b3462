"""Generation options: the engine's option table, per-family defaults, a model's recipe over
them, validation; the engine's architecture table and the plan it makes of a run.

Every option's name, kind, range and help text come from the engine (`_core.OPTIONS`), which
validates with the same table: the CLI flags and the Studio's settings panel are built from it.
The architectures (`_core.ARCHITECTURES`) and a run's plan (`_core.plan`) come from the engine too.
"""
from __future__ import annotations

import secrets

from diffuse import _core
from diffuse._core import DiffuseError

SCHEDULERS: list[str] = list(_core.SCHEDULERS)

# [{name, kind ("int" | "float" | "bool" | "choice" | "seed"), min, max, min_open, max_open, help,
#   range (the allowed values as text), choices}], in the engine's order.
OPTIONS: list[dict] = [dict(o) for o in _core.OPTIONS]
OPTION_NAMES: tuple[str, ...] = tuple(o["name"] for o in OPTIONS)

# The architectures the engine runs (GGUF general.architecture): name -> {name, family (whose
# defaults and chat conventions apply: "llada2" is "sdar"'s), loop ("masked", "uniform-state",
# "causal": how its diffusion decodes), moe, shift_logits, block_diffusion (causal across blocks
# aligned at position 0, steps counted per block), default_mask_id}. Every option call takes an
# architecture's name; a family is named by its first architecture.
ARCHITECTURES: dict[str, dict] = {a["name"]: dict(a) for a in _core.ARCHITECTURES}
FAMILIES: tuple[str, ...] = tuple(_core.FAMILIES)


def has_causal_modes(arch: str | None) -> bool:
    """Whether modes "ar" and "self_spec" run on architecture `arch`: on every decoding loop but the
    uniform-state canvas's (docs/self_speculation.md). An unknown architecture (a server that does
    not say it, one this engine lacks) is not assumed to have them."""
    return isinstance(arch, str) and arch in ARCHITECTURES and ARCHITECTURES[arch]["loop"] != "uniform-state"


# Named decoding modes, as options over the model's defaults: the CLI's --preset, a server request's
# "preset", the Studio's presets menu, `diffuse bench fast`. The published fast-decoding methods
# (Fast-dLLM's rules and caches, DPad's suffix window, dInfer's end-of-text stop, the paper's
# entropy exit), and the modes a model's authors publish. LLaDA2.1's card names a speed
# mode (S: a low mask-to-token threshold, every differing token edited) and a quality mode (Q); the
# values are those of SGLang's JointThreshold defaults (S) and of the diffusers LLaDA2 pipeline's
# for 2.1 (Q). Its generate commits at least one mask per pass (block 32, 32 steps: ours, count 1).
_LLADA21 = {"block_length": 32, "steps": 32, "scheduler": "low_confidence_dynamic", "max_post_steps": 16,
            "temperature": 0.0}
_THRESHOLD = {"scheduler": "confidence_threshold", "confidence_threshold": 0.9}
_DUAL = {"cache": True, "cache_policy": "dual"}
# name: (title, options)
_PRESETS: dict[str, tuple[str, dict]] = {
    "fast-dllm-threshold": ("Fast-dLLM: confidence threshold", _THRESHOLD),
    "fast-dllm-factor": ("Fast-dLLM: factor rule", {"scheduler": "confidence_factor", "factor": 1.0}),
    "fast-dllm-dual-cache": ("Fast-dLLM: DualCache", _DUAL),
    "fast-dllm-prefix-cache": ("Fast-dLLM: PrefixCache", {"cache": True, "cache_policy": "prefix"}),
    "fast-dllm-threshold-dual-cache": ("Fast-dLLM: threshold + DualCache", {**_THRESHOLD, **_DUAL}),
    "dpad-window-8": ("DPad: suffix window of 8", {"suffix_window": 8}),
    "dinfer-eos-stop": ("dInfer: stop at a block holding end-of-text", {"eos_stop": "holds_eos"}),
    "paper-entropy-exit": ("The paper: entropy exit + inter-step cache",
                           {"scheduler": "entropy_exit", "cache": True, "cache_policy": "active"}),
    "llada2.1-speed": ("LLaDA2.1: speed mode (S)",
                       {**_LLADA21, "confidence_threshold": 0.5, "editing_threshold": 0.0}),
    "llada2.1-quality": ("LLaDA2.1: quality mode (Q)",
                         {**_LLADA21, "confidence_threshold": 0.7, "editing_threshold": 0.5}),
}
PRESETS: dict[str, dict] = {name: opts for name, (_, opts) in _PRESETS.items()}
PRESET_TITLES: dict[str, str] = {name: title for name, (title, _) in _PRESETS.items()}
# The fast-decoding methods of the full-attention models (issue 21), in `diffuse bench fast`'s order.
FAST_METHODS = ("fast-dllm-threshold", "fast-dllm-factor", "fast-dllm-dual-cache", "fast-dllm-prefix-cache",
                "fast-dllm-threshold-dual-cache", "dpad-window-8", "dinfer-eos-stop")


def preset(name: str) -> dict:
    """The options of a named preset (PRESETS); DiffuseError naming the known ones."""
    if name not in PRESETS:
        raise DiffuseError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return dict(PRESETS[name])


def option(name: str) -> dict:
    """The table entry of one option."""
    return next(o for o in OPTIONS if o["name"] == name)


# An unset seed is drawn afresh for every run, so that sampling again gives another answer; the
# run's options report it (GenerateResult.options["seed"]) so that it can be repeated. Drawn below
# 2^31, a small part of the engine's range: the Studio's seed field (a QSpinBox) holds it and a
# JavaScript client reads it back exactly (JSON numbers are doubles there).
RANDOM_SEEDS = 2**31


def random_seed() -> int:
    return secrets.randbelow(RANDOM_SEEDS)


def default_options(arch: str, recipe: dict | None = None) -> dict:
    """A model's defaults: its architecture's family's (the engine's), overridden by the
    recipe its file suggests (Model.recipe, see diffuse.recipe). The seed is None, unless the
    recipe names one: every run that leaves it unset draws its own (resolve_options)."""
    options = resolve_options(arch, recipe)
    if "seed" not in (recipe or {}):
        options["seed"] = None
    return options


def resolve_options(arch: str, recipe: dict | None = None, /, **given) -> dict:
    """The model's defaults (the family's, overridden by `recipe`), overridden by every option of
    `given` that is not None, checked by the engine. A seed that neither gives is a fresh random
    one (random_seed): the result holds the value that runs.

    Raises DiffuseError naming the first unknown option, wrong type or out-of-range value."""
    # None leaves an option to the defaults; an unknown name is still passed on, to be refused.
    given = {k: v for k, v in given.items() if v is not None or k not in OPTION_NAMES}
    options = {**(recipe or {}), **given}
    if "seed" not in options:
        options["seed"] = random_seed()
    return dict(_core.check_options(arch, options))


# The model sizes a run's plan depends on (hparams keys, as _core.plan takes them).
_PLAN_SIZES = ("block_size", "sub_block_size", "canvas_length", "trained_block")


def plan(arch: str, options: dict, hparams: dict | None = None, n_prompt: int = 1, n_ctx: int | None = None) -> dict:
    """The engine's own plan of a run (_core.plan): its loop, gen_length in whole blocks, blocks,
    sub-blocks, steps, what it rounded; the sizes it depends on from `hparams` where known.
    Raises DiffuseError with the engine's reason where it would refuse the run."""
    sizes = {k: int((hparams or {}).get(k) or 0) for k in _PLAN_SIZES}
    return _core.plan(arch, options, n_prompt=n_prompt, n_ctx=n_ctx or 0, **sizes)


def schedule_check(opts: dict, arch: str, n_ctx: int | None = None, recipe: dict | None = None,
                   hparams: dict | None = None) -> tuple[str, str | None]:
    """(what the engine will round in the schedule, or ""; why it would refuse it, or None): the
    engine's own plan of the run (_core.plan) for a prompt of one token, on a model of architecture
    `arch` with context `n_ctx` and, where known, the sizes in `hparams` (the model's block,
    sub-block, canvas). Options of `opts` that are None take the model's default (the
    architecture's and `recipe`)."""
    try:
        o = resolve_options(arch, recipe, **{k: opts.get(k) for k in OPTION_NAMES if k != "seed"})
        planned = plan(arch, o, hparams, n_ctx=n_ctx)
    except DiffuseError as e:
        return "", str(e)
    return planned.get("rounded", ""), None


def whole_blocks(gen_length: int, options: dict, arch: str) -> int:
    """The engine's buffer is whole blocks: a full-attention model's gen_length rounded up to a
    multiple of block_length (the CLI and the server then cut the answer at the length asked for).
    Block diffusion pads to whole blocks itself, from position 0."""
    block = options["block_length"]
    if ARCHITECTURES[arch]["block_diffusion"] or block <= 0 or block >= gen_length:
        return gen_length
    return -(-gen_length // block) * block
