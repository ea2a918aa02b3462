"""A model's suggested recipe: generation options its GGUF file carries under our own keys,
`diffuse.recipe.<option>` for any option of the engine's table (diffuse.generation.OPTIONS).

The recipe belongs to the model, so every file of it gives the same defaults: `diffuse convert
--recipe`, the trainer's export and `diffuse recipe MODEL --set` write it, `diffuse quantize`
copies it with the other keys, and every default (the CLI, the server, the Studio) is
diffuse.generation.default_options(model.arch, model.recipe): the family's, overridden by it.

Writing is strict, reading lenient. A writer refuses a recipe the engine would refuse before any
work. A file whose recipe is unreadable (an unknown option, a wrong GGUF type, a value out of
range, a schedule the engine cannot run) still loads, with a RecipeWarning naming the key, and
its whole recipe is ignored: the weights are fine, and half a recipe is not the recipe.
"""
from __future__ import annotations

import os
from pathlib import Path

from diffuse import gguf_file
from diffuse._core import DiffuseError
from diffuse.generation import OPTION_NAMES, option, resolve_options, schedule_check

PREFIX = "diffuse.recipe."
# The GGUF type each kind of option is written as, and the types it is read from.
WRITE_TYPES = {"int": "i32", "seed": "u64", "float": "f32", "bool": "bool", "choice": "str"}
_INTS = frozenset({"u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64"})
READ_TYPES = {"int": _INTS, "seed": _INTS, "float": frozenset({"f32", "f64"}),
              "bool": frozenset({"bool"}), "choice": frozenset({"str"})}
_BOOLS = {"true": True, "on": True, "yes": True, "1": True,
          "false": False, "off": False, "no": False, "0": False}
_PARSE = {"int": int, "seed": int, "float": float, "choice": str,
          "bool": lambda text: _BOOLS[text.lower()]}


class RecipeWarning(UserWarning):
    """A model file's recipe was ignored (the message names the key and the reason)."""


def key(name: str) -> str:
    return PREFIX + name


def text(recipe: dict) -> str:
    """'gen_length 64, steps 64, temperature 0.7', in the option table's order; 'none' when empty."""
    def shown(v) -> str:
        if v is None:   # the seed: drawn afresh for each run
            return "random"
        return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)
    return ", ".join(f"{n} {shown(recipe[n])}" for n in OPTION_NAMES if n in recipe) or "none"


def check(recipe: dict, arch: str, n_ctx: int | None = None, hparams: dict | None = None) -> dict:
    """`recipe` with its values as the engine reads them (a float32 0.699999988 is 0.7), each
    option and the schedule it makes checked for a model of architecture `arch` and context
    `n_ctx` (and, where known, the sizes in its `hparams`: see generation.schedule_check).
    Raises DiffuseError naming the first key that is wrong."""
    out = {}
    for name, value in recipe.items():
        if name not in OPTION_NAMES:
            raise DiffuseError(f"{key(name)}: no such generation option (known: {', '.join(OPTION_NAMES)})")
        try:
            out[name] = resolve_options(arch, **{name: value})[name]
        except DiffuseError as e:
            raise DiffuseError(f"{key(name)}: {e}") from None
    # A schedule the family's own defaults cannot run on this model is not the recipe's doing.
    refused = schedule_check(out, arch, n_ctx, hparams=hparams)[1]
    if refused and schedule_check({}, arch, n_ctx, hparams=hparams)[1] is None:
        # Named: the options whose removal alone lets the engine run it, else all of them.
        keys = [key(n) for n in out
                if schedule_check({k: v for k, v in out.items() if k != n}, arch, n_ctx, hparams=hparams)[1] is None]
        keys = keys or [key(n) for n in out]
        raise DiffuseError(f"{', '.join(keys)}: the recipe's schedule is refused: {refused}")
    return out


def from_metadata(kv: dict, kv_types: dict, arch: str, n_ctx: int | None = None,
                  hparams: dict | None = None) -> dict:
    """The recipe in a GGUF file's metadata ({} when it has none), checked (see check)."""
    recipe = {}
    for k, value in kv.items():
        if not k.startswith(PREFIX):
            continue
        name = k[len(PREFIX):]
        if name in OPTION_NAMES:
            kind = option(name)["kind"]
            if kv_types.get(k) not in READ_TYPES[kind]:
                raise DiffuseError(f"{k}: stored as a GGUF {kv_types.get(k)}; {name} is "
                                   f"{option(name)['range']}, stored as a GGUF {WRITE_TYPES[kind]}")
        recipe[name] = value
    return check(recipe, arch, n_ctx, hparams)


def metadata(recipe: dict) -> tuple[dict, dict]:
    """(kv, kv_types) of a checked recipe, as gguf_file.write takes them."""
    return ({key(n): v for n, v in recipe.items()},
            {key(n): WRITE_TYPES[option(n)["kind"]] for n in recipe})


def parse(assignments: list[str], flag: str) -> dict:
    """Options from OPTION=VALUE texts (`flag` names them in errors: --recipe, --set), each value
    of its option's kind; booleans as true/false, on/off, yes/no or 1/0. Not yet range-checked."""
    recipe = {}
    for text in assignments:
        name, sep, raw = text.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in OPTION_NAMES:
            raise DiffuseError(f"{flag} {text!r}: expected OPTION=VALUE, OPTION one of {', '.join(OPTION_NAMES)}")
        o = option(name)
        try:
            recipe[name] = _PARSE[o["kind"]](raw.strip())
        except (ValueError, KeyError):
            raise DiffuseError(f"{flag} {text!r}: {name} must be {o['range']}") from None
    return recipe


def write(path: str | os.PathLike, recipe: dict, out_path: str | os.PathLike | None = None) -> dict:
    """Write the model `path` with `recipe` as its whole recipe ({} removes it) to `out_path`, by
    default over `path` itself; returns the recipe written (checked). Every other key and every
    tensor's bytes are copied as they are; the new file replaces the old one only when complete
    (gguf_file.write)."""
    from diffuse.model import load   # diffuse.model reads recipes with this module

    path = Path(path)
    out = Path(out_path) if out_path is not None else path
    if out.exists() and os.path.samefile(out, path):
        gguf_file.refuse_overwrite(gguf_file.part_path(out), [path])   # the temporary beside it
    else:
        gguf_file.refuse_overwrite(out, [path])
    model = load(path, threads=1)     # the engine's checks, its family and context
    recipe = check(recipe, model.arch, model.n_ctx_train, model.hparams)
    del model
    info = gguf_file.read(path)
    kv = {k: v for k, v in info.kv.items() if not k.startswith(PREFIX)}
    kv_types = {k: info.kv_types[k] for k in kv}
    new_kv, new_types = metadata(recipe)
    tensors = [gguf_file.OutTensor(t.name, t.type, t.shape) for t in info.tensors]
    gguf_file.write(out, kv | new_kv, kv_types | new_types, tensors, (t.raw() for t in info.tensors))
    return recipe
