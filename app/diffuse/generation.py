"""Generation options: names, per-family defaults (from the engine), validation."""
from __future__ import annotations

from diffuse import _core
from diffuse._core import DiffuseError

SCHEDULERS: list[str] = list(_core.SCHEDULERS)

# Options a caller may pass to Model.generate (besides prompt, chat, threads, on_step).
OPTION_NAMES = ("gen_length", "steps", "block_length", "scheduler", "threshold", "cache", "keep_active",
                "refresh_every", "temperature", "top_k", "top_p", "alg_temp", "cfg_scale", "eps", "seed")


def default_options(arch: str) -> dict:
    """The engine's defaults for a family ('llada' or 'dream')."""
    return dict(_core.default_options(arch))


def resolve_options(arch: str, **given) -> dict:
    """Defaults of the family, overridden by every option that is not None."""
    unknown = set(given) - set(OPTION_NAMES)
    if unknown:
        raise DiffuseError(f"unknown generation option(s): {', '.join(sorted(unknown))}")
    opts = default_options(arch)
    opts.update({k: v for k, v in given.items() if v is not None})
    if opts["scheduler"] not in SCHEDULERS:
        raise DiffuseError(f"unknown scheduler '{opts['scheduler']}' (choose one of: {', '.join(SCHEDULERS)})")
    return opts
