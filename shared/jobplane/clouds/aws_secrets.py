"""Secrets in SSM Parameter Store, as SecureStrings under the AWS-managed key (aws/ssm).

Why Parameter Store and not Secrets Manager: a Secrets Manager secret costs $0.40 a month, so 10 secrets would add
$4.00 to a deployment whose idle cost is $1.82; standard SecureString parameters and the aws/ssm key cost nothing
(only API calls past the free throughput, which a job's start never reaches). The price is the standard tier's
4 KB value: a value is stored in pieces, base64 so any bytes survive, and read whole.

Layout, per value (`model.secrets.store_path`: the deployment's tag, the owner, the name):
  /jobplane/<tag>/<owner>/<name>/head            String {"gen": <hex>, "chunks": n}: which pieces are current
  /jobplane/<tag>/<owner>/<name>/<gen>/<i>       SecureString, the i-th piece
A set writes the new pieces, then the head, then deletes the old pieces: a reader never sees a mix, and one that
read the old head just before retries once. A job's session policy names `.../<name>/*` for each of its secrets.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets as random
from typing import Any

from botocore.exceptions import ClientError

from jobplane.clouds.base import AccessDenied
from jobplane.model.secrets import SecretInfo, SecretMissing, store_path

PIECE = 4000  # characters: under the standard tier's 4,096


def parameter_path(deployment: str, owner: str, name: str) -> str:
    return "/" + store_path(deployment, owner, name)


def resource_arn(partition: str, deployment: str, owner: str, name: str) -> str:
    """What a job's session policy grants for one secret: every parameter of it, in any region of the account
    (the job role's own grant is the account's)."""
    return f"arn:{partition}:ssm:*:*:parameter{parameter_path(deployment, owner, name)}/*"


class SsmSecrets:
    """model.secrets' store over an SSM client (the platform's, a team member's, or a job's vended one)."""

    def __init__(self, client: Any, deployment: str) -> None:
        self.ssm, self.deployment = client, deployment

    def _path(self, owner: str, name: str) -> str:
        return parameter_path(self.deployment, owner, name)

    def _call(self, operation: str, **kwargs: Any) -> Any:
        """One SSM call; AccessDenied when IAM refuses it (a job's session names only its own secrets, a team
        member writes only its team's)."""
        try:
            return getattr(self.ssm, operation)(**kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            if error.get("Code", "").startswith("AccessDenied") or error.get("Code") == "403":
                raise AccessDenied(f"ssm {operation} {kwargs.get('Name', '')}: access denied") from None
            raise

    def _read(self, name: str, decrypt: bool = False) -> str:
        return str(self._call("get_parameter", Name=name, WithDecryption=decrypt)["Parameter"]["Value"])

    def _head(self, owner: str, name: str) -> dict[str, Any] | None:
        try:
            answer = self._read(self._path(owner, name) + "/head")
        except self.ssm.exceptions.ParameterNotFound:
            return None
        head: dict[str, Any] = json.loads(answer)
        return head

    def put(self, owner: str, name: str, value: bytes) -> None:
        old = self._head(owner, name)
        gen, text = random.token_hex(4), base64.b64encode(value).decode()
        pieces = [text[i:i + PIECE] for i in range(0, len(text), PIECE)]
        base = self._path(owner, name)
        for i, piece in enumerate(pieces):
            self._call("put_parameter", Name=f"{base}/{gen}/{i}", Value=piece, Type="SecureString", Overwrite=True,
                                   Tier="Standard")
        self._call("put_parameter", Name=f"{base}/head", Value=json.dumps({"gen": gen, "chunks": len(pieces)}),
                               Type="String", Overwrite=True, Tier="Standard")
        if old is not None:
            self._drop(base, old)

    def _drop(self, base: str, head: dict[str, Any]) -> None:
        for i in range(int(head["chunks"])):
            with contextlib.suppress(self.ssm.exceptions.ParameterNotFound):
                self._call("delete_parameter", Name=f"{base}/{head['gen']}/{i}")

    def get(self, owner: str, name: str) -> bytes:
        """The value; SecretMissing if there is none. Read with whoever's client this is: a job's credentials
        reach only the secrets its session policy names (base.AccessDenied otherwise)."""
        for _ in range(2):  # a rotation between the head and its pieces: read again
            head = self._head(owner, name)
            if head is None:
                raise SecretMissing(name)
            base = self._path(owner, name)
            try:
                text = "".join(self._read(f"{base}/{head['gen']}/{i}", decrypt=True)
                               for i in range(int(head["chunks"])))
            except self.ssm.exceptions.ParameterNotFound:
                continue
            return base64.b64decode(text)
        raise SecretMissing(name)

    def list(self, owner: str | None = None) -> list[SecretInfo]:
        """Names, owners and when each was set (its head's time): never a value."""
        top = "/" + store_path(self.deployment, owner, "x").rsplit("/", 1)[0] if owner else \
            "/" + store_path(self.deployment, "x", "x").rsplit("/", 2)[0]
        found: list[SecretInfo] = []
        pages, token = [], None
        while True:  # every page: a deployment's secrets are few
            page = self._call("describe_parameters", MaxResults=50, ParameterFilters=[
                {"Key": "Path", "Option": "Recursive", "Values": [top]}], **({"NextToken": token} if token else {}))
            pages.append(page)
            token = page.get("NextToken")
            if not token:
                break
        for page in pages:
            for entry in page["Parameters"]:
                parts = entry["Name"].split("/")  # "", jobplane, tag, owner, name, head
                if len(parts) == 6 and parts[5] == "head":
                    found.append(SecretInfo(parts[3], parts[4], entry.get("LastModifiedDate")))
        return sorted(found, key=lambda s: (s.owner, s.name))

    def delete(self, owner: str, name: str) -> bool:
        head = self._head(owner, name)
        if head is None:
            return False
        base = self._path(owner, name)
        self._call("delete_parameter", Name=f"{base}/head")
        self._drop(base, head)
        return True


def ssm_secrets(region: str | None, deployment: str) -> SsmSecrets:
    """The store with this process's credentials (a person's, the platform team's)."""
    import boto3

    return SsmSecrets(boto3.client("ssm", region_name=region), deployment)
