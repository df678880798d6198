"""moto's server with S3 conditional writes made atomic, as they are on S3.

moto checks If-Match / If-None-Match and then writes, in two steps, so two threads of its server can both
pass the check and both "win" a compare-and-swap. The registry's single-writer rule rests on S3 refusing
the second one, so the local cloud and the tests serialize moto's PutObject (seen: two overlapping reruns
both launching attempt 2 on a loaded machine). `python -m jobplane.local.moto_server -H HOST -p PORT`.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()


def make_conditional_puts_atomic() -> None:
    """Patch moto's S3 PutObject handler (in this process) to run one at a time; idempotent."""
    from moto.s3.responses import S3Response

    original = S3Response.put_object
    if getattr(original, "jobplane_atomic", False):
        return

    def put_object(self: Any) -> Any:
        with _lock:
            return original(self)

    put_object.jobplane_atomic = True  # type: ignore[attr-defined]
    S3Response.put_object = put_object  # type: ignore[method-assign]


def main() -> None:
    make_conditional_puts_atomic()
    from moto.server import main as moto_main

    moto_main()


if __name__ == "__main__":
    main()
