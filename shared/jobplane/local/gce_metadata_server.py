"""A fake GCE metadata server for one VM (stdlib HTTP on loopback), for the local cloud's VMs and tests.

It answers the way the real one does where the agent depends on it: every request needs the header
`Metadata-Flavor: Google` (403 otherwise) and every answer carries it; missing keys are 404; a trailing
slash lists a directory; `instance/preempted` honours `wait_for_change=true` (with `last_etag` and
`timeout_sec`) so a watcher blocks until the preemption notice instead of polling. With an issuer,
`instance/service-accounts/default/identity?audience=...[&format=full]` answers an identity token signed by it
(jobplane.local.google_identity), with the claims GCE puts there; without one, 404.
Point the client at it with GCE_METADATA_HOST=<host:port>.
"""

from __future__ import annotations

import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from jobplane.local.google_identity import VM_SERVICE_ACCOUNT, LocalIdentityIssuer
from jobplane.local.loopback import LoopbackServer

# The VM's own access token: the GCS fake recognises it and lets it read only the agent bundles
# (FakeGcsServer's vm_reads), as the VM's service account may on GCP.
VM_ACCESS_TOKEN = "local-vm-token"
_IDENTITY = "instance/service-accounts/default/identity"
_PREFIX = "/computeMetadata/v1/"
_MAX_WAIT_S = 60.0


def _etag(value: str) -> str:
    return hashlib.sha1(value.encode()).hexdigest()[:16]


class FakeGceMetadataServer(LoopbackServer):
    def __init__(
        self,
        *,
        instance_id: str = "1000000001",
        name: str = "vm-0001",
        zone: str = "us-central1-a",
        project: str = "jobplane-local",
        attributes: dict[str, str] | None = None,
        ip: str = "10.0.0.2",
        machine_type: str = "e2-small",
        preempted: bool = False,
        issuer: LocalIdentityIssuer | None = None,
        service_account: str = VM_SERVICE_ACCOUNT,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.attributes = dict(attributes or {})
        self.issuer, self.service_account = issuer, service_account
        self._values = {
            "instance/id": instance_id,
            "instance/name": name,
            "instance/hostname": f"{name}.{zone}.c.{project}.internal",
            "instance/zone": f"projects/123456789/zones/{zone}",
            "instance/machine-type": f"projects/123456789/machineTypes/{machine_type}",
            "instance/network-interfaces/0/ip": ip,
            "project/project-id": project,
            # the VM's service account token, which a VM uses with the GCS JSON API (the bootstrap does)
            "instance/service-accounts/default/email": service_account,
            "instance/service-accounts/default/token": f'{{"access_token": "{VM_ACCESS_TOKEN}", "expires_in": 3599, '
                                                       '"token_type": "Bearer"}',
        }
        self._preempted = preempted
        self._changed = threading.Condition()
        self._stopping = False
        super().__init__(host, port)

    # -- lifecycle -------------------------------------------------------------------------------

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()  # release blocked watchers so shutdown does not wait for them
        super().stop()
        self._stopping = False

    @property
    def host(self) -> str:
        """host:port, the form GCE_METADATA_HOST takes."""
        return self.address

    @property
    def base_url(self) -> str:
        return f"http://{self.host}{_PREFIX}"

    def set_preempted(self) -> None:
        """The ~30 s Spot notice: instance/preempted turns TRUE and blocked watchers wake up."""
        with self._changed:
            self._preempted = True
            self._changed.notify_all()

    # -- HTTP ------------------------------------------------------------------------------------

    def _identity(self, args: dict[str, str]) -> str | None:
        if self.issuer is None or not args.get("audience"):
            return None  # GCE answers 400 without an audience; 404 is as good a no here
        return self.issuer.vm_identity(
            audience=args["audience"], email=self.service_account, project=self._values["project/project-id"],
            zone=self._values["instance/zone"].rsplit("/", 1)[-1], name=self._values["instance/name"],
            instance_id=self._values["instance/id"], full=args.get("format") == "full")

    def _value(self, path: str) -> str | None:
        if path == "instance/preempted":
            return "TRUE" if self._preempted else "FALSE"
        if path == "instance/attributes/":
            return "".join(f"{k}\n" for k in sorted(self.attributes))
        if path.startswith("instance/attributes/"):
            return self.attributes.get(path.removeprefix("instance/attributes/"))
        return self._values.get(path)

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        args = {k: v[-1] for k, v in parse_qs(url.query).items()}
        status, value = 404, "not found"
        if handler.headers.get("Metadata-Flavor") != "Google" or handler.headers.get("X-Forwarded-For"):
            status, value = 403, "Missing required header Metadata-Flavor: Google"
        elif url.path.startswith(_PREFIX):
            path = url.path.removeprefix(_PREFIX)
            if args.get("wait_for_change") == "true" and path == "instance/preempted":
                self._wait(args)
            found = self._identity(args) if path == _IDENTITY else self._value(path)
            if found is not None:
                status, value = 200, found
        data = value.encode()
        handler.send_response(status)
        handler.send_header("Metadata-Flavor", "Google")
        handler.send_header("Content-Type", "application/text")
        handler.send_header("ETag", _etag(value))
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _wait(self, args: dict[str, str]) -> None:
        """Block until the value differs from last_etag (or from now, without one) or the timeout."""
        timeout = min(float(args.get("timeout_sec", _MAX_WAIT_S)), _MAX_WAIT_S)
        deadline = time.monotonic() + timeout
        with self._changed:
            seen = args.get("last_etag") or _etag(self._value("instance/preempted") or "")
            while _etag(self._value("instance/preempted") or "") == seen and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(left)
