"""Large uploads to GCS (the CLI's code bundle): a resumable upload in chunks, retried, never the whole file in
memory. google-cloud-storage reports no progress, so the caller hears of the bytes once they are stored."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from jobplane.clouds.gcs import GcsStore

CHUNK = 8 << 20  # a multiple of 256 KiB, as resumable uploads require


def upload_file(store: GcsStore, key: str, path: Path, progress: Callable[[int], None] | None = None) -> None:
    """Upload path to key; progress(bytes) is called with the file's size once it is stored."""
    blob = store._bucket.blob(key, chunk_size=CHUNK)
    with store._mapped(key):
        blob.upload_from_filename(str(path), content_type="application/gzip", retry=store._retry)
    if progress:
        progress(path.stat().st_size)
