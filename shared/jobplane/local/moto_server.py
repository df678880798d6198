"""moto's server with the changes the local cloud and the tests need, applied in its process.

- S3 requests one at a time, so conditional writes are atomic as on S3. moto checks If-Match /
  If-None-Match and then writes, in two steps, so two threads of its server can both pass the check and
  both "win" a compare-and-swap; and a GET racing a PUT of the same key can read a buffer the PUT has
  just closed. The registry's single-writer rule rests on S3 refusing the second writer (seen before
  this: two overlapping reruns both launching attempt 2 on a loaded machine).
- SSM parameters under /aws/service/ may be written: AWS reserves them for what it and vendors publish
  (Canonical's, Debian's and the Deep Learning AMIs' image parameters), and the local cloud plays those
  publishers, so the image aliases resolve through the same parameters as on AWS.
- GetConsoleOutput returns what a local instance really printed (<$JOBPLANE_LOCAL_CONSOLES>/<id>/console.log)
  instead of moto's fixed sample, when that variable names the instance runner's directory.
- DescribeSpotPriceHistory answers a made-up but plausible Spot market, LOCAL_SPOT_FACTOR of the on-demand
  list price jobplane ships (moto answers $0.00001 an hour for everything), so a local Spot job's estimated
  cost reads like one.
- Requests signed with credentials STS issued (an AssumeRole session: a VM's instance role from the local IMDS,
  a job's vended credentials) are authenticated and authorized as on AWS: the signature is checked, and the
  request must be allowed by the role's policies AND the session policy given to AssumeRole (an explicit Deny in
  either wins), evaluated by jobplane.local.iam_policy with the s3:prefix of a listing and the role's tags as
  aws:PrincipalTag/<key> (a team member's session: its role is tagged jobplane-owner=<team>). A GET or HEAD of a
  missing key is a 403, not a 404, for a session that may not list the whole bucket, as on S3. The functions run
  with sessions of their roles too (jobplane.local.stack_iam), so every call they make is checked: EC2, SSM, SNS and
  STS requests as the checks jobplane.local.iam_requests names (RunInstances on each resource it uses, its tags,
  iam:PassRole, ...). A denial fails as on AWS: EC2's UnauthorizedOperation, the others' AccessDenied, each naming
  the principal, the action and the resource. moto's own enforcement stays off: the local cloud's static keys (the
  platform team's CLI, an administrator's; the tests' own looks) are not checked.
`python -m jobplane.local.moto_server -H HOST -p PORT [--fd FD]` runs moto's own server with these applied, keeping
each connection for the next request (jobplane.local.keep_alive) where werkzeug's closes every one, and counting what
its requests change (CountChanges: jobplane.local.changes), which the local cloud's trigger loop asks before it lists.
"""

from __future__ import annotations

import functools
import inspect
import io
import ipaddress
import json
import os
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from jobplane.local.changes import ANY, PATH, Changes, object_area

_lock = threading.RLock()
PUBLIC_PARAMETERS = "/aws/service/"
CONSOLES_ENV = "JOBPLANE_LOCAL_CONSOLES"
CONSOLE_BYTES = 64 * 1024  # EC2 keeps the last 64 KB
LOCAL_SPOT_FACTOR = 0.3


def _patch(cls: Any, name: str, make: Any) -> None:
    """Replace cls.name with make(original), once."""
    original = getattr(cls, name)
    if getattr(original, "jobplane_patched", False):
        return
    patched: Any = functools.wraps(original)(make(original))
    patched.jobplane_patched = True
    setattr(cls, name, patched)


def make_s3_atomic() -> None:
    """Patch moto's S3 request handlers (in this process) to run one at a time; idempotent."""
    from moto.s3.responses import S3Response

    def serialized(original: Any) -> Any:
        def handler(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _lock:
                return original(self, *args, **kwargs)
        return handler

    for name in ("key_response", "bucket_response"):
        _patch(S3Response, name, serialized)


def allow_public_parameters() -> None:
    """Let put_parameter write /aws/service/... names (moto refuses them like AWS does); idempotent."""
    from moto.ssm.models import SimpleSystemManagerBackend

    def put_parameter(original: Any) -> Any:
        signature = inspect.signature(original)

        def put(self: Any, *args: Any, **kwargs: Any) -> Any:
            call = signature.bind(self, *args, **kwargs)
            name = call.arguments["name"]
            if not name.startswith(PUBLIC_PARAMETERS):
                return original(*call.args, **call.kwargs)
            staged = "/jobplane-local" + name  # past moto's reserved-name check, then moved into place
            call.arguments.update(name=staged, overwrite=True, tags=[])
            parameter = original(*call.args, **call.kwargs)
            versions = self._parameters.pop(staged)
            for version in versions:
                version.name = name
            self._parameters[name] = versions
            return parameter
        return put

    _patch(SimpleSystemManagerBackend, "put_parameter", put_parameter)


def serve_real_consoles() -> None:
    """GetConsoleOutput answers with the instance's own console log where the local cloud keeps one."""
    from moto.core.responses import ActionResult
    from moto.core.types import Base64EncodedString
    from moto.core.utils import utcnow
    from moto.ec2.responses.general import General

    def get_console_output(original: Any) -> Any:
        def console(self: Any) -> Any:
            directory = os.environ.get(CONSOLES_ENV)
            if not directory:
                return original(self)
            instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))  # unknown id: moto's error
            path = Path(directory, instance.id, "console.log")
            text = path.read_bytes()[-CONSOLE_BYTES:].decode(errors="replace") if path.is_file() else ""
            return ActionResult({"InstanceId": instance.id, "Timestamp": utcnow(),
                                 "Output": Base64EncodedString.from_raw_string(text)})
        return console

    _patch(General, "get_console_output", get_console_output)


