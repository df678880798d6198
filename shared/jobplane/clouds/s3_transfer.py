"""Large uploads to S3 with progress (the CLI's code bundle): boto3's managed, multipart-capable transfer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from jobplane.clouds.s3 import S3Store


def upload_file(store: S3Store, key: str, path: Path, progress: Callable[[int], None] | None = None) -> None:
    """Upload path to key; progress(bytes_sent_since_last_call) is called as parts go out."""
    store.client.upload_file(str(path), store.bucket, key, Callback=progress,
                             ExtraArgs={"ContentType": "application/gzip"})
