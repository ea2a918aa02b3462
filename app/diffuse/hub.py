"""Download a model's checkpoint folder, or one ready GGUF file, from the Hugging Face hub:
resumable and checksummed.

Needs the optional `huggingface_hub` package (extra "hub"). The file list, sizes and checksums
come from the hub's model info at one commit, so a push during a long download cannot mix two
versions. Each file is fetched into `NAME.part` with HTTP range requests (huggingface_hub's
`http_get`, which also retries dropped connections), verified (sha256 for LFS files, the git blob
sha1 for small ones) and only then renamed to NAME. A cancelled or interrupted download keeps its
`.part` files, and the next call continues from there. A file already in the folder is kept only
when it matches the checksum (so a repository that changed since is fetched anew), and links in the
folder are never followed: a .part or file that is a link is replaced, not written through.
download_file() fetches one file the same way, but never replaces a file at its destination.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import os
import shutil
import stat
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Callable

from diffuse import DiffuseError
from diffuse.gguf_file import replace_durably

# What diffuse.convert reads from a checkpoint folder (weights, config, both tokenizer layouts,
# chat template); the custom modelling code and the README are not needed.
WANTED = ("*.safetensors", "*.json", "merges.txt", "*.jinja")
CHECK_TIMEOUT_S = 5.0
HASH_CHUNK = 8 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)   # Windows has none; the .part was unlinked just before

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class RemoteFile:
    path: str            # relative to the repository root
    size: int            # bytes
    sha256: str | None   # LFS files (the weights)
    git_sha1: str        # every file: the git blob id

    def verify(self, local: Path) -> bool:
        """The file's bytes hash to what the hub says."""
        if self.sha256:
            h = hashlib.sha256()
        else:   # a git blob id hashes a "blob SIZE\0" header followed by the content
            h = hashlib.sha1(f"blob {self.size}\0".encode())
        with open(local, "rb") as f:
            for chunk in iter(lambda: f.read(HASH_CHUNK), b""):
                h.update(chunk)
        return h.hexdigest() == (self.sha256 or self.git_sha1)


class _Cancelled(Exception):
    pass


def available() -> bool:
    """Whether the optional huggingface_hub package is installed."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return False
    return True


def default_endpoint() -> str:
    """$HF_ENDPOINT (a mirror, or a test server) or the public hub."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline_reason(endpoint: str | None = None) -> str | None:
    """None when the hub answers; otherwise a plain sentence saying why downloads are off."""
    endpoint = endpoint or default_endpoint()
    if not available():
        return ("Downloading needs the optional huggingface_hub package "
                "(pip install 'diffuse[hub]').")
    import httpx2
    from huggingface_hub import constants, get_session
    if constants.is_offline_mode():
        return "Downloads are switched off (HF_HUB_OFFLINE is set)."
    try:
        get_session().head(endpoint, timeout=CHECK_TIMEOUT_S)
    except (httpx2.HTTPError, OSError) as e:
        return f"This computer is offline: {endpoint} cannot be reached ({_reason(e)})."
    return None


def list_files(repo_id: str, revision: str = "main", endpoint: str | None = None
               ) -> tuple[str, list[RemoteFile]]:
    """(commit sha, the files diffuse needs) of a model repository."""
    commit, files = _repo_files(repo_id, revision, endpoint or default_endpoint(),
                                lambda name: any(fnmatch(name, p) for p in WANTED))
    if not any(f.path.endswith(".safetensors") for f in files):
        raise DiffuseError(f"{repo_id}: the repository has no .safetensors weights to download")
    return commit, files


def _repo_files(repo_id: str, revision: str, endpoint: str, wanted: Callable[[str], bool]
                ) -> tuple[str, list[RemoteFile]]:
    """(commit sha, the repository's files whose names `wanted` accepts) at one commit."""
    info = _call(repo_id, endpoint, lambda api: api.model_info(repo_id, revision=revision,
                                                               files_metadata=True))
    files = [RemoteFile(s.rfilename, int(s.size), s.lfs.sha256 if s.lfs else None, s.blob_id)
             for s in info.siblings or [] if wanted(s.rfilename)]
    for f in files:
        if not _safe_name(f.path):
            raise DiffuseError(f"{repo_id}: refusing the file name {f.path!r}")
    if not info.sha:    # without a commit, each file would come from whatever the branch is then
        raise DiffuseError(f"{repo_id}: the hub did not say which commit {revision} is")
    return info.sha, files


