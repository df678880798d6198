"""What changed in the local cloud's emulators since the trigger loop last looked: a count per area of the writes and
deletes each has made, so an idle loop skips listings that would find nothing new.

The cloud delivers object-created events itself (EventBridge, Eventarc); the local cloud finds them by listing, every
tick (jobplane.local.triggers). moto's server (jobplane.local.moto_server) and the GCS fake (jobplane.local.fake_gcs)
count what changes in them, an area at a time: an object area is a bucket's top-level folder (`<bucket>/queue`,
`<bucket>/jobs`), a service's calls that change something are its own area (`ec2`, `sns`, `sqs`), and a change they
cannot place is ANY (all areas of a bucket: `<bucket>/*`). A server answers its counts at PATH.

A pass reads the counts first, lists only the areas they say changed since the last pass that completed, and
consumes them only once it completed: a server counts a change after it is made, so a write made while a pass lists
is counted after that pass read the counts, and the next pass lists its area again. Counts that cannot be read mean
every area changed.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

PATH = "/_jobplane/changes"  # GET: the counts as a JSON object (no bucket name can start with "_")
ANY = "*"

Counts = Mapping[str, int]


def object_area(bucket: str, key: str) -> str:
    """The area of a key (or a key prefix) of the bucket: its top-level folder; a prefix that does not name one
    (no "/") could cover several, so it is the whole bucket's."""
    folder, slash, _ = key.partition("/")
    return f"{bucket}/{folder if slash else ANY}"


class Changes:
    """A server's counts (thread-safe). Count a change once it is made, never before: a reader that sees the old
    count must find the change at its next look."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def note(self, area: str) -> None:
        with self._lock:
            self._counts[area] = self._counts.get(area, 0) + 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def body(self) -> bytes:
        return json.dumps(self.counts()).encode()


class Look:
    """One pass's view: the counts read at its start against those the last completed pass consumed."""

    def __init__(self, watch: Watch, now: dict[str, int] | None) -> None:
        self.watch, self.now = watch, now

    def changed(self, area: str) -> bool:
        """Whether the area may have changed since the last completed pass (always, on a first pass or unknown
        counts). An object area changed too when its whole bucket did."""
        seen = self.watch.seen
        if self.now is None or seen is None:
            return True
        bucket, slash, _ = area.partition("/")
        areas = (area, ANY, f"{bucket}/{ANY}") if slash else (area, ANY)
        return any(self.now.get(a, 0) != seen.get(a, 0) for a in areas)

    def objects(self, bucket: str, prefix: str) -> bool:
        """Whether a listing of this prefix of the bucket may find something new."""
        return self.changed(object_area(bucket, prefix))

    def done(self) -> None:
        """The pass completed: what it read is consumed."""
        if self.now is not None:
            self.watch.seen = self.now


class Watch:
    """The trigger loop's side: read is a server's counts (None: no server counts, every area always changed)."""

    def __init__(self, read: Callable[[], Counts] | None = None) -> None:
        self.read = read
        self.seen: dict[str, int] | None = None

    def look(self) -> Look:
        if self.read is None:
            return Look(self, None)
        try:
            now = dict(self.read())
        except (OSError, ValueError, http.client.HTTPException):  # unknown: list everything, as before counts
            return Look(self, None)
        return Look(self, now)


class HttpCounts:
    """A server's counts read at its PATH over one kept connection (the local cloud's servers keep connections)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.timeout = parts.hostname or "127.0.0.1", parts.port, timeout
        self.conn: http.client.HTTPConnection | None = None

    def __call__(self) -> Counts:
        for attempt in (1, 2):  # a kept connection the server dropped (its idle timeout): once more, on a new one
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request("GET", PATH)
                response = self.conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
                continue
            if response.status != 200:
                raise ValueError(f"{PATH}: HTTP {response.status}")
            counts = json.loads(body)
            if not isinstance(counts, dict):
                raise ValueError(f"{PATH}: not an object")
            return {str(k): int(v) for k, v in counts.items()}
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
