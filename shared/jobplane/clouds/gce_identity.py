"""Which Compute Engine VM is calling: a Google-signed identity token from its metadata server
(`instance/service-accounts/default/identity?audience=...&format=full`), verified with google-auth against
Google's certificates, for one audience, issued by Google to one service account.

The token's `google.compute_engine` claims name the VM (project, zone, name and numeric id); Google writes
them, so a VM cannot claim to be another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"  # google.oauth2.id_token's default
ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
CLOCK_SKEW_S = 10


class NotProven(Exception):
    """The token proves nothing: a bad signature, another audience, issuer or service account, expired, or
    no Compute Engine claims."""


@dataclass(frozen=True)
class ProvenVm:
    project: str
    zone: str
    name: str
    numeric_id: str  # GCE's instance id, which a re-created VM of the same name does not share

    @property
    def instance_id(self) -> str:
        """zone/name: the id the Compute adapter and job records use."""
        return f"{self.zone}/{self.name}"


def proven_vm(claims: Mapping[str, Any], *, service_account: str) -> ProvenVm:
    """The VM a verified token's claims name, if Google issued it to `service_account`."""
    if claims.get("iss") not in ISSUERS:
        raise NotProven(f"issuer {claims.get('iss')!r} is not Google's")
    if claims.get("email") != service_account or claims.get("email_verified") is False:
        raise NotProven(f"the token is {claims.get('email')!r}'s, not the job VMs' service account")
    gce = claims.get("google", {}).get("compute_engine") if isinstance(claims.get("google"), dict) else None
    fields = ("project_id", "zone", "instance_name", "instance_id")
    if not isinstance(gce, dict) or not all(isinstance(gce.get(f), str) and gce[f] for f in fields):
        raise NotProven("no Compute Engine claims (ask the metadata server with format=full)")
    return ProvenVm(gce["project_id"], gce["zone"], gce["instance_name"], gce["instance_id"])


def verify(token: str, *, audience: str, service_account: str, certs_url: str = GOOGLE_CERTS_URL) -> ProvenVm:
    """Check the token's signature (the keys at certs_url), expiry and audience, then its issuer and account."""
    from google.auth import exceptions
    from google.auth.transport.requests import Request
    from google.oauth2 import id_token

    try:
        claims = id_token.verify_token(token, Request(), audience=audience, certs_url=certs_url,
                                       clock_skew_in_seconds=CLOCK_SKEW_S)
    except exceptions.TransportError:
        raise  # the certificates could not be fetched: our problem, not the caller's
    except (ValueError, exceptions.GoogleAuthError) as err:  # signature, expiry, audience, malformed
        raise NotProven(str(err)) from err
    return proven_vm(claims, service_account=service_account)