def _safe_name(name: str) -> bool:
    """A plain relative path that stays inside the download folder on every OS: no root or drive
    (/x, \\x, C:x), no backslash or colon (a separator or a Windows stream), no .. or empty parts."""
    if not name or any(c in name for c in "\\:\0"):
        return False
    for pure in (PurePosixPath(name), PureWindowsPath(name)):
        if pure.is_absolute() or pure.drive or pure.root:
            return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def download(repo_id: str, dest, revision: str = "main", endpoint: str | None = None,
             progress: Progress | None = None,
             cancel: Callable[[], bool] | None = None) -> Path | None:
    """Download the checkpoint files of `repo_id` into the folder `dest`.

    progress(done_bytes, total_bytes, file) as bytes arrive. Returns `dest`, or None when cancel()
    returned True (the .part files stay, so calling again resumes). Raises DiffuseError when the
    hub cannot be reached, the disk is too small, or a file does not match its checksum (that
    file is deleted; calling again fetches it anew).
    """
    endpoint = endpoint or default_endpoint()
    dest = Path(dest)
    commit, files = list_files(repo_id, revision, endpoint)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DiffuseError(f"{dest}: cannot create the download folder ({e})") from e
    total = sum(f.size for f in files)
    for f in files:     # a linked subfolder would lead outside the download folder
        if not (dest / f.path).parent.resolve().is_relative_to(dest.resolve()):
            raise DiffuseError(f"{dest / f.path}: refusing to download through a link "
                               f"that leads outside {dest}")
    have = {f.path: _local_size(dest, f) for f in files}
    _check_free(dest, repo_id, total - sum(have.values()))
    done = sum(have.values())
    for f in files:
        if cancel is not None and cancel():
            return None
        target = dest / f.path
        if _regular(dest / (f.path + ".part")) is None and have[f.path] == f.size:
            if progress is not None:
                progress(done, total, f"verifying {f.path}")
            if f.verify(target):
                continue
            done -= f.size      # another version of the file (or damaged): fetched anew
            have[f.path] = 0
        try:
            _fetch(repo_id, commit, f, target, endpoint, done, total, progress, cancel)
        except _Cancelled:
            return None
        done += f.size - have[f.path]
    if progress is not None:
        progress(total, total, "done")
    return dest


def download_file(repo_id: str, filename: str, out, revision: str = "main",
                  sha256: str | None = None, size: int | None = None,
                  endpoint: str | None = None,
                  progress: Progress | None = None,
                  cancel: Callable[[], bool] | None = None) -> Path | None:
    """Download one file of `repo_id` (a ready GGUF) to the path `out`, the same way as download().

    `sha256` and `size`, when given, pin the file: the hub must list exactly those, or nothing is
    fetched (the repository changed since the pin was written). Without them the file is still
    verified against the hub's own checksum. A file already at `out` is kept when it matches and
    otherwise refused, never overwritten: it may be the user's. Returns `out`, or None when
    cancel() returned True (`out.part` stays, so calling again resumes).
    """
    endpoint = endpoint or default_endpoint()
    out = Path(out)
    commit, files = _repo_files(repo_id, revision, endpoint, lambda name: name == filename)
    if not files:
        raise DiffuseError(f"{repo_id}: the repository has no file {filename!r} at {revision}")
    f = files[0]
    for what, listed, pinned in (("sha256", f.sha256, sha256), ("size", f.size, size)):
        if pinned is not None and listed != pinned:
            raise DiffuseError(f"{repo_id}/{filename}: the hub lists another file than the pinned "
                               f"one ({what} {listed}, expected {pinned}); nothing was "
                               f"downloaded")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DiffuseError(f"{out.parent}: cannot create the download folder ({e})") from e
    part = _regular(out.with_name(out.name + ".part"))
    if os.path.lexists(out):
        if _regular(out) is not None and out.stat().st_size == f.size:
            if progress is not None:
                progress(0, f.size, f"verifying {out.name}")
            if f.verify(out):     # downloaded before
                return out
        raise DiffuseError(f"{out}: a different file is already there; refusing to overwrite it "
                           f"(move it away or choose another folder)")
    have = part.st_size if part is not None and part.st_size <= f.size else 0
    _check_free(out.parent, filename, f.size - have)
    try:
        _fetch(repo_id, commit, f, out, endpoint, have, f.size, progress, cancel)
    except _Cancelled:
        return None
    if progress is not None:
        progress(f.size, f.size, "done")
    return out


def _check_free(folder: Path, what: str, missing: int) -> None:
    """Refuse before fetching when the disk cannot hold the `missing` bytes still to come."""
    free = shutil.disk_usage(folder).free
    if missing > free:
        raise DiffuseError(f"{folder}: {what} needs {missing / 1e9:.1f} GB more disk, "
                           f"only {free / 1e9:.1f} GB are free")


