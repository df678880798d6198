"""The local cloud: fakes and runners for `make demo` and tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path


def install_step(argv: list[str] | None, usage: str, run: Callable[[], str], unavailable: str) -> int:
    """An install step of the Makefile for the local cloud (`python -m jobplane.local.X VERB`): run() makes what
    it makes and says so. It never fails the build: without it, the tests that need it skip, and say why."""
    args = argv if argv is not None else sys.argv[1:]
    if args != usage.split()[-1:]:
        print(f"usage: python -m {usage}", file=sys.stderr)
        return 2
    try:
        print(run())
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"{unavailable}: {exc}")
    return 0


def cache_dir() -> Path:
    """Where the local cloud keeps builds that outlive a checkout (agent bundles, images, wheels):
    $JOBPLANE_CACHE, else $XDG_CACHE_HOME/jobplane, else ~/.cache/jobplane."""
    base = os.environ.get("JOBPLANE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                     "jobplane")
    return Path(base)


@contextlib.contextmanager
def environment_over(values: Mapping[str, str]) -> Iterator[None]:
    """The process environment with these values over it while inside; each variable as it was after (unset if it
    was)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
