"""What IAM authorizes for one request to the local cloud's moto, as AWS evaluates it: the (action, resource,
context) of each check a call makes (jobplane.local.moto_server asks jobplane.local.iam_policy about each).

S3 requests are moto's own (it names the object's or the bucket's ARN); this module covers the other services the
functions call. EC2's RunInstances is several checks, as on AWS: ec2:RunInstances on the new instance and volume
(with the request's tags as aws:RequestTag/*) and on each existing resource it uses (subnet, security groups, network
interface, image, key pair, placement group, Spot request), ec2:CreateTags on what it tags (ec2:CreateAction =
RunInstances) and iam:PassRole on the instance profile's role (iam:PassedToService = ec2.amazonaws.com). An action
on an instance is checked on its ARN with its tags as aws:ResourceTag/*; a Describe* on "*", as EC2 supports no
resource-level permissions there. SSM checks the parameter's ARN (an AWS-published one has no account), SNS the
topic's, STS's AssumeRole the role's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Params = Mapping[str, list[str]]  # a query-protocol request's parameters (moto's querystring)
PUBLIC_PARAMETERS = "/aws/service/"


@dataclass(frozen=True)
class Check:
    action: str
    resource: str
    context: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Ec2State:
    """What moto knows that a check needs: an instance's tags, a subnet's VPC's default security group, the roles of
    an instance profile (by name or ARN)."""

    instance_tags: Callable[[str], Mapping[str, str]]
    default_group: Callable[[str | None], str | None]
    profile_roles: Callable[[str], list[str]]


def _one(params: Params, name: str) -> str | None:
    values = params.get(name)
    return values[0] if values else None


def _numbered(params: Params, prefix: str) -> list[str]:
    """prefix.1, prefix.2, ... in order (EC2's query lists)."""
    found = [(int(m.group(1)), v[0]) for k, v in params.items()
             if (m := re.fullmatch(re.escape(prefix) + r"\.(\d+)", k)) and v]
    return [value for _, value in sorted(found)]


def _tags(params: Params) -> dict[str, dict[str, str]]:
    """TagSpecification.N: resource type -> its tags."""
    out: dict[str, dict[str, str]] = {}
    for n in sorted({int(m.group(1)) for k in params if (m := re.match(r"TagSpecification\.(\d+)\.", k))}):
        kind = _one(params, f"TagSpecification.{n}.ResourceType") or ""
        names = _numbered({k.removesuffix(".Key"): v for k, v in params.items() if k.endswith(".Key")},
                          f"TagSpecification.{n}.Tag")
        values = _numbered({k.removesuffix(".Value"): v for k, v in params.items() if k.endswith(".Value")},
                           f"TagSpecification.{n}.Tag")
        out.setdefault(kind, {}).update(zip(names, values, strict=False))
    return out


def request_tags(tags: Mapping[str, str]) -> dict[str, str]:
    return {f"aws:RequestTag/{k}": v for k, v in tags.items()}


def resource_tags(tags: Mapping[str, str]) -> dict[str, str]:
    return {f"{kind}:ResourceTag/{k}": v for k, v in tags.items() for kind in ("aws", "ec2")}


def ec2_checks(action: str, params: Params, region: str, account: str, state: Ec2State) -> list[Check]:
    arn = f"arn:aws:ec2:{region}:{account}:"
    if action == "RunInstances":
        return _run_instances(params, arn, region, state)
    if action in ("TerminateInstances", "StopInstances", "StartInstances", "RebootInstances"):
        ids = _numbered(params, "InstanceId")
    elif action in ("DescribeInstanceAttribute", "GetConsoleOutput", "ModifyInstanceAttribute"):
        ids = [i for i in [_one(params, "InstanceId")] if i]
    elif action in ("CreateTags", "DeleteTags"):
        names = _numbered({k.removesuffix(".Key"): v for k, v in params.items() if k.endswith(".Key")}, "Tag")
        values = _numbered({k.removesuffix(".Value"): v for k, v in params.items() if k.endswith(".Value")}, "Tag")
        tags = request_tags(dict(zip(names, values, strict=False)))
        return [Check(f"ec2:{action}", f"{arn}{_ec2_type(r)}/{r}", {**tags, **resource_tags(state.instance_tags(r))})
                for r in _numbered(params, "ResourceId")]
    else:
        return [Check(f"ec2:{action}", "*")]
    return [Check(f"ec2:{action}", f"{arn}instance/{i}", resource_tags(state.instance_tags(i))) for i in ids]


def _ec2_type(resource_id: str) -> str:
    return {"i": "instance", "vol": "volume", "sg": "security-group", "subnet": "subnet"}.get(
        resource_id.split("-", 1)[0], "resource")


def _run_instances(params: Params, arn: str, region: str, state: Ec2State) -> list[Check]:
    tags = _tags(params)
    subnet = _one(params, "SubnetId") or _one(params, "NetworkInterface.1.SubnetId")
    groups = _numbered(params, "SecurityGroupId") or _numbered(params, "NetworkInterface.1.SecurityGroupId")
    if not groups and (default := state.default_group(subnet)):
        groups = [default]  # EC2 puts the instance in its VPC's default group, and checks that
    used = [f"{arn}network-interface/*", f"arn:aws:ec2:{region}::image/{_one(params, 'ImageId')}",
            *(f"{arn}subnet/{subnet}" for _ in [1] if subnet), *(f"{arn}security-group/{g}" for g in groups)]
    if key := _one(params, "KeyName"):
        used.append(f"{arn}key-pair/{key}")
    if group := _one(params, "Placement.GroupName"):
        used.append(f"{arn}placement-group/{group}")
    if _one(params, "InstanceMarketOptions.MarketType") == "spot":
        used.append(f"{arn}spot-instances-request/*")
    created = {"instance": f"{arn}instance/*", "volume": f"{arn}volume/*"}
    checks = [Check("ec2:RunInstances", resource, request_tags(tags.get(kind, {})))
              for kind, resource in created.items()]
    checks += [Check("ec2:RunInstances", resource) for resource in used]
    checks += [Check("ec2:CreateTags", created[kind], {"ec2:CreateAction": "RunInstances", **request_tags(tagged)})
               for kind, tagged in tags.items() if kind in created]
    profile = _one(params, "IamInstanceProfile.Arn") or _one(params, "IamInstanceProfile.Name")
    checks += [Check("iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"})
               for role in (state.profile_roles(profile) if profile else [])]
    return checks


def ssm_parameter_arn(name: str, region: str, account: str) -> str:
    owner = "" if name.startswith(PUBLIC_PARAMETERS) else account  # AWS publishes these, from no account
    return f"arn:aws:ssm:{region}:{owner}:parameter/{name.lstrip('/')}"


def checks(service: str, action: str, params: Params, region: str, account: str,
           ec2: Ec2State | None = None) -> list[Check]:
    """The checks of one request of a service other than S3 (query parameters; SSM's JSON names as lists)."""
    if service == "ec2" and ec2 is not None:
        return ec2_checks(action, params, region, account, ec2)
    if service == "ssm":  # a parameter's actions are checked on each parameter named; the others on "*"
        names = params.get("Name") or params.get("Names") or []
        return [Check(f"ssm:{action}", ssm_parameter_arn(n, region, account)) for n in names] or \
            [Check(f"ssm:{action}", "*")]
    if service == "sns" and action == "Publish":
        return [Check("sns:Publish", _one(params, "TopicArn") or _one(params, "TargetArn") or "*")]
    if service == "sts" and action in ("AssumeRole", "TagSession"):
        return [Check(f"sts:{action}", _one(params, "RoleArn") or "*")]
    return [Check(f"{service}:{action}", "*")]