def _regular(path: Path) -> os.stat_result | None:
    """path's stat when it is a plain file of its own: not a link (symbolic or hard), which
    writing or appending to would change some other file too."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else None


def _local_size(dest: Path, f: RemoteFile) -> int:
    """Bytes of `f` on disk: a resumable .part, or the whole file (its checksum still to check)."""
    target, part = _regular(dest / f.path), _regular(dest / (f.path + ".part"))
    if part is not None:    # an unfinished fetch, continued (or restarted when too long)
        return part.st_size if part.st_size <= f.size else 0
    return f.size if target is not None and target.st_size == f.size else 0


def _fetch(repo_id: str, commit: str, f: RemoteFile, target: Path, endpoint: str, done: int,
           total: int, progress: Progress | None, cancel) -> None:
    """Fetch one file into target.part from where it stopped, verify it, rename it to target.
    `done` counts the bytes of all files on disk so far, this file's part included."""
    import httpx2
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    part = target.with_name(target.name + ".part")
    st = _regular(part)
    resume = st.st_size if st is not None and st.st_size <= f.size else 0
    meter = functools.partial(_Meter, f.path, done - resume, total, progress, cancel)
    url = hf_hub_url(repo_id, f.path, revision=commit, endpoint=endpoint)
    try:
        part.parent.mkdir(parents=True, exist_ok=True)
        if not resume:   # a link is replaced, never written through; a longer .part is no prefix
            part.unlink(missing_ok=True)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | _NOFOLLOW | getattr(os, "O_BINARY", 0), 0o644)
        # Not append mode: http_get seeks back to 0 when the server ignores the range request.
        with os.fdopen(fd, "wb") as out:
            out.seek(resume)
            http_get(url, out, resume_size=resume, expected_size=f.size,
                     headers=build_hf_headers(), tqdm_class=meter)
        if progress is not None:
            progress(done + f.size - resume, total, f"verifying {f.path}")
        if not f.verify(part):
            part.unlink()
            if resume:   # the bytes kept from an earlier call may be another version of the file
                return _fetch(repo_id, commit, f, target, endpoint, done - resume, total,
                              progress, cancel)
            raise DiffuseError(f"{repo_id}/{f.path}: the downloaded file does not match the "
                               f"hub's checksum and was deleted; start the download again")
        replace_durably(part, target)   # replaces a link at target, never its target
    except OSError as e:
        if e.errno == errno.ENOSPC:    # the free-space check ran, but others write too
            raise DiffuseError(f"{repo_id}/{f.path}: the disk is full; what arrived is kept in "
                               f"{part}. Free some space and start the download again to "
                               f"resume it.") from e
        raise DiffuseError(f"{repo_id}/{f.path}: download failed, {_reason(e)}. "
                           f"Start the download again to resume it.") from e
    except httpx2.HTTPError as e:   # hub errors subclass httpx2's
        raise DiffuseError(f"{repo_id}/{f.path}: download failed, {_reason(e)}. "
                           f"Start the download again to resume it.") from e


class _Meter:
    """Stands in for huggingface_hub's tqdm bar: reports bytes and raises _Cancelled on cancel.

    http_get creates it with the file's `initial` (resumed) bytes and calls update(n) per chunk
    (n < 0 when the server ignored the range request and the file starts again)."""

    def __init__(self, name, base, grand_total, progress, cancel, *, initial=0, **_tqdm_args):
        self.name, self.grand_total, self.progress, self.cancel = name, grand_total, progress, cancel
        self.done = base + initial

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def update(self, n: int) -> None:
        self.done += n
        if self.cancel is not None and self.cancel():
            raise _Cancelled
        if self.progress is not None:
            self.progress(self.done, self.grand_total, self.name)


def _call(repo_id: str, endpoint: str, fn):
    """Run fn(HfApi) and turn every failure into a DiffuseError that says what to do."""
    if not available():
        raise DiffuseError(f"{repo_id}: downloading needs the optional huggingface_hub package "
                           f"(pip install 'diffuse[hub]')")
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (HfHubHTTPError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    try:
        return fn(HfApi(endpoint=endpoint))
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise DiffuseError(f"{repo_id}: no such model repository or revision on {endpoint}") from e
    except OfflineModeIsEnabled as e:
        raise DiffuseError(f"{repo_id}: downloads are switched off (HF_HUB_OFFLINE is set)") from e
    except HfHubHTTPError as e:
        raise DiffuseError(f"{repo_id}: the hub refused the request ({_reason(e)})") from e
    except (httpx2.HTTPError, OSError) as e:
        raise DiffuseError(f"{repo_id}: this computer is offline, {endpoint} cannot be reached "
                           f"({_reason(e)})") from e


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