def local_spot_market() -> None:
    """Each zone's Spot price: LOCAL_SPOT_FACTOR of the type's on-demand list price, set an hour ago."""
    from datetime import timedelta

    from moto.core.responses import ActionResult
    from moto.core.utils import utcnow
    from moto.ec2.responses.spot_instances import SpotInstances

    from jobplane.model import prices

    def describe(original: Any) -> Any:
        def history(self: Any) -> Any:
            listed = original(self).result["SpotPriceHistory"]
            since = utcnow() - timedelta(hours=1)
            return ActionResult({"SpotPriceHistory": [
                {**entry, "ProductDescription": "Linux/UNIX", "Timestamp": since,
                 "SpotPrice": f"{prices.AWS[entry['InstanceType']] * LOCAL_SPOT_FACTOR:.6f}"}
                for entry in listed if entry["InstanceType"] in prices.AWS]})
        return history

    _patch(SpotInstances, "describe_spot_price_history", describe)


def _sts_session(account: str, headers: Any) -> Any:
    """The STS session (moto's AssumedRole) whose access key signed the request, or None."""
    from moto.sts.models import sts_backends

    authorization = headers.get("Authorization") or ""
    key_id = authorization.partition("Credential=")[2].partition("/")[0]
    if not key_id or "X-Amz-Security-Token" not in headers:
        return None
    for partition in sts_backends[account]:
        for session in sts_backends[account][partition].assumed_roles:
            if session.access_key_id == key_id:
                return session
    return None


def _principal_tags(account: str, partition: str, role_arn: str) -> dict[str, str]:
    """aws:PrincipalTag/<key> of the role a session is of, as IAM puts them in the request context."""
    from moto.iam.models import iam_backends

    try:
        role = iam_backends[account][partition].get_role_by_arn(role_arn)
    except Exception:  # a role deleted meanwhile: no tags
        return {}
    return {f"aws:PrincipalTag/{tag['Key']}": tag["Value"] for tag in role.tags or []}


def _missing(account: str, partition: str, resource: str) -> bool:
    from moto.s3.models import s3_backends

    bucket, _, key = resource.split(":::", 1)[1].partition("/")
    try:
        return s3_backends[account][partition].get_object(bucket, key) is None
    except Exception:  # no such bucket, or key: missing either way
        return True


def _denied(service: str, principal: str, check: Any, explicit: bool) -> Any:
    """The error AWS answers a denied call with, naming the principal, the action and the resource. An error of
    the authorization step must be one of moto's RESTErrors (its server renders those there)."""
    from moto.core.exceptions import AccessDeniedError, JsonRESTError
    from moto.core.exceptions import _RESTError as RESTError

    why = ("with an explicit deny in an identity-based policy" if explicit
           else f"because no identity-based policy allows the {check.action} action")
    text = f"{check.action} on resource: {check.resource} {why}"
    if service == "ec2":
        error = RESTError("UnauthorizedOperation", "You are not authorized to perform this operation. User: "
                                                   f"{principal} is not authorized to perform: {text}")
        error.code = 403
        error.description = error.description.replace("ErrorResponse>", "Response>")  # EC2's own envelope
        return error
    if service == "ssm":
        return JsonRESTError("AccessDeniedException", f"User: {principal} is not authorized to perform: {text}")
    return AccessDeniedError(user_arn=principal, action=text)


