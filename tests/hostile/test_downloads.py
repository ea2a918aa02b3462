"""diffuse.hub against a hostile download folder and a hub that changes under it
(tests/fixtures/fake_hub.py, no network): stale complete files are checked by the hub's checksum
and fetched anew, links in the folder are never followed, hostile file names are refused on every
OS's rules, and one download never mixes two revisions.

Hostile inputs tried: 4 stale states (a changed repository with same-size files, 2 damaged
same-size files, a .part left by an older revision), 7 links in the download folder (6 at a .part
or final file, 1 linked subfolder), 18 hostile file names (and 4 plain ones that must pass), 3
revision hazards (a push during a download, a push between two calls, a hub naming no commit)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from fixtures.fake_hub import CHUNK, COMMIT, REPO, FakeHub

from diffuse import DiffuseError, hub

pytestmark = pytest.mark.usefixtures("small_chunks")

WEIGHTS = "model-00001-of-00002.safetensors"


def new_revision(repo_dir: Path, tmp_path: Path) -> Path:
    """The repository after a push: config.json and the weights changed, at the same sizes (so
    only a checksum tells them apart)."""
    folder = tmp_path / "repo2"
    shutil.copytree(repo_dir, folder)
    for name in ("config.json", WEIGHTS):
        data = bytearray((folder / name).read_bytes())
        data[-2] ^= 0x01        # config.json: a digit or letter of its last value
        (folder / name).write_bytes(bytes(data))
    return folder


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def resolved_commits(server: FakeHub) -> set[str]:
    return {p.split("/")[4] for m, p, _ in server.requests if m == "GET" and "/resolve/" in p}


# ---- stale or damaged complete files ----

def test_a_changed_repository_replaces_stale_files(fake_hub, repo_dir, tmp_path):
    dl = tmp_path / "dl"
    hub.download(REPO, dl, endpoint=fake_hub.url)
    second = fake_hub.push(REPO, new_revision(repo_dir, tmp_path))
    fake_hub.requests.clear()
    hub.download(REPO, dl, endpoint=fake_hub.url)
    assert contents(dl) == contents(fake_hub.repos[REPO])
    assert resolved_commits(fake_hub) == {second}
    fetched = {p.rsplit("/", 1)[1] for m, p, _ in fake_hub.requests if "/resolve/" in p}
    assert fetched == {"config.json", WEIGHTS}       # the unchanged files were kept


@pytest.mark.parametrize("name", ["config.json", WEIGHTS])
def test_a_damaged_file_of_the_right_size_is_fetched_anew(fake_hub, repo_dir, tmp_path, name):
    dl = tmp_path / "dl"
    hub.download(REPO, dl, endpoint=fake_hub.url)
    data = bytearray((dl / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (dl / name).write_bytes(bytes(data))
    hub.download(REPO, dl, endpoint=fake_hub.url)
    assert contents(dl) == contents(repo_dir)


def test_a_part_left_by_an_older_revision_is_not_completed_with_the_new_one(fake_hub, repo_dir,
                                                                              tmp_path):
    dl = tmp_path / "dl"
    seen = []
    assert hub.download(REPO, dl, endpoint=fake_hub.url, progress=lambda d, t, w: seen.append(w),
                        cancel=lambda: seen.count(WEIGHTS) >= 1) is None
    assert (dl / (WEIGHTS + ".part")).stat().st_size == CHUNK
    fake_hub.push(REPO, new_revision(repo_dir, tmp_path))
    assert hub.download(REPO, dl, endpoint=fake_hub.url) == dl
    assert contents(dl) == contents(fake_hub.repos[REPO])


# ---- links in the download folder ----

@pytest.fixture
def victim(tmp_path) -> Path:
    """A file outside the download folder that a followed link would change."""
    path = tmp_path / "outside" / "victim.bin"
    path.parent.mkdir()
    path.write_bytes(b"not yours")
    return path


def _part_symlink(dl, victim, repo_dir):
    (dl / "config.json.part").symlink_to(victim)


def _part_symlink_to_a_prefix(dl, victim, repo_dir):
    victim.write_bytes((repo_dir / WEIGHTS).read_bytes()[:CHUNK])   # resuming would append to it
    (dl / (WEIGHTS + ".part")).symlink_to(victim)


def _part_hard_link(dl, victim, repo_dir):
    victim.write_bytes((repo_dir / WEIGHTS).read_bytes()[:CHUNK])
    os.link(victim, dl / (WEIGHTS + ".part"))


def _part_dangling_symlink(dl, victim, repo_dir):
    victim.unlink()            # opening the link to append would create the victim
    (dl / "config.json.part").symlink_to(victim)


def _final_symlink_same_size(dl, victim, repo_dir):
    victim.write_bytes(b"x" * (repo_dir / "config.json").stat().st_size)
    (dl / "config.json").symlink_to(victim)


def _final_symlink_right_content(dl, victim, repo_dir):
    victim.write_bytes((repo_dir / "config.json").read_bytes())
    (dl / "config.json").symlink_to(victim)


LINKS = [_part_symlink, _part_symlink_to_a_prefix, _part_hard_link, _part_dangling_symlink,
         _final_symlink_same_size, _final_symlink_right_content]


@pytest.mark.parametrize("plant", LINKS, ids=lambda f: f.__name__.strip("_"))
def test_links_in_the_folder_are_not_followed(fake_hub, repo_dir, tmp_path, victim, plant):
    dl = tmp_path / "dl"
    dl.mkdir()
    plant(dl, victim, repo_dir)
    before = victim.read_bytes() if victim.exists() else None
    assert hub.download(REPO, dl, endpoint=fake_hub.url) == dl
    assert (victim.read_bytes() if victim.exists() else None) == before
    assert list(victim.parent.iterdir()) == ([victim] if before is not None else [])
    assert contents(dl) == contents(repo_dir)
    assert not [p for p in dl.iterdir() if p.is_symlink() or p.name.endswith(".part")]


def test_a_linked_subfolder_leading_outside_is_refused(fake_hub, repo_dir, tmp_path, victim):
    (repo_dir / "sub").mkdir()
    (repo_dir / "sub" / "extra.json").write_text("{}")
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / "sub").symlink_to(victim.parent, target_is_directory=True)
    with pytest.raises(DiffuseError, match="through a link"):
        hub.download(REPO, dl, endpoint=fake_hub.url)
    assert list(victim.parent.iterdir()) == [victim] and victim.read_bytes() == b"not yours"


# ---- hostile file names: refused on every OS's rules, here and on Windows alike ----

HOSTILE_NAMES = [
    "/etc/evil.json", "//server/share/evil.json", "\\evil.json", "\\\\server\\share\\evil.json",
    "C:evil.json", "C:/evil.json", "c:\\evil.json", "evil.json:stream.json", "../evil.json",
    "a/../../evil.json", "sub/../evil.json", "..\\evil.json", "a\\..\\..\\evil.safetensors",
    "./evil.json", "a//evil.json", "a/./evil.json", "a/\0/evil.json", "..",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_file_name_is_refused(fake_hub, tmp_path, monkeypatch, name):
    listed = fake_hub.info
    evil = {"rfilename": name, "size": 2, "blobId": "0" * 40}
    monkeypatch.setattr(fake_hub, "info",
                        lambda repo: dict(listed(repo), siblings=listed(repo)["siblings"] + [evil]))
    monkeypatch.setattr(hub, "WANTED", (*hub.WANTED, ".."))     # so that ".." is considered too
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(DiffuseError, match="refusing the file name"):
        hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url)
    assert sorted(tmp_path.rglob("*")) == before                  # nothing written anywhere


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "sub/model.safetensors",
                                  "a.b/c-d_e.json"])
def test_plain_names_pass(name):
    assert hub._safe_name(name)


# ---- one revision per download ----

def test_a_push_during_a_download_does_not_mix_revisions(fake_hub, repo_dir, tmp_path):
    dl = tmp_path / "dl"
    pushed = []

    def progress(done, total, what):
        if what.startswith("verifying") and not pushed:     # the first file is in
            pushed.append(fake_hub.push(REPO, new_revision(repo_dir, tmp_path)))

    assert hub.download(REPO, dl, endpoint=fake_hub.url, progress=progress) == dl
    assert pushed and contents(dl) == contents(repo_dir)     # all of the first revision
    assert resolved_commits(fake_hub) == {COMMIT}

    fake_hub.requests.clear()                                # the next call moves to the new one
    assert hub.download(REPO, dl, endpoint=fake_hub.url) == dl
    assert contents(dl) == contents(fake_hub.repos[REPO])
    assert resolved_commits(fake_hub) == {pushed[0]}


def test_a_hub_that_names_no_commit_is_refused(fake_hub, tmp_path, monkeypatch):
    listed = fake_hub.info
    monkeypatch.setattr(fake_hub, "info", lambda repo: dict(listed(repo), sha=None))
    with pytest.raises(DiffuseError, match="which commit"):
        hub.download(REPO, tmp_path / "dl", endpoint=fake_hub.url)
    assert not (tmp_path / "dl").exists()
