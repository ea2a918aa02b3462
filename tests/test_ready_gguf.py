"""Ready-GGUF downloads (diffuse.hub.download_file through diffuse.catalog.download_ready_gguf)
against a local stand-in for the Hugging Face hub (tests/fixtures/fake_hub.py), no network:
verified download, resume after a cancel and after a dropped connection, damaged bytes, a hub
that lists another file than the catalog pins, no pin at all, a full disk before and during the
download, a user's file at the destination, and a file of the wrong architecture."""
from __future__ import annotations

import errno
import os
import shutil
import socket

import pytest
from fixtures.fake_hub import CHUNK, GGUF_FILE

from diffuse import DiffuseError, catalog, hub


def fetched(server) -> list[str]:
    return [p for m, p, _ in server.requests if m == "GET" and "/resolve/" in p]


def empty(folder) -> bool:
    return not folder.exists() or not any(folder.iterdir())


@pytest.fixture
def dest(tmp_path):
    """The download folder (tmp_path also holds the fake hub's repository)."""
    return tmp_path / "models"


def test_download_verifies_and_reports_progress(gguf_hub, gguf_repo, ready_model, dest):
    seen = []
    path = catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url,
                                       progress=lambda d, t, what: seen.append((d, t, what)))
    assert path == dest / GGUF_FILE
    assert path.read_bytes() == (gguf_repo / GGUF_FILE).read_bytes()
    assert sorted(p.name for p in path.parent.iterdir()) == [GGUF_FILE]    # no .part left
    size = path.stat().st_size
    assert seen[-1] == (size, size, "done")
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
    # Asked again: the file is checked, kept, and nothing is fetched.
    gguf_hub.requests.clear()
    assert catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url) == path
    assert not fetched(gguf_hub)


def test_cancel_keeps_the_part_and_the_next_call_resumes(gguf_hub, gguf_repo, ready_model, dest):
    seen = []
    assert catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url,
                                       progress=lambda d, t, what: seen.append(what),
                                       cancel=lambda: seen.count(GGUF_FILE) >= 1) is None
    part = dest / (GGUF_FILE + ".part")
    assert part.stat().st_size == CHUNK and not (dest / GGUF_FILE).exists()
    path = catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url)
    assert gguf_hub.ranges(GGUF_FILE)[-1] == f"bytes={CHUNK}-"
    assert path.read_bytes() == (gguf_repo / GGUF_FILE).read_bytes() and not part.exists()


def test_a_dropped_connection_is_resumed(gguf_hub, gguf_repo, ready_model, dest):
    gguf_hub.drop_after[GGUF_FILE] = 4 * CHUNK
    path = catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url)
    assert gguf_hub.ranges(GGUF_FILE) == [None, f"bytes={4 * CHUNK}-"]
    assert path.read_bytes() == (gguf_repo / GGUF_FILE).read_bytes()


@pytest.mark.parametrize("pinned", [True, False], ids=["sha256 pinned", "no pin"])
def test_damaged_bytes_are_refused_and_deleted(gguf_hub, ready_model, dest, pinned):
    if not pinned:   # the catalog may not know the file: the hub's own sha256 still decides
        gguf = {k: v for k, v in ready_model["ready_gguf"].items()
                if k not in ("sha256", "file_bytes")}
        ready_model = dict(ready_model, ready_gguf=gguf)
    gguf_hub.corrupt.add(GGUF_FILE)
    with pytest.raises(DiffuseError, match=f"{GGUF_FILE}: .*checksum.*deleted"):
        catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url)
    assert empty(dest)
    gguf_hub.corrupt.clear()
    assert catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url) is not None


def test_a_part_of_another_file_is_fetched_anew(gguf_hub, gguf_repo, ready_model, dest):
    dest.mkdir()
    (dest / (GGUF_FILE + ".part")).write_bytes(b"\xff" * (3 * CHUNK))   # not a prefix
    path = catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url)
    assert gguf_hub.ranges(GGUF_FILE) == [f"bytes={3 * CHUNK}-", None]
    assert path.read_bytes() == (gguf_repo / GGUF_FILE).read_bytes()


