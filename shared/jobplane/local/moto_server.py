"""moto's server with S3 requests applied one at a time, so conditional writes are atomic as on S3.

moto checks If-Match / If-None-Match and then writes, in two steps, so two threads of its server can both
pass the check and both "win" a compare-and-swap; and a GET racing a PUT of the same key can read a
buffer the PUT has just closed. The registry's single-writer rule rests on S3 refusing the second writer,
so the local cloud and the tests serialize moto's S3 object and bucket requests (seen before this: two
overlapping reruns both launching attempt 2 on a loaded machine).
`python -m jobplane.local.moto_server -H HOST -p PORT` runs moto's own server with this applied.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

_lock = threading.RLock()


def make_s3_atomic() -> None:
    """Patch moto's S3 request handlers (in this process) to run one at a time; idempotent."""
    from moto.s3.responses import S3Response

    for name in ("key_response", "bucket_response"):
        original = getattr(S3Response, name)
        if getattr(original, "jobplane_atomic", False):
            continue

        def serialized(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with _lock:
                return _original(self, *args, **kwargs)

        functools.update_wrapper(serialized, original)
        serialized.jobplane_atomic = True  # type: ignore[attr-defined]
        setattr(S3Response, name, serialized)


def main() -> None:
    make_s3_atomic()
    from moto.server import main as moto_main

    moto_main()


if __name__ == "__main__":
    main()
