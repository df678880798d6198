"""A linter's verdict is a function of what it reads and of its version, so the infra tests keep it by a digest of
those under jobplane.local.cache_dir()/lint (beside the kept assemblies, tests/infra/assemblies.py): a run whose
template, skip file, gate and tool a recent run saw reads that verdict instead of running the tool again (checkov and
cfn-lint: about 25 CPU seconds). Any change to one of them runs the tool."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from jobplane.local import cache_dir

CACHE = cache_dir() / "lint"
ENTRIES = 64


def digest(parts: Iterable[Path | str]) -> str:
    """Each file's name and bytes (a folder's files, sorted), each string as it is."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            files = sorted(p for p in part.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
                if part.is_dir() else [part]
            for f in files:
                h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        else:
            h.update(part.encode() + b"\0")
    return h.hexdigest()[:32]


def kept(kind: str, parts: Iterable[Path | str], run: Callable[[], Any]) -> Any:
    """run()'s JSON-able result, or the one a run with the same parts kept."""
    entry = CACHE / f"{kind}-{digest(parts)}.json"
    with contextlib.suppress(OSError, ValueError):
        found = json.loads(entry.read_text())
        os.utime(entry)
        return found
    result = run()
    with contextlib.suppress(OSError):
        CACHE.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=CACHE, suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump(result, out)
        os.replace(tmp, entry)
        for old in sorted(CACHE.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[ENTRIES:]:
            old.unlink(missing_ok=True)
    return result
