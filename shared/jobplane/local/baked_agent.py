"""`jobplane local up --baked-agent`: the local VMs boot as from a custom image baked with the deployment's agent.

Each VM's agent home (/opt/jobplane) holds the agent bundle unpacked, its modules compiled, and the bootstrap's
marker naming the bundle's sha256, so the bootstrap finds it there and skips the download, the check and the
unpack (jobplane.boot.bootstrap.BUNDLE_MARKER), as it would on an image made from a VM that had booted. The tree is
unpacked once per bundle into the cache: a VM on this machine gets the marker and its site/ as a link to the tree's
(one entry to make and later delete, not 1,200: the agent's files are only read), a VM in an image the tree
hard-linked into its layer (a link out of it would not resolve inside). A boot costs a few milliseconds instead of a
download, a 30 MB unpack and compiling the agent's imports (about 2 CPU seconds). Without the flag every VM runs the
whole bootstrap, as on a stock image.
"""

from __future__ import annotations

import compileall
import os
import shutil
import tarfile
from pathlib import Path

from jobplane.boot.bootstrap import BUNDLE_MARKER
from jobplane.boot.bundling import atomic_build


def unpacked(bundle: Path, sha256: str, cache: Path) -> Path:
    """The bundle unpacked (site/...) with its modules compiled and the marker, once per bundle under cache."""

    def build(tmp: Path) -> None:
        with tarfile.open(bundle) as tar:
            tar.extractall(tmp, filter="data")
        compileall.compile_dir(str(tmp), quiet=2, workers=0)
        (tmp / BUNDLE_MARKER).write_text(sha256)

    return atomic_build(cache / "baked-agents" / sha256[:16], build)


def bake(tree: Path, home: Path) -> None:
    """The agent home in a VM's image layer: a copy of the tree made of hard links (its files are only read)."""
    shutil.copytree(tree, home, copy_function=os.link, dirs_exist_ok=True)


def bake_on_host(tree: Path, home: Path) -> None:
    """The agent home of a VM on this machine: the tree's marker, and its site/ a link to the tree's."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tree / BUNDLE_MARKER, home / BUNDLE_MARKER)
    (home / "site").symlink_to(tree / "site", target_is_directory=True)
