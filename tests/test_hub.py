"""diffuse.hub against a local stand-in for the Hugging Face hub (tests/fixtures/fake_hub.py):
file selection, checksums, resume after a cancel and after a dropped connection, damaged
downloads, offline and missing repositories. Nothing here reaches the network."""
from __future__ import annotations

import shutil
import socket

import pytest
from fixtures.fake_hub import CHUNK, COMMIT, REPO

from diffuse import DiffuseError, hub

pytestmark = pytest.mark.usefixtures("small_chunks")


@pytest.fixture
def repo_dir(repo_dir):
    """The shared repository, with a file diffuse does not need."""
    (repo_dir / "README.md").write_text("a model card\n")
    return repo_dir


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def same_files(a, b) -> None:
    names = sorted(p.name for p in a.iterdir() if p.is_file() and p.name != "README.md")
    assert sorted(p.name for p in b.iterdir() if p.is_file()) == names
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


def test_lists_only_what_the_converter_reads(fake_hub):
    commit, files = hub.list_files(REPO, endpoint=fake_hub.url)
    assert commit == COMMIT
    names = {f.path for f in files}
    assert "README.md" not in names and "config.json" in names
    weights = [f for f in files if f.path.endswith(".safetensors")]
    assert len(weights) == 2 and all(f.sha256 and len(f.sha256) == 64 for f in weights)
    assert all(len(f.git_sha1) == 40 for f in files)


def test_download_verifies_and_reports_progress(fake_hub, repo_dir, tmp_path):
    seen = []
    out = hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url,
                       progress=lambda d, t, what: seen.append((d, t, what)))
    assert out == tmp_path / "dl"
    same_files(repo_dir, out)
    assert not list(out.glob("*.part"))
    total = seen[-1][1]
    assert seen[-1] == (total, total, "done")
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
    # Every file was fetched at the listed commit, not at a moving branch.
    gets = [p for m, p, _ in fake_hub.requests if m == "GET" and "/resolve/" in p]
    assert gets and all(f"/resolve/{COMMIT}/" in p for p in gets)

    # A second call finds everything in place and fetches nothing.
    fake_hub.requests.clear()
    assert hub.download(REPO, out, endpoint=fake_hub.url) == out
    assert not [p for m, p, _ in fake_hub.requests if "/resolve/" in p]


def test_cancel_keeps_the_part_and_the_next_call_resumes(fake_hub, repo_dir, tmp_path):
    weights = sorted(p.name for p in repo_dir.glob("*.safetensors"))[0]
    seen = []
    # Cancel on the second chunk of the weights: the first one is on disk in the .part.
    assert hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url,
                        progress=lambda d, t, what: seen.append(what),
                        cancel=lambda: seen.count(weights) >= 1) is None
    part = tmp_path / "dl" / (weights + ".part")
    assert part.is_file() and part.stat().st_size == CHUNK
    assert not (tmp_path / "dl" / weights).exists()

    assert hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url) is not None
    assert fake_hub.ranges(weights)[-1] == f"bytes={CHUNK}-"
    same_files(repo_dir, tmp_path / "dl")


def test_a_dropped_connection_is_resumed_with_a_range_request(fake_hub, repo_dir, tmp_path):
    weights = sorted(p.name for p in repo_dir.glob("*.safetensors"))[-1]
    fake_hub.drop_after[weights] = 4 * CHUNK
    hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url)
    assert fake_hub.ranges(weights) == [None, f"bytes={4 * CHUNK}-"]
    same_files(repo_dir, tmp_path / "dl")


@pytest.mark.parametrize("damaged", ["model-00001-of-00002.safetensors", "config.json"])
def test_a_damaged_file_is_refused_and_deleted(fake_hub, tmp_path, damaged):
    fake_hub.corrupt.add(damaged)
    with pytest.raises(DiffuseError, match=f"{damaged}: .*checksum"):
        hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url)
    assert not (tmp_path / "dl" / damaged).exists()
    assert not (tmp_path / "dl" / (damaged + ".part")).exists()
    fake_hub.corrupt.clear()                     # a later try fetches it anew
    assert hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url) is not None


def test_offline_is_said_plainly(tmp_path):
    url = closed_port_url()
    reason = hub.offline_reason(url)
    assert reason.startswith("This computer is offline") and url in reason
    with pytest.raises(DiffuseError, match="offline"):
        hub.download(REPO, tmp_path / "dl", endpoint=url)
    assert not (tmp_path / "dl").exists()


def test_online_and_offline_mode(fake_hub, monkeypatch):
    assert hub.offline_reason(fake_hub.url) is None
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "HF_HUB_OFFLINE" in hub.offline_reason(fake_hub.url)


def test_unknown_repository_and_revision(fake_hub, tmp_path):
    with pytest.raises(DiffuseError, match="no such model repository"):
        hub.download("nobody/nothing", tmp_path / "dl", endpoint=fake_hub.url)
    with pytest.raises(DiffuseError, match="no such model repository or revision"):
        hub.download(REPO, tmp_path / "dl", revision="v9", endpoint=fake_hub.url)


def test_not_enough_disk(fake_hub, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 10))
    with pytest.raises(DiffuseError, match="more disk"):
        hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url)


def test_a_file_name_outside_the_folder_is_refused(fake_hub, tmp_path, monkeypatch):
    listed = fake_hub.info
    evil = {"rfilename": "../evil.json", "size": 2, "blobId": "0" * 40}
    monkeypatch.setattr(fake_hub, "info",
                        lambda repo: dict(listed(repo), siblings=listed(repo)["siblings"] + [evil]))
    with pytest.raises(DiffuseError, match="refusing the file name '../evil.json'"):
        hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url)
    assert not (tmp_path / "evil.json").exists()
