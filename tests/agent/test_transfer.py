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


def test_a_bundle_cannot_escape_the_code_dir(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        unpack(buf.getvalue(), tmp_path / "code")
    assert not (tmp_path / "escaped.txt").exists()
