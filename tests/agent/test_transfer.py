"""Checkpoint sync uploads changed files only; code bundles cannot write outside their directory."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from jobplane.agent.transfer import DirSync, download, keys_under, unpack
from jobplane.clouds.memory import MemoryStore


def test_only_new_and_changed_files_are_uploaded(tmp_path: Path) -> None:
    store = MemoryStore()
    sync = DirSync(store, tmp_path / "ckpt", "jobs/j/checkpoints/")
    assert sync.sync() == 0  # the directory does not exist yet
    (tmp_path / "ckpt" / "sub").mkdir(parents=True)
    (tmp_path / "ckpt" / "a.pt").write_bytes(b"1")
    (tmp_path / "ckpt" / "sub" / "b.pt").write_bytes(b"2")
    assert sync.sync() == 2
    assert sync.sync() == 0
    (tmp_path / "ckpt" / "a.pt").write_bytes(b"11")
    assert sync.sync() == 1
    assert store.get("jobs/j/checkpoints/a.pt").data == b"11"
    assert store.get("jobs/j/checkpoints/sub/b.pt").data == b"2"


def test_restored_files_are_not_uploaded_again(tmp_path: Path) -> None:
    store = MemoryStore()
    store.put("jobs/j/checkpoints/latest.pt", b"x")
    store.put("jobs/j/checkpoints2/other", b"not ours")
    prefix = "jobs/j/checkpoints/"
    assert download(store, keys_under(store, prefix), prefix, tmp_path) == 1
    sync = DirSync(store, tmp_path, prefix)
    sync.mark_synced()
    puts = store.calls["put"]
    assert sync.sync() == 0 and store.calls["put"] == puts
    os.utime(tmp_path / "latest.pt", ns=(1, 1))  # touched by the job: uploaded
    assert sync.sync() == 1


def test_prefix_without_slash_matches_the_object_or_its_folder_only() -> None:
    store = MemoryStore()
    for key in ("data/train/a", "data/train/b", "data/train2/c", "data/train"):
        store.put(key, b"")
    assert keys_under(store, "data/train") == ["data/train", "data/train/a", "data/train/b"]
    assert keys_under(store, "data/train/") == ["data/train/a", "data/train/b"]


def _tarball(*members: tarfile.TarInfo) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in members:
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
        unpack(_tarball(_member("ok.txt"), member), code)
    except tarfile.TarError:
        pass
    else:
        assert member.name.startswith(os.sep) and filters
        assert (code / member.name.lstrip(os.sep)).exists()
    assert not (tmp_path / "escaped.txt").exists() and not Path(member.name).exists()


def test_without_tarfile_filters_a_normal_bundle_unpacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(tarfile, "data_filter")
    unpack(_tarball(_member("src/train.py"), _member("latest", tarfile.SYMTYPE, "src/train.py")), tmp_path)
    assert (tmp_path / "src" / "train.py").read_bytes() == b"x" and (tmp_path / "latest").is_symlink()
