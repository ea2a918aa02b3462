"""convert and quantize never overwrite or delete their input, whatever the spelling of the output:
the same file through OUT.part, a symlink, a hard link, ./x, an absolute path, a linked folder.
Each is refused with one clear error before any work, through the API and the CLI, and the input
is still there, byte for byte. A full disk leaves the input and any previous output as they were.

Hostile outputs tried: 14 spellings for quantize, 15 for convert, 4 full-disk failures, and 2
links at OUT / OUT.part to an unrelated file (written around, never through)."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from diffuse import DiffuseError
from diffuse.cli import main
from diffuse.convert import convert_hf
from diffuse.quantize import quantize_file

REFUSED = "overwrite the input"


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder (links followed) by its relative path."""
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- quantize: each spelling makes (input, output) inside the working folder, which is cwd ----

def _same(d: Path) -> tuple[str, str]:
    return "m.gguf", "m.gguf"


def _absolute_vs_relative(d: Path) -> tuple[str, str]:
    return "m.gguf", str(d / "m.gguf")


def _dot_slash(d: Path) -> tuple[str, str]:
    return "./m.gguf", "m.gguf"


def _dot_dot(d: Path) -> tuple[str, str]:
    (d / "sub").mkdir()
    return "m.gguf", "sub/../m.gguf"


def _output_is_a_symlink(d: Path) -> tuple[str, str]:
    (d / "link.gguf").symlink_to(d / "m.gguf")
    return "m.gguf", "link.gguf"


def _output_is_a_hard_link(d: Path) -> tuple[str, str]:
    os.link(d / "m.gguf", d / "hard.gguf")
    return "m.gguf", "hard.gguf"


def _input_is_a_symlink_to_output(d: Path) -> tuple[str, str]:
    (d / "link.gguf").symlink_to(d / "m.gguf")
    return "link.gguf", "m.gguf"


def _input_is_the_part(d: Path) -> tuple[str, str]:   # the reported bug: `quantize X.part X`
    (d / "m.gguf").rename(d / "m.gguf.part")
    return "m.gguf.part", "m.gguf"


def _input_is_the_part_absolute(d: Path) -> tuple[str, str]:
    (d / "m.gguf").rename(d / "m.gguf.part")
    return str(d / "m.gguf.part"), "./m.gguf"


def _part_is_a_symlink_to_input(d: Path) -> tuple[str, str]:
    (d / "out.gguf.part").symlink_to(d / "m.gguf")
    return "m.gguf", "out.gguf"


def _part_is_a_hard_link_to_input(d: Path) -> tuple[str, str]:
    os.link(d / "m.gguf", d / "out.gguf.part")
    return "m.gguf", "out.gguf"


def _through_a_linked_folder(d: Path) -> tuple[str, str]:
    (d / "alias").symlink_to(d, target_is_directory=True)
    return "m.gguf", "alias/m.gguf"


def _part_through_a_linked_folder(d: Path) -> tuple[str, str]:
    (d / "m.gguf").rename(d / "m.gguf.part")
    (d / "alias").symlink_to(d, target_is_directory=True)
    return "m.gguf.part", "alias/m.gguf"


def _chain_of_links(d: Path) -> tuple[str, str]:
    (d / "a.gguf").symlink_to("m.gguf")           # relative link targets
    (d / "b.gguf").symlink_to("a.gguf")
    return "m.gguf", "b.gguf"


QUANTIZE_SPELLINGS = [_same, _absolute_vs_relative, _dot_slash, _dot_dot, _output_is_a_symlink,
                      _output_is_a_hard_link, _input_is_a_symlink_to_output, _input_is_the_part,
                      _input_is_the_part_absolute, _part_is_a_symlink_to_input,
                      _part_is_a_hard_link_to_input, _through_a_linked_folder,
                      _part_through_a_linked_folder, _chain_of_links]


