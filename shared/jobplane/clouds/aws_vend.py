"""Job-scoped credentials on AWS, both ends: the agent proves who it is and gets its job's credentials
(`vended_s3_client`), and the vending function checks the proof and mints them (`VendAws`).

The proof is an sts:GetCallerIdentity request the agent signs with its instance role's credentials (IMDS) but does
not send; the function sends it to STS at the endpoint the function chooses, and STS answers with the signer's
identity: `arn:aws:sts::<account>:assumed-role/<VM role>/<instance id>` (EC2 names the instance role's session
after the instance). The signed X-Jobplane-Deployment header binds the proof to one deployment, so a proof made
for anything else (another deployment's function, a service that replays such proofs) is useless here.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from datetime import UTC
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.etree import ElementTree

import boto3
import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import CredentialProvider, Credentials, ReadOnlyCredentials, RefreshableCredentials
from botocore.exceptions import ClientError

from jobplane.clouds.base import CredentialsRefused, ProofRejected, VendUnavailable
from jobplane.clouds.s3 import s3_client
from jobplane.model.keys import of_job

log = logging.getLogger(__name__)

DEPLOYMENT_HEADER = "X-Jobplane-Deployment"
PROOF_BODY = "Action=GetCallerIdentity&Version=2011-06-15"
_FORM = "application/x-www-form-urlencoded; charset=utf-8"
VEND_TRIES = 4  # a vend request that fails for a transient reason: tried this often, up to 1 s, 2 s, 4 s apart
TIMEOUT = 30.0
# botocore asks IMDS for the instance's credentials once, with a 1 s timeout, and takes no answer for "none": a VM
# that has just booted, or a busy machine, can miss that (seen on a loaded local cloud). The agent waits longer.
IMDS_PATIENCE = {"metadata_service_timeout": 2, "metadata_service_num_attempts": 5}
# Neither the proof's replay nor the vend request goes through an HTTP(S)_PROXY: both carry credentials.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def sts_endpoint(region: str, session: botocore.session.Session | None = None) -> str:
    """STS's URL for this region as botocore resolves it: AWS_ENDPOINT_URL(_STS) (moto, the local cloud), else
    the regional endpoint. Both ends resolve it the same way, so the proof is signed for the host it is sent to."""
    client = (session or botocore.session.get_session()).create_client("sts", region_name=region)
    return str(client.meta.endpoint_url).rstrip("/") + "/"


# ---- the proof ------------------------------------------------------------------------------------------
def proof(credentials: Credentials | ReadOnlyCredentials, region: str, deployment: str,
          endpoint: str | None = None) -> dict[str, Any]:
    """A signed, unsent sts:GetCallerIdentity request: {"method", "url", "headers", "body"}."""
    url = endpoint or sts_endpoint(region)
    frozen = credentials.get_frozen_credentials() if hasattr(credentials, "get_frozen_credentials") else credentials
    request = AWSRequest("POST", url, data=PROOF_BODY,
                         headers={"Content-Type": _FORM, DEPLOYMENT_HEADER: deployment})
    SigV4Auth(frozen, "sts", region).add_auth(request)
    headers = {k: str(v) for k, v in request.headers.items()}
    headers["Host"] = urlsplit(url).netloc  # signed (SigV4 always signs host); the verifier never forwards it
    return {"method": "POST", "url": url, "headers": headers, "body": PROOF_BODY}


def _header(headers: Mapping[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


def _signed_headers(authorization: str) -> list[str]:
    part = authorization.partition("SignedHeaders=")[2].partition(",")[0]
    return [h.strip().lower() for h in part.split(";") if h.strip()]


def checked(body: Any, deployment: str) -> dict[str, str]:
    """The headers to replay, once the proof is shown to be a GetCallerIdentity signed for `deployment`; raises
    ProofRejected saying what is wrong. The proof's URL and Host are never used."""
    if not isinstance(body, dict):
        raise ProofRejected("proof: not an object")
    headers = body.get("headers")
    if body.get("method") != "POST" or not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ProofRejected("proof: method must be POST and headers an object of strings")
    if not isinstance(body.get("body"), str) or parse_qs(body["body"], strict_parsing=True) != parse_qs(PROOF_BODY):
        raise ProofRejected("proof: the body must be exactly " + PROOF_BODY)
    authorization = _header(headers, "Authorization") or ""
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        raise ProofRejected("proof: not signed with SigV4 (no Authorization header)")
    signed = _signed_headers(authorization)
    if DEPLOYMENT_HEADER.lower() not in signed or "host" not in signed:
        raise ProofRejected(f"proof: {DEPLOYMENT_HEADER} and Host must be signed")
    if _header(headers, DEPLOYMENT_HEADER) != deployment:
        raise ProofRejected(f"proof: made for deployment {_header(headers, DEPLOYMENT_HEADER)!r}, not this one")
    return {k: v for k, v in headers.items() if k.lower() in signed and k.lower() != "host"} | {
        "Authorization": authorization}


