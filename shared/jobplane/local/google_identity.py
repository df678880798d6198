"""The local cloud's stand-in for Google as an identity issuer: an RSA key made at start-up, which signs the VMs'
identity tokens (jobplane.local.gce_metadata_server), and its certificate served on loopback in the format of
https://www.googleapis.com/oauth2/v1/certs ({key id: x509 PEM}), for the vending function to verify them with
google-auth exactly as it verifies Google's.
"""

from __future__ import annotations

import datetime
import json
import secrets
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

from jobplane.local.loopback import LoopbackServer

ISSUER = "https://accounts.google.com"
VM_SERVICE_ACCOUNT = "jobplane-vms@jobplane-local.iam.gserviceaccount.com"
TOKEN_SECONDS = 3600
CERTS_PATH = "/oauth2/v1/certs"


class LocalIdentityIssuer(LoopbackServer):
    """Signs identity tokens with a fresh key; serves its certificate at `certs_url` (once started)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID
        from google.auth import crypt

        super().__init__(host, port)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.key_id = secrets.token_hex(20)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jobplane local identity issuer")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=30)).sign(key, hashes.SHA256()))
        self.certificate = cert.public_bytes(serialization.Encoding.PEM).decode()
        # the key object itself: a PEM round trip would check the new key again (40 ms, as long as making it)
        self._signer = crypt.RSASigner(key, key_id=self.key_id)  # type: ignore[no-untyped-call]

    @property
    def certs_url(self) -> str:
        return f"http://{self.address}{CERTS_PATH}"

    def sign(self, claims: Mapping[str, Any]) -> str:
        from google.auth import jwt

        token: bytes = jwt.encode(self._signer, dict(claims))  # type: ignore[no-untyped-call]
        return token.decode()

    def vm_identity(self, *, audience: str, email: str, project: str, zone: str, name: str, instance_id: str,
                    full: bool = True) -> str:
        """The token GCE's metadata server gives a VM: Google's claims, and with format=full the VM's."""
        now = int(time.time())
        claims: dict[str, Any] = {"iss": ISSUER, "aud": audience, "azp": "1" + instance_id, "sub": "1" + instance_id,
                                  "email": email, "email_verified": True, "iat": now, "exp": now + TOKEN_SECONDS}
        if full:
            claims["google"] = {"compute_engine": {
                "project_id": project, "project_number": 123456789, "zone": zone, "instance_id": instance_id,
                "instance_name": name, "instance_creation_timestamp": now}}
        return self.sign(claims)

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        found = request.command == "GET" and request.path.split("?", 1)[0] == CERTS_PATH
        body = json.dumps({self.key_id: self.certificate} if found else {"error": "not found"}).encode()
        request.send_response(200 if found else 404)
        request.send_header("Content-Type", "application/json; charset=UTF-8")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