def _ec2_state(response: Any, account: str, partition: str) -> Any:
    """What an EC2 request's checks look up in moto (jobplane.local.iam_requests.Ec2State)."""
    from moto.iam.models import iam_backends

    from jobplane.local.iam_requests import Ec2State

    backend = response.ec2_backend

    def tags(resource_id: str) -> dict[str, str]:
        return {t["key"]: t["value"] for t in backend.describe_tags(filters={"resource-id": [resource_id]})}

    def default_group(subnet: str | None) -> str | None:
        try:
            vpc = backend.get_subnet(subnet).vpc_id if subnet else None
            group = backend.get_default_security_group(vpc)
        except Exception:  # an unknown subnet: moto's own error follows
            return None
        return str(group.id) if group is not None else None

    def roles(profile: str) -> list[str]:
        iam = iam_backends[account][partition]
        try:
            found = iam.get_instance_profile_by_arn(profile) if profile.startswith("arn:") \
                else iam.get_instance_profile(profile)
        except Exception:  # an unknown profile: moto's own error follows
            return []
        return [str(role.arn) for role in found.roles]

    return Ec2State(tags, default_group, roles)


def _checks(response: Any, action: str, account: str, partition: str) -> list[Any]:
    from jobplane.local.iam_requests import checks

    service = response.service_name
    params: dict[str, list[str]] = dict(response.querystring)
    if service == "ssm":  # JSON: the parameter names from the body (none: DescribeParameters, checked on "*")
        name = response._get_param("Name")
        params = {"Name": [name]} if isinstance(name, str) and name else \
            {"Names": [n for n in response._get_param("Names") or [] if isinstance(n, str)]}
    ec2 = _ec2_state(response, account, partition) if service == "ec2" else None
    return checks(service, action, params, response.region, account, ec2)


def enforce_sts_sessions() -> None:
    """Authenticate and authorize requests signed by STS-issued credentials (see the module's docstring)."""
    from urllib.parse import parse_qs, urlparse

    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.iam.access_control import IAMPolicy, S3IAMRequest
    from moto.utilities.utils import get_partition

    from jobplane.local.iam_policy import ALLOW, DENY, evaluate, session_allows
    from jobplane.local.iam_requests import Check

    def authenticate(original: Any) -> Any:
        def check(self: Any, iam_request_cls: type, resource: str = "*") -> None:
            session = _sts_session(self.current_account, self.headers)
            if session is None:
                original(self, iam_request_cls, resource)
                return None
            parsed = urlparse(self.uri)
            path = self.raw_path + ("?" + parsed.query if parsed.query else "")
            request = iam_request_cls(account_id=self.current_account, method=self.method, path=path, data=self.data,
                                      body=self.raw_body, headers=self.headers, action=self._get_action())
            request.check_signature()  # a bad signature or an unknown token: moto's own errors
            s3 = iam_request_cls is S3IAMRequest
            action = f"s3:{self.data['Action']}" if s3 else request._action
            if action == "sts:GetCallerIdentity":
                return None  # always allowed, as on AWS
            role = [IAMPolicy(p)._policy_json for p in request._access_key.collect_policies()]
            policy = json.loads(session.policy) if session.policy else None
            partition = get_partition(self.region)
            context = _principal_tags(self.current_account, partition, session.role_arn)
            if s3 and action == "s3:ListBucket" and "prefix" in parse_qs(parsed.query):
                context["s3:prefix"] = parse_qs(parsed.query)["prefix"][0]
            wanted = [Check(action, resource)] if s3 else \
                _checks(self, action.split(":", 1)[1], self.current_account, partition)
            for one in wanted:
                if not session_allows(role, policy, one.action, one.resource, {**context, **one.context}):
                    explicit = DENY in (evaluate(role, one.action, one.resource, {**context, **one.context}),
                                        policy and evaluate([policy], one.action, one.resource, context))
                    if s3:
                        request._raise_access_denied()  # S3's own AccessDenied, as its clients parse it
                    raise _denied(self.service_name, session.arn, one, bool(explicit))
            if s3 and action == "s3:GetObject" and "/" in resource.split(":::", 1)[1] and _missing(
                    self.current_account, partition, resource):
                bucket = resource.split(":::", 1)[1].split("/", 1)[0]
                whole = f"arn:{partition}:s3:::{bucket}"
                if not (evaluate(role, "s3:ListBucket", whole) == ALLOW
                        and (policy is None or evaluate([policy], "s3:ListBucket", whole) == ALLOW)):
                    request._raise_access_denied()  # S3 hides whether the key exists from this caller
            return None
        return check

    _patch(ActionAuthenticatorMixin, "_authenticate_and_authorize_action", authenticate)


def patch_moto() -> None:
    make_s3_atomic()
    allow_public_parameters()
    serve_real_consoles()
    local_spot_market()
    enforce_sts_sessions()


def share_botocore_loader() -> None:
    """One botocore loader for every session of this process (jobplane.clouds.aws_local's; imported when called, so
    importing this module imports no boto3)."""
    from jobplane.clouds import aws_local

    aws_local.share_botocore_loader()