@pytest.mark.parametrize("pin", [{"sha256": "0" * 64}, {"file_bytes": 123}],
                         ids=["sha256", "size only"])
def test_a_file_other_than_the_pinned_one_is_not_downloaded(gguf_hub, ready_model, dest, pin):
    gguf = {k: v for k, v in ready_model["ready_gguf"].items() if k not in ("sha256", "file_bytes")}
    model = dict(ready_model, ready_gguf=gguf | pin)
    what = next(iter(pin)).replace("file_bytes", "size")
    with pytest.raises(DiffuseError, match=f"another file than the pinned one \\({what} .*"
                                           f"nothing was"):
        catalog.download_ready_gguf(model, dest, endpoint=gguf_hub.url)
    assert not fetched(gguf_hub) and not dest.exists()


def test_a_missing_file_is_named(gguf_hub, ready_model, dest):
    model = dict(ready_model, ready_gguf=dict(ready_model["ready_gguf"], file="other.gguf"))
    with pytest.raises(DiffuseError, match="no file 'other.gguf'"):
        catalog.download_ready_gguf(model, dest, endpoint=gguf_hub.url)


def test_not_enough_disk_is_said_before_anything_is_written(gguf_hub, ready_model, dest,
                                                             monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 10))
    with pytest.raises(DiffuseError, match="GB more disk, only 0.0 GB are free"):
        catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url)
    assert not fetched(gguf_hub) and empty(dest)


class _FillsUp:
    """A file that takes `room` bytes and then fails as a full disk does."""

    def __init__(self, f, room: int):
        self._f, self._room = f, room

    def write(self, data) -> int:
        if len(data) > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def test_a_disk_that_fills_up_keeps_the_part_for_later(gguf_hub, gguf_repo, ready_model,
                                                       dest, monkeypatch):
    real_fdopen = os.fdopen
    with monkeypatch.context() as m, pytest.raises(DiffuseError,
                                                   match="the disk is full; what arrived is kept"):
        m.setattr(hub.os, "fdopen", lambda fd, mode: _FillsUp(real_fdopen(fd, mode), 5 * CHUNK))
        catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url)
    assert (dest / (GGUF_FILE + ".part")).stat().st_size == 5 * CHUNK
    assert not (dest / GGUF_FILE).exists()
    # Space was freed: the next call resumes.
    path = catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url)
    assert gguf_hub.ranges(GGUF_FILE)[-1] == f"bytes={5 * CHUNK}-"
    assert path.read_bytes() == (gguf_repo / GGUF_FILE).read_bytes()


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_users_file_is_never_overwritten(gguf_hub, ready_model, tmp_path, dest, kind):
    victim = tmp_path / "mine.gguf"
    victim.write_bytes(b"the user's own model")
    dest.mkdir()
    if kind == "file":
        shutil.copy(victim, dest / GGUF_FILE)
    else:
        (dest / GGUF_FILE).symlink_to(victim)
    with pytest.raises(DiffuseError, match="refusing to overwrite"):
        catalog.download_ready_gguf(ready_model, dest, endpoint=gguf_hub.url)
    assert (dest / GGUF_FILE).read_bytes() == victim.read_bytes() == b"the user's own model"
    assert not fetched(gguf_hub)


def test_a_file_of_another_architecture_is_refused(gguf_hub, ready_model, dest):
    model = dict(ready_model, ready_gguf=dict(ready_model["ready_gguf"], architecture="dream"))
    with pytest.raises(DiffuseError, match="is not a dream model: its architecture is 'llada' "
                                           r"\(deleted\)"):
        catalog.download_ready_gguf(model, dest, endpoint=gguf_hub.url)
    assert empty(dest)


def test_offline_is_said_plainly(ready_model, dest):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(DiffuseError, match="offline"):
        catalog.download_ready_gguf(ready_model, dest, endpoint=url)
    assert not dest.exists()


def test_an_entry_without_a_ready_gguf_says_what_to_do(ready_model, dest):
    model = {k: v for k, v in ready_model.items() if k != "ready_gguf"}
    with pytest.raises(DiffuseError, match="no ready GGUF; download the checkpoint"):
        catalog.download_ready_gguf(model, dest)
