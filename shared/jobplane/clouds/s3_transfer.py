"""The CLI's code-bundle upload, kept for its current caller: every store now streams files itself
(ObjectStore.upload_file: multipart, parallel, retried), so callers can use that on any cloud directly."""

from __future__ import annotations

from pathlib import Path

from jobplane.clouds.base import Progress
from jobplane.clouds.s3 import S3Store


def upload_file(store: S3Store, key: str, path: Path, progress: Progress | None = None) -> None:
    """Upload path to key; progress(bytes_sent_since_last_call) is called as parts go out."""
    store.upload_file(key, path, "application/gzip", progress)
