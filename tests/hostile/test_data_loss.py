"""convert and quantize never overwrite or delete their input, whatever the spelling of the output:
the same file through OUT.part, a symlink, a hard link, ./x, an absolute path, a linked folder.
Each is refused with one clear error before any work, through the API and the CLI, and the input
is still there, byte for byte. A full disk leaves the input and any previous output as they were.

Hostile outputs tried: 14 spellings for quantize, 15 for convert, 4 full-disk failures, and 2
links at OUT / OUT.part to an unrelated file (written around, never through). The same one output
check guards bench --json / --markdown (3 spellings of the model for each of the 5 variants),
--record and train: read-only folders and a disk with no free space are refused before the work,
and a disk that fills during it leaves nothing behind (the answer is still printed)."""
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


def _buffered_full_disk(monkeypatch):
    """The GGUF writer's file on a full disk, as the buffered writes meet it: the file appears
    (empty), every flush fails, and so does the flush in close() after the first failure."""
    import builtins

    import gguf.gguf_writer
    real_open = builtins.open

    def full_open(name, mode="r", *args, **kwargs):
        if "w" not in mode:
            return real_open(name, mode, *args, **kwargs)
        real_open(name, mode).close()
        return real_open("/dev/full", mode, *args, **kwargs)
    monkeypatch.setattr(gguf.gguf_writer, "open", full_open, raising=False)


@pytest.mark.parametrize("tool", ["quantize", "convert"])
def test_a_full_disk_through_the_cli_is_one_line(work, tiny_hf_dream, monkeypatch, capsys, tool):
    shutil.copytree(tiny_hf_dream, work / "hf")
    before = snapshot(work)
    _buffered_full_disk(monkeypatch)
    argv = ["quantize", "m.gguf", "out.gguf", "Q8_0"] if tool == "quantize" else ["convert", "hf", "-o", "out.gguf"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == "diffuse: error: out.gguf: the disk is full; nothing was written\n"   # no chained traceback
    assert snapshot(work) == before                                                   # no 0-byte .part


# ---- bench, generate --record, train: the one output check, before any measurement ----

BENCH = {
    "steps": ["--budgets", "2", "--prompts", "1", "--gen-length", "8", "--block-length", "8", "--threads", "1"],
    "forward": ["--tokens", "8", "--threads", "1", "--reps", "1", "--no-ceiling"],
    "prompts": ["--gen-length", "8", "--steps", "2", "--threads", "1"],
    "batch": ["--batch", "1", "--gen-length", "8", "--steps", "2", "--threads", "1"],
    "context": ["--lengths", "8", "--block-length", "8", "--steps", "1", "--threads", "1"],
}
MARKDOWN = ("forward", "prompts")


def _no_measurement(monkeypatch):
    """Any measurement fails the test: the refusal must come first."""
    import diffuse.model

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the output was checked")
    monkeypatch.setattr(diffuse.model.Model, "__init__", refuse)


@pytest.mark.parametrize("option", ["--json", "--markdown"])
@pytest.mark.parametrize("variant", list(BENCH))
def test_bench_never_overwrites_the_model(work, variant, option, monkeypatch, capsys):
    if option == "--markdown" and variant not in MARKDOWN:
        pytest.skip(f"bench {variant} writes no markdown")
    before = snapshot(work)
    _no_measurement(monkeypatch)
    for spelling in ("m.gguf", str(work / "m.gguf"), "./m.gguf"):
        assert main(["bench", variant, "m.gguf", *BENCH[variant], option, spelling]) == 1
        assert REFUSED in capsys.readouterr().err
    assert snapshot(work) == before


def read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write: chmod'd, or for root (whom the mode does not stop) a
    folder of /proc, where nothing can be created."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    folder = Path("/proc/self")
    assert not os.access(folder, os.W_OK)
    return folder


@pytest.mark.parametrize("argv", [
    ["generate", "-m", "m.gguf", "-p", "hi", "--record", "{ro}/run.npz"],
    ["bench", "steps", "m.gguf", *BENCH["steps"], "--json", "{ro}/s.json"],
    ["bench", "forward", "m.gguf", *BENCH["forward"], "--markdown", "{ro}/f.md"],
    ["bench", "grid", "m.gguf", "--no-plots", "-o", "{ro}/grid"],
    ["quantize", "m.gguf", "{ro}/q.gguf", "Q8_0"],
], ids=["record", "bench-json", "bench-markdown", "grid", "quantize"])
def test_a_read_only_folder_is_refused_before_the_work(work, tmp_path, argv, monkeypatch, capsys):
    ro = read_only_folder(tmp_path)
    _no_measurement(monkeypatch)
    monkeypatch.setattr("diffuse.quantize.quantize_file", lambda *a, **k: pytest.fail("quantized first"))
    assert main([a.format(ro=ro) for a in argv]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"the folder {ro}" in err and "not writable" in err


def test_train_checks_its_folders_before_training(tmp_path, capsys):
    pytest.importorskip("torch")
    ro = read_only_folder(tmp_path)
    (tmp_path / "data.txt").write_text("some text\n\nmore text\n")
    assert main(["train", str(tmp_path / "data.txt"), "--out", f"{ro}/run"]) == 1
    assert "not writable" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "data.txt"), "--out", str(tmp_path / "run"), "--gguf", f"{ro}/m.gguf"]) == 1
    assert "not writable" in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [
    ["generate", "-m", "m.gguf", "-p", "hi", "--record", "run.npz"],
    ["bench", "context", "m.gguf", *BENCH["context"], "--json", "c.json"],
    ["quantize", "m.gguf", "q.gguf", "Q8_0"],
], ids=["record", "bench-json", "quantize"])
def test_no_free_space_is_refused_before_the_work(work, argv, monkeypatch, capsys):
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result((*real(p)[:4], 0, 0, *real(p)[6:])))
    _no_measurement(monkeypatch)
    before = snapshot(work)
    assert main(argv) == 1
    assert "is full" in capsys.readouterr().err and snapshot(work) == before


