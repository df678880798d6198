"""A package index on loopback for the local cloud's instances (PEP 503 simple API over a wheel directory).

Jobs install their requirements.txt the way they do on a VM, with uv, but the local cloud never lets an
instance reach past loopback: its instances get UV_INDEX_URL / PIP_INDEX_URL pointing here, and this index
serves only the wheels an install step put in the cache (`python -m jobplane.local.package_index fill`:
numpy, tensorboardX (with protobuf) and the pip/setuptools/wheel that `uv venv --seed` installs, for the Debian
image's Python).
"""

from __future__ import annotations

import hashlib
import html
import re
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote

from jobplane.boot.bundling import PLATFORMS, host_architecture
from jobplane.local import cache_dir, install_step
from jobplane.local.loopback import LoopbackServer
from jobplane.local.rootfs import PYTHON

WHEELS = ("numpy", "pip", "setuptools", "wheel", "tensorboardx", "protobuf")


def wheel_dir() -> Path:
    return cache_dir() / "wheels" / f"cp{PYTHON.replace('.', '')}-{host_architecture()}"


def project(filename: str) -> str:
    """A wheel's normalized project name (PEP 503): numpy-2.3.0-cp311-... -> numpy."""
    return re.sub(r"[-_.]+", "-", filename.split("-", 1)[0]).lower()


class PackageIndex(LoopbackServer):
    name = "package-index"

    def __init__(self, directory: Path | None = None) -> None:
        super().__init__()
        self.directory = directory or wheel_dir()

    @property
    def url(self) -> str:
        return f"http://{self.address}/simple/"

    def _wheels(self) -> dict[str, list[Path]]:
        found: dict[str, list[Path]] = {}
        for path in sorted(self.directory.glob("*.whl")) if self.directory.is_dir() else []:
            found.setdefault(project(path.name), []).append(path)
        return found

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        path = unquote(request.path.split("?")[0])
        wheels = self._wheels()
        if path == "/simple/":
            return _reply(request, _page("".join(f'<a href="/simple/{p}/">{p}</a>\n' for p in wheels)))
        if m := re.fullmatch(r"/simple/([^/]+)/?", path):
            files = wheels.get(re.sub(r"[-_.]+", "-", m.group(1)).lower())
            if files is None:
                return _reply(request, b"not here: this index serves only the local cloud's cached wheels", 404)
            links = "".join(f'<a href="/files/{html.escape(f.name)}#sha256={_sha256(f)}">{html.escape(f.name)}</a>\n'
                            for f in files)
            return _reply(request, _page(links))
        if m := re.fullmatch(r"/files/([^/]+\.whl)", path):
            wheel = self.directory / m.group(1)
            if wheel.is_file():
                return _reply(request, wheel.read_bytes(), content_type="application/octet-stream")
        return _reply(request, b"not found", 404)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _page(body: str) -> bytes:
    return f"<!DOCTYPE html>\n<html><body>\n{body}</body></html>\n".encode()


def _reply(request: BaseHTTPRequestHandler, data: bytes, status: int = 200, content_type: str = "text/html") -> None:
    request.send_response(status)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    if request.command != "HEAD":
        request.wfile.write(data)


def fill(directory: Path | None = None) -> Path:
    """The install step: download the wheels (from PyPI, once) for the Debian image's Python and this arch."""
    directory = directory or wheel_dir()
    if all(any(directory.glob(f"{name}-*.whl")) for name in WHEELS):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-qq", "--disable-pip-version-check", "--dest",
                    str(directory), "--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON,
                    "--platform", PLATFORMS[host_architecture()], *WHEELS], check=True, stdout=subprocess.DEVNULL)
    return directory


def main(argv: list[str] | None = None) -> int:
    return install_step(argv, "jobplane.local.package_index fill",
                        lambda: f"wheels for the local cloud's package index in {fill()}",
                        "the local cloud's package index stays empty (its requirements.txt scenario will skip)")


if __name__ == "__main__":
    sys.exit(main())