def caller_arn(body: Any, deployment: str, endpoint: str, timeout: float = 10.0) -> str:
    """Send the proof to STS at `endpoint` and return the ARN STS says signed it. Raises ProofRejected (a bad or
    foreign proof, a signature STS refuses) or VendUnavailable (STS did not answer)."""
    headers = checked(body, deployment)
    request = urllib.request.Request(endpoint, data=PROOF_BODY.encode(), method="POST", headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:300]
        if err.code >= 500:
            raise VendUnavailable(f"STS answered {err.code}: {detail}") from None
        raise ProofRejected(f"STS refused the proof ({err.code}): {_error_code(detail)}") from None
    except (urllib.error.URLError, OSError) as err:
        raise VendUnavailable(f"STS at {endpoint}: {err}") from None
    arn = _xml_value(text, "Arn")
    if not arn:
        raise ProofRejected(f"STS's answer names no caller: {text[:200]!r}")
    return arn


def _xml_value(text: str, name: str) -> str | None:
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        return None
    return next((el.text for el in root.iter() if el.tag.rsplit("}", 1)[-1] == name and el.text), None)


def _error_code(text: str) -> str:
    return _xml_value(text, "Code") or text[:120]


# ---- the function's other AWS calls -----------------------------------------------------------------
class VendAws:
    """What the vending function asks AWS besides the proof: the instance's tags, and the job role's session."""

    def __init__(self, region: str, deployment: str, *, ec2: Any = None, sts: Any = None) -> None:
        self.region, self.deployment = region, deployment
        self.ec2 = ec2 or boto3.client("ec2", region_name=region)
        self.sts = sts or boto3.client("sts", region_name=region)
        self.endpoint = str(self.sts.meta.endpoint_url).rstrip("/") + "/"

    def caller_arn(self, body: Any) -> str:
        return caller_arn(body, self.deployment, self.endpoint)

    def instance_tags(self, instance_id: str) -> dict[str, str] | None:
        """The instance's tags; None when EC2 does not know it (in this account and region)."""
        try:
            found = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")).startswith("InvalidInstanceID"):
                return None
            raise
        instances = [i for r in found for i in r["Instances"] if i["InstanceId"] == instance_id]
        return {t["Key"]: t["Value"] for t in instances[0].get("Tags", [])} if instances else None

    def credentials(self, role_arn: str, session_name: str, policy: str, seconds: int) -> dict[str, str]:
        """AssumeRole with the session policy: {AccessKeyId, SecretAccessKey, SessionToken, Expiration}."""
        creds = self.sts.assume_role(RoleArn=role_arn, RoleSessionName=session_name, Policy=policy,
                                     DurationSeconds=seconds)["Credentials"]
        return {"AccessKeyId": creds["AccessKeyId"], "SecretAccessKey": creds["SecretAccessKey"],
                "SessionToken": creds["SessionToken"],
                "Expiration": creds["Expiration"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


# ---- the agent's end --------------------------------------------------------------------------------
class _Vend:
    """Fetches the job's credentials from the vending function, signing each request (SigV4, service "lambda")
    with the instance role's current credentials; botocore calls it again before they expire."""

    def __init__(self, instance: Credentials, region: str, url: str, job_id: str, attempt: int, deployment: str,
                 endpoint: str) -> None:
        self.instance, self.region, self.url = instance, region, url
        self.job_id, self.attempt, self.deployment, self.endpoint = job_id, attempt, deployment, endpoint
        self.lock = threading.Lock()

    def __call__(self) -> dict[str, str]:
        with self.lock:
            frozen = self.instance.get_frozen_credentials()
            body = json.dumps({"job_id": self.job_id, "attempt": self.attempt,
                               "proof": proof(frozen, self.region, self.deployment, self.endpoint)})
            last: Exception | None = None
            for attempt in range(VEND_TRIES):
                if attempt:
                    time.sleep(2 ** (attempt - 1) * random.uniform(0.5, 1))  # jittered: a job's nodes ask at once
                try:
                    return self._once(frozen, body)
                except VendUnavailable as exc:
                    last = exc
                    log.warning("credential vending failed (%s); trying again", exc)
            raise VendUnavailable(f"the vending function at {self.url} did not answer after {VEND_TRIES} tries: "
                                  f"{last}")

    def _once(self, frozen: ReadOnlyCredentials, body: str) -> dict[str, str]:
        request = AWSRequest("POST", self.url, data=body, headers={"Content-Type": "application/json"})
        SigV4Auth(frozen, "lambda", self.region).add_auth(request)
        http = urllib.request.Request(self.url, data=body.encode(), method="POST",
                                      headers={k: str(v) for k, v in request.headers.items()})
        try:
            with _OPENER.open(http, timeout=TIMEOUT) as response:
                answer = json.loads(response.read().decode())
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")
            if err.code == 403:
                try:
                    why = json.loads(text).get("refused") or text
                except ValueError:
                    why = text  # the function URL itself refused the signature (AWS's own 403)
                raise CredentialsRefused(str(why)[:500]) from None
            if err.code >= 500 or err.code == 429:
                raise VendUnavailable(f"HTTP {err.code}: {text[:200]}") from None
            raise RuntimeError(f"the vending function refused the request: HTTP {err.code}: {text[:300]}") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise VendUnavailable(f"{type(err).__name__}: {err}") from None
        return {"access_key": answer["AccessKeyId"], "secret_key": answer["SecretAccessKey"],
                "token": answer["SessionToken"], "expiry_time": answer["Expiration"]}


class _VendedProvider(CredentialProvider):  # type: ignore[misc]
    METHOD = "jobplane-vend"
    CANONICAL_NAME = "jobplane-vend"

    def __init__(self, fetch: _Vend) -> None:
        self.fetch = fetch

    def load(self) -> RefreshableCredentials:
        return RefreshableCredentials.create_from_metadata(self.fetch(), self.fetch, self.METHOD)


def vended_session(region: str, vend_url: str, job_id: str, attempt: int, deployment: str) -> Any:
    """A boto3 session whose credentials are the job's, from the vending function, refreshed before they
    expire. The instance's own credentials (the default chain: IMDS on EC2) only sign the requests for them."""
    instance_session = botocore.session.get_session()
    for name, least in IMDS_PATIENCE.items():
        if float(instance_session.get_config_variable(name)) < least:
            instance_session.set_config_variable(name, least)
    instance = instance_session.get_credentials()
    if instance is None:
        raise RuntimeError("no instance credentials (IMDS) to ask the vending function with")
    fetch = _Vend(instance, region, vend_url, job_id, attempt, deployment, sts_endpoint(region, instance_session))
    session = botocore.session.get_session()
    session.register_component("data_loader", instance_session.get_component("data_loader"))  # parsed once
    session.get_component("credential_provider").insert_before("env", _VendedProvider(fetch))
    return boto3.Session(botocore_session=session, region_name=region)


def vended_s3_client(region: str, vend_url: str, job_id: str, attempt: int, deployment: str,
                     session: Any = None) -> Any:
    """The agent's S3 client with its job's credentials (see vended_session). A refusal raises CredentialsRefused
    from the call that needed new credentials; a vending function that does not answer, VendUnavailable.

    A GET or HEAD of a missing key under the job's own prefixes reads as missing (404), as with the instance
    role before: S3 answers 403 instead when the caller may not list the whole bucket, and these credentials may
    list only the job's prefixes."""
    client = s3_client(region, session or vended_session(region, vend_url, job_id, attempt, deployment))
    root = deployment.partition("/")[2]
    missing = _MissingNotForbidden(lambda key: of_job(key, root, job_id))
    for operation in ("GetObject", "HeadObject"):
        client.meta.events.register(f"before-parameter-build.s3.{operation}", missing.remember_key)
        client.meta.events.register(f"after-call.s3.{operation}", missing)
    return client


_KEY = "jobplane_key"  # where the request context keeps the key asked for


class _MissingNotForbidden:
    """Turns S3's 403 AccessDenied for one of the job's own keys (`own`) into the 404 it stands for."""

    def __init__(self, own: Callable[[str], bool]) -> None:
        self.own = own

    @staticmethod
    def remember_key(params: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        context[_KEY] = str(params.get("Key", ""))

    def __call__(self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        key = str(context.get(_KEY, ""))
        error = parsed.get("Error", {})
        if (http_response.status_code == 403 and error.get("Code") in ("AccessDenied", "403")
                and self.own(key)):
            parsed["Error"] = {**error, "Code": "NoSuchKey", "Message": f"{key} (403 for a missing key)"}
            parsed.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = 404