def name_services_once() -> None:
    """moto's server tells a service's name from a request's host by listing its own package folder (a listdir and
    an isdir an entry) on every request, a third of the CPU a small request costs it; the folder does not change."""
    from moto import backends

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules


_SCOPE = re.compile(r"Credential=[^/,\s]+/\d{8}/[^/]+/([a-z0-9-]+)/aws4_request")
_READS = ("Describe", "Get", "List", "Receive")  # a query or JSON call named so changes nothing


def _service(environ: dict[str, Any]) -> str | None:
    """The service of a SigV4-signed request, from its credential scope (header or presigned query)."""
    found = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
    if found is None and "X-Amz-Credential" in environ.get("QUERY_STRING", ""):
        credential = parse_qs(environ["QUERY_STRING"]).get("X-Amz-Credential", [""])[0]
        found = _SCOPE.search("Credential=" + credential)
    return found.group(1) if found else None


def _path_style(environ: dict[str, Any]) -> bool:
    """Whether the bucket is the path's first segment (an endpoint by address, as the local cloud's clients use),
    not the host's first label."""
    host = str(environ.get("HTTP_HOST", "")).rsplit(":", 1)[0].strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"
    return True


def changed_area(environ: dict[str, Any]) -> str | None:
    """The area (jobplane.local.changes) a request may change, None when it changes nothing: an S3 write or delete
    its object's folder, another service's call that changes something that service; what it cannot tell, ANY."""
    method = environ.get("REQUEST_METHOD", "GET")
    if method in ("GET", "HEAD", "OPTIONS"):
        return None  # a REST read (S3's; moto's own pages): a query or JSON API call is a POST
    service = _service(environ)
    if service == "s3" and _path_style(environ):
        bucket, _, key = environ.get("PATH_INFO", "").lstrip("/").partition("/")
        return object_area(bucket, key) if bucket else ANY
    if service is None or service == "s3":
        return ANY
    action = environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2]  # a JSON protocol's (SQS, SSM)
    if not action:
        length = int(environ.get("CONTENT_LENGTH") or 0)  # a query protocol's (EC2, SNS, STS, IAM), in the form
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        form = parse_qs(environ.get("QUERY_STRING", "")) | parse_qs(body.decode("utf-8", errors="replace"))
        action = form.get("Action", [""])[0]
    return None if action.startswith(_READS) else service


class CountChanges:
    """moto's WSGI application, counting the area each request changed once its answer is made (an answer made is a
    change made: moto's S3 writes one at a time, under make_s3_atomic's lock), and answering the counts at PATH."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.changes = Changes()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == PATH and environ.get("REQUEST_METHOD") == "GET":
            body = self.changes.body()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        area = changed_area(environ)
        result = self.app(environ, start_response)
        if area is None:
            return result
        try:
            body = b"".join(result)
        finally:
            getattr(result, "close", lambda: None)()
        self.changes.note(area)
        return [body]


def main(argv: list[str] | None = None) -> None:
    """moto's server (as `moto_server -H HOST -p PORT`), patched; with --fd, on a listening socket the parent
    bound and passed (jobplane.local.cloud.ServiceProcess), so the port is known to be this server's."""
    import argparse

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    from jobplane.local.keep_alive import keep_alive

    parser = argparse.ArgumentParser(prog="python -m jobplane.local.moto_server", description=main.__doc__)
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    parser.add_argument("--fd", type=int, default=None, help="serve on this inherited listening socket")
    parser.add_argument("--faults", default=None, metavar="RATE[:SEED]",
                        help="answer RATE of the requests with AWS's faults (jobplane.local.api_faults)")
    args = parser.parse_args(argv)
    # the local cloud registers its own images (jobplane.local.aws.publish_images): moto's thousands of vendor AMIs,
    # loaded per region, would only cost its start
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    share_botocore_loader()
    patch_moto()
    name_services_once()
    app: Any = DomainDispatcherApplication(create_backend_app)
    if args.faults:
        from jobplane.clouds.faults import Faults, parse
        from jobplane.local.api_faults import FaultyApi

        app = FaultyApi(app, Faults(*parse(args.faults)))
    app = CountChanges(app)
    class Handler(MotoRequestHandler):  # type: ignore[misc]  # moto's is untyped
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass  # a line per request: a twentieth of the server's CPU, read by nobody; errors are still logged

    server = make_server(args.host, args.port, app, threaded=True, request_handler=keep_alive(Handler), fd=args.fd)
    os.environ.setdefault("MOTO_PORT", str(server.server_address[1]))  # moto's own URLs (SQS queues) name it
    server.serve_forever()


if __name__ == "__main__":
    main()
