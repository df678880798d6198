"""A container registry on loopback for the local cloud, and the image it serves.

A job that runs in a container pulls its image over the OCI distribution API, and nothing in the local cloud
reaches past loopback, so the cloud serves its own: `jobplane/debian:12`, a one-layer image of the stock Debian
12 root filesystem (jobplane.local.rootfs) made here in Python, with no container tool, once, into the cache as
an OCI image layout (oci-layout, index.json, blobs/sha256/). The registry only reads: GET and HEAD of /v2/, of
manifests by tag or digest and of blobs, in plain HTTP on 127.0.0.1, which the Debian 12 + podman image trusts
(rootfs.PODMAN_CONF).

    python -m jobplane.local.oci_registry build    # the install step (make local-images), after the rootfs
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import urlsplit

from jobplane.boot.bundling import atomic_build, host_architecture
from jobplane.local import cache_dir, install_step, rootfs
from jobplane.local.loopback import LoopbackServer
from jobplane.model.images import AARCH64

NAME, TAG = "jobplane/debian", "12"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Kept, but empty, in the layer: mount points, and what no container reads (docs, manuals, translations) or apt
# fetches again (its package lists and downloads).
EMPTIED = ("proc", "sys", "dev", "run", "tmp", "var/lib/apt/lists", "var/cache/apt", "usr/share/doc",
           "usr/share/man", "usr/share/info", "usr/share/locale")


def image_dir() -> Path:
    return cache_dir() / "oci" / "debian-12"


def image_problem(layout: Path | None = None) -> str | None:
    """Why the registry has no image to serve, or None."""
    layout = layout or image_dir()
    if not (layout / "index.json").exists():
        return (f"no OCI image of Debian 12 at {layout}: build it with `python -m jobplane.local.oci_registry build` "
                "(make local-images)")
    return None


class _Digest:
    """A write-only stream that hashes and counts what it passes on to out."""

    def __init__(self, out: Any) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha.hexdigest()}"


def _blob(blobs: Path, data: bytes, media_type: str) -> dict[str, Any]:
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _layer_entry(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if os.path.dirname(info.name) in EMPTIED:
        return None
    info.uname = info.gname = ""  # numeric owners: this machine's names for them mean nothing in the image
    return info


def build_image(root: Path, out: Path, tag: str = TAG) -> str:
    """Write root as a one-layer OCI image layout into out, tagged tag; returns the manifest's digest. The layer
    is streamed (tar, gzip and both digests in one pass), so the ~100 MB tree never sits in memory."""
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    partial = blobs / "layer.partial"
    with partial.open("wb") as file:
        gz = _Digest(file)
        # zlib's default level: 9 takes 4x as long (19 s) for 1% less, 1 half as long for 10% more
        with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as zipped:
            tar = _Digest(zipped)
            with tarfile.open(fileobj=cast(IO[bytes], tar), mode="w|", format=tarfile.PAX_FORMAT) as archive:
                for entry in sorted(os.listdir(root)):
                    archive.add(root / entry, arcname=entry, filter=_layer_entry)
    layer = {"mediaType": LAYER, "digest": gz.digest, "size": gz.size}
    partial.rename(blobs / gz.digest.removeprefix("sha256:"))
    config = {"architecture": "arm64" if host_architecture() == AARCH64 else "amd64", "os": "linux",
              "config": {"Env": [f"PATH={rootfs.PATH}"], "Cmd": ["/bin/bash"]},
              "rootfs": {"type": "layers", "diff_ids": [tar.digest]},
              "history": [{"created_by": f"jobplane.local.oci_registry from {root.name}"}]}
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                "config": _blob(blobs, json.dumps(config).encode(), CONFIG), "layers": [layer]}
    described = _blob(blobs, json.dumps(manifest).encode(), MANIFEST)
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [{**described, "annotations": {REF_NAME: tag}}]}
    (out / "index.json").write_text(json.dumps(index))
    (out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return str(described["digest"])


def build(layout: Path | None = None) -> Path:
    """The install step's build: the stock Debian 12 root filesystem as jobplane/debian:12; a no-op once built."""
    if problem := rootfs.image_problem():
        raise RuntimeError(problem)

    def make(tmp: Path) -> None:
        build_image(rootfs.image_dir(), tmp)

    return atomic_build(layout or image_dir(), make)


