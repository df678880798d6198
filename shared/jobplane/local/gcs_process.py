"""The GCS fake (jobplane.local.fake_gcs) as a process of its own, for the local GCP cloud: the VMs' agents,
the functions and the CLI all reach it over loopback, and it shares no GIL with the instance runner.

    python -m jobplane.local.gcs_process -H 127.0.0.1 -p PORT --bucket NAME [--bucket ...]
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence

from jobplane.local.fake_gcs import FakeGcsServer


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobplane.local.gcs_process", description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    parser.add_argument("--bucket", action="append", default=[], help="a bucket to create (repeatable)")
    args = parser.parse_args(argv)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: done.set())
    with FakeGcsServer(args.host, args.port) as server:
        for bucket in args.bucket:
            server.create_bucket(bucket)
        print(f"GCS fake on {server.endpoint}: buckets {', '.join(args.bucket) or '(none)'}", flush=True)
        done.wait()


if __name__ == "__main__":
    main()
