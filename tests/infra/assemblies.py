"""A synth is a function of its inputs, so the cloud assembly the infra tests read is kept by a digest of them, under
jobplane.local.cache_dir()/synth (beside the CDK assets and mypy's cache): a run whose inputs a recent run synthesized
reads that run's assembly instead of making it again (the tests' four synths cost about 17 CPU seconds).

The inputs: the context and whether cdk-nag ran; every file of infra/, functions/ and shared/jobplane/, and cdk.json
(the stack, the code its assets bundle, the policy model it checks); tests/infra/conftest.py, which synthesizes; the
version of every installed distribution (aws-cdk-lib, cdk-nag, jsii, what the bundles pin); Python's and node's
executables. A staged asset directory is kept as a link to the directory of the CDK asset cache it copies (the
Lambda code and the agent bundles, 200 MB); the rest of the assembly is copied, its big files once for all entries.
An entry whose links do not resolve any more is synthesized again; the newest ENTRIES are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from jobplane.local import cache_dir

ROOT = Path(__file__).resolve().parents[2]
CACHE = cache_dir() / "synth"
ASSETS = cache_dir() / "cdk-assets"  # infra.aws.bundle's: what the big staged asset directories copy
ENTRIES = 24  # a clone's four configurations, for a few clones and versions on the machine
SHARED = 1 << 20  # files bigger than this are kept once under CACHE/files (their names are content hashes)


@cache
def inputs() -> str:
    """The digest of every input but the configuration."""
    h = hashlib.sha256()
    files = [p for base in ("infra", "functions", "shared/jobplane") for p in (ROOT / base).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    for path in [*sorted(files), ROOT / "cdk.json", Path(__file__).with_name("conftest.py")]:
        h.update(f"{path.relative_to(ROOT)}\0".encode() + path.read_bytes() + b"\0")
    h.update("\n".join(sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())).encode())
    # the interpreters themselves, not the clone's venv link to one: a new clone reads what another synthesized
    for exe in (os.path.realpath(sys.executable), shutil.which("node") or "no node"):
        with contextlib.suppress(OSError):
            st = os.stat(exe)
            exe += f" {st.st_size} {st.st_mtime_ns}"
        h.update(exe.encode())
    return h.hexdigest()


def synthesized(outdir: Path, context: dict[str, Any], nag: bool, synth: Callable[[Path], None]) -> None:
    """outdir holds the assembly of this configuration: a kept one's, or synth(outdir)'s, then kept."""
    entry = CACHE / hashlib.sha256(json.dumps([inputs(), context, nag], sort_keys=True).encode()).hexdigest()[:24]
    try:
        if (entry / "Jobplane.template.json").exists() and all(p.exists() for p in entry.iterdir()):
            shutil.copytree(entry, outdir, symlinks=True, dirs_exist_ok=True)
            entry.touch()
            return
    except OSError:  # evicted meanwhile by another run: synthesized here after all
        shutil.rmtree(outdir, ignore_errors=True)
        outdir.mkdir(parents=True, exist_ok=True)
    synth(outdir)
    with contextlib.suppress(OSError):
        keep(outdir, entry)


def keep(outdir: Path, entry: Path) -> None:
    """The assembly in outdir kept as entry (unless a staged directory copies none of the asset cache's)."""
    (CACHE / "files").mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{entry.name}.", dir=CACHE))
    try:
        for item in outdir.iterdir():
            if item.name.startswith("asset.") and item.is_dir() and sum(n for _, n in listing(item)) > SHARED:
                source = copied(item)
                if source is None:
                    return  # not kept: a big staged directory that copies none of the asset cache's
                (tmp / item.name).symlink_to(source, target_is_directory=True)
            elif item.is_file() and item.stat().st_size > SHARED:
                shared = CACHE / "files" / item.name
                if not shared.exists():
                    shutil.copyfile(item, shared)
                (tmp / item.name).symlink_to(shared)
            elif item.is_dir():
                shutil.copytree(item, tmp / item.name, symlinks=True)
            else:
                shutil.copy2(item, tmp / item.name)
        tmp.rename(entry)  # whole, or not at all (another run kept the same one first: ours goes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    evict()


def copied(staged: Path) -> Path | None:
    """The asset cache's directory that staged is a copy of (the same files, of the same sizes), if any."""
    mine = listing(staged)
    return next((d for d in sorted(ASSETS.glob("*")) if d.is_dir() and listing(d) == mine), None)


def listing(directory: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(directory)), p.stat().st_size) for p in directory.rglob("*") if p.is_file())


def evict() -> None:
    """The newest ENTRIES stay, and the shared files they link to."""
    entries = sorted((p for p in CACHE.iterdir() if p.is_dir() and p.name != "files" and "." not in p.name),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[ENTRIES:]:
        shutil.rmtree(old, ignore_errors=True)
    used = {os.readlink(link) for entry in entries[:ENTRIES] for link in entry.iterdir() if link.is_symlink()}
    for shared in (CACHE / "files").iterdir():
        if str(shared) not in used:
            shared.unlink(missing_ok=True)