class LocalRegistry(LoopbackServer):
    """A read-only OCI distribution registry on 127.0.0.1 serving repository name -> image layout (by default
    jobplane/debian, whose tag 12 is the stock Debian 12 image)."""

    name = "oci-registry"

    def __init__(self, repositories: Mapping[str, Path] | None = None, port: int = 0) -> None:
        super().__init__("127.0.0.1", port)
        self.repositories = dict(repositories) if repositories is not None else {NAME: image_dir()}

    def reference(self, name: str = f"{NAME}:{TAG}") -> str:
        """What `podman pull` takes for name (repository:tag or repository@digest) here."""
        return f"{self.address}/{name}"

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        if request.command not in ("GET", "HEAD"):
            return _error(request, 405, "UNSUPPORTED", f"{request.command}: this registry is read-only")
        path = urlsplit(request.path).path
        if path in ("/v2", "/v2/"):
            return _send(request, 200, b"{}", "application/json")
        match = re.fullmatch(r"/v2/(.+)/(manifests|blobs)/([^/]+)", path)
        layout = self.repositories.get(match.group(1)) if match else None
        if match is None or layout is None:
            return _error(request, 404, "NAME_UNKNOWN", "repository name not known to registry")
        name, kind, ref = match.groups()
        blobs = layout / "blobs" / "sha256"
        if kind == "manifests":
            try:
                manifests = json.loads((layout / "index.json").read_text())["manifests"]
            except OSError:
                manifests = []
            found = next((m for m in manifests if ref in (m["digest"], m.get("annotations", {}).get(REF_NAME))), None)
            if found is None:
                return _error(request, 404, "MANIFEST_UNKNOWN", f"manifest unknown: {name}:{ref}")
            return _send_file(request, blobs / found["digest"].removeprefix("sha256:"), found["mediaType"],
                              found["digest"])
        blob = blobs / ref.removeprefix("sha256:")
        if not DIGEST.fullmatch(ref) or not blob.is_file():
            return _error(request, 404, "BLOB_UNKNOWN", f"blob unknown to registry: {ref}")
        return _send_file(request, blob, "application/octet-stream", ref)


def _headers(request: BaseHTTPRequestHandler, status: int, length: int, content_type: str,
             digest: str | None = None) -> None:
    request.send_response(status)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(length))
    request.send_header("Docker-Distribution-API-Version", "registry/2.0")
    if digest:
        request.send_header("Docker-Content-Digest", digest)
    request.end_headers()


def _send(request: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    _headers(request, status, len(body), content_type)
    if request.command != "HEAD":
        request.wfile.write(body)


def _error(request: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
    """The distribution API's error body, which podman prints ("manifest unknown")."""
    _send(request, status, json.dumps({"errors": [{"code": code, "message": message}]}).encode(), "application/json")


def _send_file(request: BaseHTTPRequestHandler, path: Path, content_type: str, digest: str) -> None:
    """Streamed from disk: the layer is tens of MB."""
    with path.open("rb") as file:
        _headers(request, 200, os.fstat(file.fileno()).st_size, content_type, digest)
        if request.command != "HEAD":
            shutil.copyfileobj(file, request.wfile, 1 << 20)


def main(argv: list[str] | None = None) -> int:
    return install_step(argv, "jobplane.local.oci_registry build",
                        lambda: f"OCI image {NAME}:{TAG} of the stock Debian 12 image in {build()}",
                        "the local cloud's registry has no image (the container tests will skip)")


if __name__ == "__main__":
    sys.exit(main())
