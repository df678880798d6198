"""The local cloud: fakes and runners for `make demo` and tests."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where the local cloud keeps builds that outlive a checkout (agent bundles, images, wheels):
    $JOBPLANE_CACHE, else $XDG_CACHE_HOME/jobplane, else ~/.cache/jobplane."""
    base = os.environ.get("JOBPLANE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                     "jobplane")
    return Path(base)
