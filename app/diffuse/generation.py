"""Generation options: the engine's option table, per-family defaults, validation.

Every option's name, kind, range and help text come from the engine (`_core.OPTIONS`), which
validates with the same table: the CLI flags and the Studio's settings panel are built from it.
"""
from __future__ import annotations

from diffuse import _core

SCHEDULERS: list[str] = list(_core.SCHEDULERS)

# [{name, kind ("int" | "float" | "bool" | "choice" | "seed"), min, max, min_open, max_open, help,
#   range (the allowed values as text), choices}], in the engine's order.
OPTIONS: list[dict] = [dict(o) for o in _core.OPTIONS]
OPTION_NAMES: tuple[str, ...] = tuple(o["name"] for o in OPTIONS)


def option(name: str) -> dict:
    """The table entry of one option."""
    return next(o for o in OPTIONS if o["name"] == name)


def default_options(arch: str) -> dict:
    """The engine's defaults for a family ('llada' or 'dream')."""
    return dict(_core.default_options(arch))


def resolve_options(arch: str, **given) -> dict:
    """Defaults of the family, overridden by every option that is not None, checked by the engine.

    Raises DiffuseError naming the first unknown option, wrong type or out-of-range value."""
    return dict(_core.check_options(arch, given))