@pytest.fixture
def work(tiny_gguf, tmp_path, monkeypatch) -> Path:
    """A folder holding m.gguf (a small F32 model), as the working directory."""
    shutil.copy(tiny_gguf("llada", "f32"), tmp_path / "m.gguf")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("spelling", QUANTIZE_SPELLINGS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("via", ["api", "cli"])
def test_quantize_refuses_to_overwrite_its_input(work, spelling, via, capsys):
    src, out = spelling(work)
    before = snapshot(work)
    if via == "api":
        with pytest.raises(DiffuseError, match=REFUSED):
            quantize_file(src, out, "Q8_0")
    else:
        assert main(["quantize", src, out, "Q8_0"]) == 1
        err = capsys.readouterr().err
        assert err.count("diffuse: error:") == 1 and REFUSED in err
    assert snapshot(work) == before     # input there and unchanged, nothing added


# ---- convert: the output may be no file of the checkpoint folder, nor the folder ----

@pytest.fixture
def hf(tiny_hf_llada, tmp_path, monkeypatch) -> Path:
    """A copy of the tiny LLaDA folder (with a file the converter does not read) in cwd."""
    folder = tmp_path / "hf"
    shutil.copytree(tiny_hf_llada, folder)
    (folder / "README.md").write_text("a model card\n")
    (folder / "extra").mkdir()
    (folder / "extra" / "notes.txt").write_text("kept\n")
    monkeypatch.chdir(tmp_path)
    return folder


SHARD = "hf/model-00001-of-00002.safetensors"


def _c_shard(d: Path) -> tuple[str, str]:
    return "hf", SHARD


def _c_config(d: Path) -> tuple[str, str]:
    return "hf", "hf/config.json"


def _c_index(d: Path) -> tuple[str, str]:
    return "hf", "hf/model.safetensors.index.json"


def _c_tokenizer(d: Path) -> tuple[str, str]:
    return "hf", "hf/tokenizer.json"


def _c_unread_file(d: Path) -> tuple[str, str]:
    return "hf", "hf/README.md"


def _c_nested_file(d: Path) -> tuple[str, str]:
    return "hf", str(d / "hf" / "extra" / "notes.txt")


def _c_the_folder_itself(d: Path) -> tuple[str, str]:
    return "hf", "./hf"


def _c_dot_slash_absolute(d: Path) -> tuple[str, str]:
    return str(d / "hf"), "./" + SHARD


def _c_dot_dot(d: Path) -> tuple[str, str]:
    return "hf", "hf/../hf/config.json"


def _c_symlink_to_shard(d: Path) -> tuple[str, str]:
    (d / "out.gguf").symlink_to(d / SHARD)
    return "hf", "out.gguf"


def _c_hard_link_to_shard(d: Path) -> tuple[str, str]:
    os.link(d / SHARD, d / "out.gguf")
    return "hf", "out.gguf"


def _c_part_is_a_symlink_to_shard(d: Path) -> tuple[str, str]:
    (d / "out.gguf.part").symlink_to(d / SHARD)
    return "hf", "out.gguf"


def _c_part_is_a_hard_link_to_shard(d: Path) -> tuple[str, str]:
    os.link(d / SHARD, d / "out.gguf.part")
    return "hf", "out.gguf"


def _c_linked_folder(d: Path) -> tuple[str, str]:
    (d / "alias").symlink_to(d / "hf", target_is_directory=True)
    return "hf", "alias/config.json"


def _c_input_through_a_link(d: Path) -> tuple[str, str]:
    (d / "alias").symlink_to(d / "hf", target_is_directory=True)
    return "alias", SHARD


CONVERT_SPELLINGS = [_c_shard, _c_config, _c_index, _c_tokenizer, _c_unread_file, _c_nested_file,
                     _c_the_folder_itself, _c_dot_slash_absolute, _c_dot_dot, _c_symlink_to_shard,
                     _c_hard_link_to_shard, _c_part_is_a_symlink_to_shard,
                     _c_part_is_a_hard_link_to_shard, _c_linked_folder,
                     _c_input_through_a_link]


@pytest.mark.parametrize("spelling", CONVERT_SPELLINGS, ids=lambda f: f.__name__[3:])
@pytest.mark.parametrize("via", ["api", "cli"])
def test_convert_refuses_to_overwrite_its_input(hf, spelling, via, capsys):
    src, out = spelling(hf.parent)
    before = snapshot(hf.parent)
    if via == "api":
        with pytest.raises(DiffuseError, match=REFUSED):
            convert_hf(src, out, "f32")
    else:
        assert main(["convert", src, "-o", out, "--outtype", "f32"]) == 1
        err = capsys.readouterr().err
        assert err.count("diffuse: error:") == 1 and REFUSED in err
    assert snapshot(hf.parent) == before


def test_a_new_file_inside_the_checkpoint_folder_is_fine(hf):
    before = snapshot(hf)
    assert convert_hf("hf", "hf/model-f32.gguf", "f32") is not None
    assert snapshot(hf).keys() - before.keys() == {"model-f32.gguf"}
    assert all(snapshot(hf)[k] == v for k, v in before.items())


# ---- links at OUT or OUT.part to some other file are replaced, never written through ----

@pytest.mark.parametrize("link", ["out.gguf", "out.gguf.part"])
def test_a_link_at_the_output_is_not_written_through(work, link):
    victim = work / "victim.bin"
    victim.write_bytes(b"someone else's file")
    (work / link).symlink_to(victim)
    assert quantize_file("m.gguf", "out.gguf", "Q8_0") is not None
    assert victim.read_bytes() == b"someone else's file"
    assert not (work / "out.gguf").is_symlink() and not (work / "out.gguf.part").exists()


# ---- a full disk: nothing left behind, the input and the previous output intact ----

def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["write", "fsync"])
@pytest.mark.parametrize("tool", ["quantize", "convert"])
def test_a_full_disk_loses_nothing(work, tiny_hf_dream, monkeypatch, where, tool):
    from gguf import GGUFWriter
    shutil.copytree(tiny_hf_dream, work / "hf")
    (work / "out.gguf").write_bytes(b"previous model")
    before = snapshot(work)
    failing = (GGUFWriter, "write_tensor_data") if where == "write" else (os, "fsync")
    monkeypatch.setattr(*failing, _full)
    with pytest.raises(DiffuseError, match="disk is full"):
        if tool == "quantize":
            quantize_file("m.gguf", "out.gguf", "Q8_0")
        else:
            convert_hf("hf", "out.gguf", "f16")
    assert snapshot(work) == before      # no .part, input and previous output as they were
