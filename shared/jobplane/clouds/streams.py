"""What every store's file transfers share: files appear only when complete, and are read in parts."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

# Named so a checkpoint sync never uploads a download that is still in progress (it skips *.tmp).
PARTIAL_SUFFIX = ".download.tmp"


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A fresh temporary file beside path, renamed over path when the block succeeds, deleted otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX)
    os.close(fd)
    try:
        yield Path(name)
        os.replace(name, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(name)
        raise


def read_parts(path: Path, part_size: int) -> Iterator[bytes]:
    """The file's bytes in pieces of at most part_size (one empty piece for an empty file)."""
    with path.open("rb") as f:
        piece = f.read(part_size)
        yield piece
        while piece:
            piece = f.read(part_size)
            if piece:
                yield piece