@pytest.mark.parametrize("argv", [
    ["generate", "-m", "m.gguf", "-p", "hi", "--gen-length", "8", "--steps", "2", "--record", "run.npz"],
    ["bench", "context", "m.gguf", *BENCH["context"], "--json", "c.json"],
], ids=["record", "bench-json"])
def test_a_disk_that_fills_during_the_run_leaves_nothing(work, argv, monkeypatch, capsys):
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def fileno(self):
            return self.f.fileno()
    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: Full(real_fdopen(fd, mode, *a, **k)))
    before = snapshot(work)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith(": the disk is full; nothing was written") and "Traceback" not in err
    assert snapshot(work) == before


def test_a_recording_that_cannot_be_saved_still_prints_the_answer(work, monkeypatch, capsys):
    from diffuse import recording
    monkeypatch.setattr(recording.tempfile, "mkstemp", _full)
    assert main(["generate", "-m", "m.gguf", "-p", "hi", "--gen-length", "8", "--steps", "2", "--threads", "1",
                 "--record", "run.npz"]) == 1
    out, err = capsys.readouterr()
    assert out.endswith("\n")                                      # the answer was printed
    assert err.splitlines()[-1] == "diffuse: error: run.npz: the disk is full; nothing was written"
    assert not list(work.glob("*run.npz*"))


def test_download_checks_its_folder_before_fetching(tmp_path, monkeypatch, capsys):
    from diffuse import hub
    monkeypatch.setattr(hub, "download", lambda *a, **k: pytest.fail("fetched first"))
    ro = read_only_folder(tmp_path)
    assert main(["download", "llada-8b-instruct", "--format", "hf", "-o", str(ro / "models")]) == 1
    assert "not writable" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["download", "llada-8b-instruct", "--format", "hf", "-o", str(tmp_path / "file")]) == 1
    assert "is a file, not a folder" in capsys.readouterr().err
