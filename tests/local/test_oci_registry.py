"""The local cloud's registry over HTTP, serving an OCI image built from a small root filesystem: content-addressed
blobs, manifests by tag and by digest, the distribution API's JSON errors, read-only, on 127.0.0.1 only."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobplane.local import oci_registry
from jobplane.local.oci_registry import CONFIG, LAYER, MANIFEST, REF_NAME, LocalRegistry, build_image

pytestmark = pytest.mark.timeout(60)
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, whatever the environment


def sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root filesystem in miniature: what a container needs, and what the layer leaves out."""
    root = tmp_path / "root"
    for name, text in {"etc/os-release": 'PRETTY_NAME="Tiny"\n', "usr/bin/tool": "#!/bin/sh\necho tool\n",
                       "usr/share/doc/tool/copyright": "docs", "usr/share/man/man1/tool.1": "manual",
                       "var/lib/apt/lists/deb_Packages": "lists", "var/cache/apt/pkgcache.bin": "cache",
                       "var/cache/debconf/config.dat": "debconf", "proc/stale": "not a real proc"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "usr" / "bin" / "tool").chmod(0o755)
    (root / "bin").symlink_to("usr/bin")
    os.link(root / "usr" / "bin" / "tool", root / "usr" / "bin" / "tool-again")
    return root


@pytest.fixture
def layout(root: Path, tmp_path: Path) -> Path:
    build_image(root, tmp_path / "layout")
    return tmp_path / "layout"


@pytest.fixture
def registry(layout: Path) -> Iterator[LocalRegistry]:
    with LocalRegistry({"jobplane/debian": layout}) as served:
        yield served


def get(registry: LocalRegistry, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://{registry.address}{path}", method=method,
                                     headers={"Accept": MANIFEST})
    try:
        with OPENER.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()


def test_the_image_is_one_gzip_layer_of_the_tree_without_docs_or_apt_lists(layout: Path, root: Path,
                                                                           tmp_path: Path) -> None:
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    assert entry["mediaType"] == MANIFEST and entry["annotations"] == {REF_NAME: "12"}
    for path in (layout / "blobs" / "sha256").iterdir():  # content-addressed, nothing else
        assert sha256(path.read_bytes()) == f"sha256:{path.name}"
    manifest = json.loads(blob(layout, entry["digest"]))
    assert manifest["config"]["mediaType"] == CONFIG
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == LAYER and layer["size"] == len(blob(layout, layer["digest"]))
    config = json.loads(blob(layout, manifest["config"]["digest"]))
    tar = gzip.decompress(blob(layout, layer["digest"]))
    assert config["rootfs"] == {"type": "layers", "diff_ids": [sha256(tar)]}
    assert config["config"]["Cmd"] == ["/bin/bash"] and config["config"]["Env"][0].startswith("PATH=/usr/local/sbin:")
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert {"etc/os-release", "usr/bin/tool", "var/cache/debconf/config.dat", "usr/share/doc", "usr/share/man",
            "var/lib/apt/lists", "var/cache/apt", "proc"} <= set(members)
    assert not [n for n in members if n.startswith(("usr/share/doc/", "usr/share/man/", "var/lib/apt/lists/",
                                                    "var/cache/apt/", "proc/"))]
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    assert members["usr/bin/tool"].mode == 0o755
    hardlinked = [members["usr/bin/tool"], members["usr/bin/tool-again"]]
    assert sorted(m.islnk() for m in hardlinked) == [False, True]  # stored once
    assert all(m.uname == m.gname == "" for m in members.values())  # owners by number only
    build_image(root, tmp_path / "again")
    assert json.loads((tmp_path / "again" / "index.json").read_text())["manifests"][0]["digest"] == entry["digest"]


def test_the_registry_serves_manifests_by_tag_and_by_digest_and_blobs_by_digest(registry: LocalRegistry,
                                                                               layout: Path) -> None:
    assert registry.address.startswith("127.0.0.1:")
    assert registry.reference() == f"{registry.address}/jobplane/debian:12"
    status, headers, body = get(registry, "/v2/")
    assert (status, json.loads(body)) == (200, {})
    assert headers["Docker-Distribution-API-Version"] == "registry/2.0"

    status, headers, by_tag = get(registry, "/v2/jobplane/debian/manifests/12")
    assert status == 200 and headers["Content-Type"] == MANIFEST
    digest = headers["Docker-Content-Digest"]
    assert digest == sha256(by_tag) == json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    assert get(registry, f"/v2/jobplane/debian/manifests/{digest}")[::2] == (200, by_tag)
    status, headers, body = get(registry, "/v2/jobplane/debian/manifests/12", method="HEAD")
    assert (status, body, int(headers["Content-Length"])) == (200, b"", len(by_tag))
    assert headers["Docker-Content-Digest"] == digest

    manifest = json.loads(by_tag)
    for described in (manifest["config"], *manifest["layers"]):
        status, headers, body = get(registry, f"/v2/jobplane/debian/blobs/{described['digest']}")
        assert status == 200 and headers["Docker-Content-Digest"] == described["digest"]
        assert sha256(body) == described["digest"] and len(body) == described["size"]


def error(registry: LocalRegistry, path: str, method: str = "GET") -> tuple[int, str, Any]:
    status, headers, body = get(registry, path, method)
    assert headers["Content-Type"] == "application/json", headers
    (first,) = json.loads(body)["errors"]
    return status, first["code"], first["message"]


def test_what_the_registry_does_not_have_is_a_404_with_the_apis_json_error(registry: LocalRegistry) -> None:
    unknown = "sha256:" + "0" * 64
    assert error(registry, "/v2/jobplane/debian/manifests/13") == (404, "MANIFEST_UNKNOWN",
                                                                    "manifest unknown: jobplane/debian:13")
    assert error(registry, f"/v2/jobplane/debian/manifests/{unknown}")[:2] == (404, "MANIFEST_UNKNOWN")
    assert error(registry, "/v2/jobplane/nope/manifests/1")[:2] == (404, "NAME_UNKNOWN")
    assert error(registry, f"/v2/jobplane/debian/blobs/{unknown}")[:2] == (404, "BLOB_UNKNOWN")
    assert error(registry, "/v2/jobplane/debian/blobs/..%2F..%2Findex.json")[:2] == (404, "BLOB_UNKNOWN")
    assert error(registry, "/v2/jobplane/debian/manifests/12", method="PUT")[:2] == (405, "UNSUPPORTED")


def test_a_registry_without_its_image_answers_manifest_unknown(tmp_path: Path) -> None:
    with LocalRegistry({"jobplane/debian": tmp_path / "not-built"}) as served:
        assert error(served, "/v2/jobplane/debian/manifests/12")[:2] == (404, "MANIFEST_UNKNOWN")
    assert oci_registry.image_problem(tmp_path / "not-built") is not None


def test_the_build_step_says_why_without_the_debian_image_and_never_fails(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("JOBPLANE_CACHE", str(tmp_path / "cache"))
    assert oci_registry.main(["build"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the local cloud's registry has no image") and "no Debian 12 root filesystem" in out
    assert not (tmp_path / "cache" / "oci").exists()
