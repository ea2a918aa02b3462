"""`diffuse download`: the catalog listed, the ready GGUF by default, the checkpoint folder with
--format hf (or when the catalog has no ready GGUF), against tests/fixtures/fake_hub.py."""
from __future__ import annotations

import pytest
from fixtures.fake_hub import GGUF_FILE, GGUF_REPO, REPO, FakeHub

from diffuse import catalog, gguf_file
from diffuse.cli import main


@pytest.fixture
def hub_with_both(gguf_repo, repo_dir, small_chunks, monkeypatch, ready_model):
    """One fake hub with the ready-GGUF repository and the checkpoint; the catalog's LLaDA entry
    points at both."""
    with FakeHub({GGUF_REPO: gguf_repo, REPO: repo_dir}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        model = dict(ready_model, hf_repo=REPO)
        monkeypatch.setattr(catalog, "load", lambda path=None: [model])
        yield server


def test_lists_the_catalog(capsys):
    assert main(["download"]) == 0
    out = capsys.readouterr().out
    assert "llada-moe-7b-a1b-instruct" in out and "ready GGUF Q4_K_M 4.52 GB, RAM 5.5 GB" in out
    assert "no ready GGUF; checkpoint 4.1 GB" in out.split("sdar-1.7b-chat", 1)[1].split("\n")[0]
    # the columns line up whatever the longest id and family (nemotron-diffusion is 18 characters)
    lines = out.splitlines()
    assert len({line.index(" no ready GGUF" if " no ready GGUF" in line else " ready GGUF") for line in lines}) == 1


def test_help_names_every_family_the_converter_takes(capsys):
    from diffuse.convert import diffusion_gemma
    from diffuse.convert.families import FAMILIES
    for argv in (["--help"], ["convert", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert "LLaDA or Dream" not in text
        assert all(f.arch in text for f in (*FAMILIES.values(), diffusion_gemma.FAMILY))


def test_the_ready_gguf_is_the_default(hub_with_both, gguf_repo, tmp_path, capsys):
    assert main(["download", "llada-8b-instruct", "-o", str(tmp_path / "m")]) == 0
    path = tmp_path / "m" / GGUF_FILE
    assert path.read_bytes() == (gguf_repo / GGUF_FILE).read_bytes()
    assert f"wrote {path} (Q4_K_M" in capsys.readouterr().out
    assert not [p for m, p, _ in hub_with_both.requests if f"/{REPO}/" in p]   # no checkpoint


def test_the_checkpoint_folder_on_request(hub_with_both, repo_dir, tmp_path, capsys):
    assert main(["download", "llada-8b-instruct", "--format", "hf", "-o", str(tmp_path)]) == 0
    folder = tmp_path / REPO.split("/")[-1]
    assert (folder / "config.json").read_bytes() == (repo_dir / "config.json").read_bytes()
    assert "diffuse convert" in capsys.readouterr().out
    assert not hub_with_both.ranges(GGUF_FILE)


@pytest.mark.parametrize("model_id, checkpoint, arch", [("sdar-1.7b-chat", "tiny_hf_sdar", "sdar"),
                                                        ("fast-dllm-v2-1.5b", "tiny_hf_fast_dllm_v2",
                                                         "fast-dllm-v2"),
                                                        ("llada2.1-mini", "tiny_hf_llada2", "llada2")])
def test_a_block_diffusion_model_comes_as_its_checkpoint_to_convert(model_id, checkpoint, arch, request,
                                                                   small_chunks, monkeypatch, tmp_path,
                                                                   capsys):
    """No ready GGUF in the catalog: the default is the checkpoint folder, which converts."""
    repo = f"test-org/{model_id}-tiny"
    with FakeHub({repo: request.getfixturevalue(checkpoint)}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        model = dict(catalog.find(catalog.load(), model_id), hf_repo=repo)
        assert "ready_gguf" not in model
        monkeypatch.setattr(catalog, "load", lambda path=None: [model])
        assert main(["download", model_id, "-o", str(tmp_path)]) == 0
    folder = tmp_path / repo.split("/")[-1]
    assert f"wrote {folder}; make a GGUF with: diffuse convert {folder}" in capsys.readouterr().out
    out = tmp_path / "model.gguf"
    assert main(["convert", str(folder), "-o", str(out), "--outtype", "q8_0"]) == 0
    assert gguf_file.read(out).architecture == arch
