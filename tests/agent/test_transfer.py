"""Inputs download in parallel and resume; code bundles cannot write outside their directory."""

from __future__ import annotations

import io
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from jobplane.agent.transfer import fetch, fetch_tarball, keys_under, parallel, unpack
from jobplane.clouds.base import ObjectInfo
from jobplane.clouds.memory import MemoryStore


class CountingStore(MemoryStore):
    """Counts download_file calls per key and can fail a key's downloads."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[str] = []
        self.broken: set[str] = set()
        self.active = self.most_active = 0
        self._gauge = threading.Lock()

    def download_file(self, key: str, path: Path, **kw: object) -> str:  # type: ignore[override]
        if key in self.broken:
            raise OSError(f"injected: connection reset reading {key}")
        with self._gauge:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            time.sleep(0.01)  # room for the pool's other threads to start theirs
            self.fetched.append(key)
            return super().download_file(key, path, **kw)  # type: ignore[arg-type]
        finally:
            with self._gauge:
                self.active -= 1


def test_a_channel_downloads_in_parallel_and_a_rerun_fetches_only_what_changed(tmp_path: Path) -> None:
    store = CountingStore()
    for i in range(40):
        store.put(f"data/train/part-{i:03d}", f"rows {i}".encode())
    state, dest = tmp_path / "state" / "train", tmp_path / "train"
    moved = fetch(store, keys_under(store, "data/train/"), "data/train/", dest, state)
    assert (moved.files, moved.skipped, moved.bytes) == (40, 0, sum(len(f"rows {i}") for i in range(40)))
    assert store.most_active > 1  # really in parallel
    assert (dest / "part-007").read_bytes() == b"rows 7"
    assert "40 files" in moved.summary() and "MB/s" in moved.summary()

    store.fetched.clear()
    store.put("data/train/part-003", b"rewritten")  # a new version in the bucket
    (dest / "part-005").write_bytes(b"edited locally")  # and a local edit: both fetched again
    (dest / "part-009").unlink()  # and a missing file
    moved = fetch(store, keys_under(store, "data/train/"), "data/train/", dest, state)
    assert sorted(store.fetched) == ["data/train/part-003", "data/train/part-005", "data/train/part-009"]
    assert (moved.files, moved.skipped) == (3, 37)
    assert (dest / "part-003").read_bytes() == b"rewritten" and (dest / "part-005").read_bytes() == b"rows 5"


def test_a_failed_download_keeps_what_arrived_for_the_retry(tmp_path: Path) -> None:
    store = CountingStore()
    for i in range(6):
        store.put(f"in/{i}", b"x" * i)
    store.broken = {"in/4"}
    state = tmp_path / "state"
    with pytest.raises(RuntimeError, match=r"1 of 6 downloads .* failed, e.g. 4: injected"):
        fetch(store, keys_under(store, "in/"), "in/", tmp_path / "d", state)
    store.broken.clear()
    store.fetched.clear()
    moved = fetch(store, keys_under(store, "in/"), "in/", tmp_path / "d", state)
    assert store.fetched == ["in/4"] and moved.skipped == 5
    assert not list((tmp_path / "d").glob(".*"))  # no partial download left beside the files


def test_parallel_with_a_deadline_starts_nothing_late_and_returns_on_time() -> None:
    release = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "slow"

    jobs = [("first", lambda: "first"), ("slow", slow)] + [(f"late-{i}", lambda: "late") for i in range(4)]
    started = time.monotonic()
    results, errors = parallel(jobs, threads=2, deadline=time.monotonic() + 0.3)
    assert time.monotonic() - started < 3  # did not wait for "slow"
    release.set()
    assert "first" in results and "slow" not in results and errors == {}


def test_prefix_without_slash_matches_the_object_or_its_folder_only() -> None:
    store = MemoryStore()
    for key in ("data/train/a", "data/train/b", "data/train2/c", "data/train"):
        store.put(key, b"")
    assert [i.key for i in keys_under(store, "data/train")] == ["data/train", "data/train/a", "data/train/b"]
    assert [i.key for i in keys_under(store, "data/train/")] == ["data/train/a", "data/train/b"]
    assert all(isinstance(i, ObjectInfo) and i.version for i in keys_under(store, "data/"))


def _tarball(*members: tarfile.TarInfo | str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in (_member(m) if isinstance(m, str) else m for m in members):
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize("filters", [True, False], ids=["tarfile filters", "Python before 3.11.4 (Debian 12)"])
@pytest.mark.parametrize("member", [_member("../escaped.txt"), _member(f"{os.sep}tmp/escaped-{os.getpid()}.txt"),
                                    _member("link", tarfile.SYMTYPE, "../../escaped.txt"),
                                    _member("dev", tarfile.CHRTYPE)], ids=["dotdot", "absolute", "symlink", "device"])
def test_a_bundle_cannot_escape_the_code_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filters: bool,
                                             member: tarfile.TarInfo) -> None:
    """Refused, or (an absolute name, with tarfile's filter) kept inside the code dir: never outside it."""
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter")
    code = tmp_path / "code"
    try:
        unpack(_file(tmp_path, _tarball(_member("ok.txt"), member)), code)
    except tarfile.TarError:
        pass
    else:
        assert member.name.startswith(os.sep) and filters
        assert (code / member.name.lstrip(os.sep)).exists()
    assert not (tmp_path / "escaped.txt").exists() and not Path(member.name).exists()


@pytest.mark.parametrize("filters", [True, False], ids=["tarfile filters", "Python before 3.11.4 (Debian 12)"])
def test_a_chain_of_symlinks_cannot_escape_the_code_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        filters: bool) -> None:
    """Each link alone stays inside (a -> ., a/b -> .. read lexically is the code dir), but once `a` exists on
    disk, a/b is code/b and points at code's parent: a/b/escaped.txt would land outside. Checking every member
    against the tree as extracted so far refuses it."""
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter")
    code = tmp_path / "code"
    chain = _tarball(_member("a", tarfile.SYMTYPE, "."), _member("a/b", tarfile.SYMTYPE, ".."),
                     _member("a/b/escaped.txt"))
    with pytest.raises(tarfile.TarError):
        unpack(_file(tmp_path, chain), code)
    assert not (tmp_path / "escaped.txt").exists()


def test_without_tarfile_filters_a_normal_bundle_unpacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(tarfile, "data_filter")
    unpack(_file(tmp_path, _tarball(_member("src/train.py"), _member("latest", tarfile.SYMTYPE, "src/train.py"))),
           tmp_path)
    assert (tmp_path / "src" / "train.py").read_bytes() == b"x" and (tmp_path / "latest").is_symlink()


def _file(directory: Path, data: bytes) -> Path:
    path = directory / "bundle.tar.gz"
    path.write_bytes(data)
    return path

def test_a_bundle_is_streamed_and_cannot_escape_the_code_dir(tmp_path: Path) -> None:
    store = MemoryStore()
    store.put("code.tar.gz", _tarball("train.py"))
    assert fetch_tarball(store, "code.tar.gz", tmp_path / "code") > 0
    assert (tmp_path / "code" / "train.py").read_bytes() == b"x"
    store.put("evil.tar.gz", _tarball("../escaped.txt"))
    with pytest.raises(tarfile.TarError):
        fetch_tarball(store, "evil.tar.gz", tmp_path / "code")
    assert not (tmp_path / "escaped.txt").exists()
