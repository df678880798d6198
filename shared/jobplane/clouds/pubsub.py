"""Notifier over a Pub/Sub topic, through its REST API with google-auth (already a dependency of the GCS
client): the functions need one publish per ended job, not google-cloud-pubsub's gRPC client and its import
time. The message's data is the notice as JSON; event, job_id, state and owner are attributes too, so
subscriptions can filter on them.

An emulator (host:port, what PUBSUB_EMULATOR_HOST names for Google's own clients) is reached over plain HTTP
without credentials.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from jobplane.clouds.base import Notice

API = "https://pubsub.googleapis.com"
SCOPES = ["https://www.googleapis.com/auth/pubsub"]
TIMEOUT_S = 30


class PubSubError(Exception):
    pass


class PubSubNotifier:
    def __init__(self, topic: str, *, session: Any = None, endpoint: str | None = None,
                 emulator: str | None = None) -> None:
        """topic: projects/<project>/topics/<name>; endpoint: an authenticated API elsewhere (tests);
        emulator: host:port of an emulator, reached anonymously."""
        if not topic.startswith("projects/") or "/topics/" not in topic:
            raise ValueError(f"{topic!r} is not a Pub/Sub topic (projects/<project>/topics/<name>)")
        self.topic = topic
        self.endpoint = (endpoint or (f"http://{emulator}" if emulator else API)).rstrip("/")
        self._session = session
        self._anonymous = bool(emulator) and endpoint is None

    @property
    def session(self) -> Any:
        if self._session is None:
            import requests

            if self._anonymous:
                self._session = requests.Session()
            else:
                import google.auth
                from google.auth.transport.requests import AuthorizedSession

                credentials, _ = google.auth.default(scopes=SCOPES)
                self._session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
        return self._session

    def publish(self, notice: Notice) -> None:
        data = json.dumps({**notice.data, "subject": notice.subject, "text": notice.text}, default=str)
        attributes = {name: str(notice.data[name]) for name in ("event", "job_id", "state", "owner")
                      if notice.data.get(name)}
        body = {"messages": [{"data": base64.b64encode(data.encode()).decode(), "attributes": attributes}]}
        resp = self.session.post(f"{self.endpoint}/v1/{self.topic}:publish", json=body, timeout=TIMEOUT_S)
        if resp.status_code != 200:
            raise PubSubError(f"publish to {self.topic}: HTTP {resp.status_code} {resp.text[:300]}")
        ids = resp.json().get("messageIds") or []
        if len(ids) != 1:
            raise PubSubError(f"publish to {self.topic}: expected one message id, got {ids!r}")
