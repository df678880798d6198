"""Compute over EC2 (boto3): one all-or-nothing RunInstances per try, ownership by tags, guarded terminate.

Zones are picked through subnets when the policy lists them (a subnet lives in one zone), else through
Placement.AvailabilityZone in the default VPC. An image given as resolve:ssm:<parameter> (what the image
aliases become) is read from SSM Parameter Store first: RunInstances would accept it as is, but the AMI's
root device name is needed to size the root volume, and the AMI actually used goes into the log.

Termination protection is not part of DescribeInstances, so list_managed reports protected=False;
terminate() re-checks the managed tag and DisableApiTermination of each id just before terminating
(terminations are few per run, so the extra calls are cheap there, where a check per instance in every
check would not be).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from jobplane.clouds.base import (
    TAG_ATTEMPT,
    TAG_DEPLOYMENT,
    TAG_JOB_ID,
    TAG_MANAGED,
    TAG_OWNER,
    CapacityError,
    Instance,
    LaunchRejected,
    LaunchRequest,
)
from jobplane.model.images import SSM_PREFIX
from jobplane.model.policy import AwsPlacement

log = logging.getLogger("jobplane.aws")

RETRIES = Config(retries={"mode": "adaptive", "max_attempts": 8})

# No room for this (zone, type) right now: the launcher tries the next candidate, then waits. Account
# vCPU / instance limits are here too: they free up as other jobs end, and another family may fit.
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
    "InsufficientFreeAddressesInSubnet",
    "Unsupported",  # the type is not offered in this zone
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
})
# Worth retrying only after botocore has (it retries these itself): never a verdict on the request.
TRANSIENT_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError",
                             "ServiceUnavailable", "Unavailable", "RequestExpired"})
LIVE_STATES = ["pending", "running", "stopping", "stopped"]  # shutting-down is already on its way out
# What DescribeSpotPriceHistory calls the Linux price (EC2-Classic's and the VPC's names for the same market)
LINUX_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
_CHUNK = 200  # ids per Describe/Terminate call
MAX_CLIENT_TOKEN = 64


def ec2_client(region: str | None = None) -> Any:
    """A client honouring AWS_ENDPOINT_URL (moto server, local cloud) with adaptive retries."""
    return boto3.client("ec2", region_name=region, config=RETRIES)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", "")) or str(exc)


def client_token(request: LaunchRequest, subnet: str | None) -> str:
    """Deterministic per (job, attempt, type, zone, subnet), at most 64 ASCII characters.

    A retried call for the same candidate gets the same instances back from EC2; another candidate gets
    another token (reusing one with different parameters is IdempotentParameterMismatch). moto ignores
    tokens, so launch idempotency rests on the registry's CAS claim, not on this alone.
    """
    digest = hashlib.sha256(
        f"{request.job_id}/{request.attempt}/{request.instance_type}/{request.zone}/{subnet}".encode()
    ).hexdigest()[:16]
    token = f"{request.job_id[:40]}-{request.attempt}-{digest}"
    return token[:MAX_CLIENT_TOKEN]


def launch_tags(request: LaunchRequest, deployment: str | None = None) -> list[dict[str, str]]:
    """Instance and volume tags. Keys must suit IMDS tag access: no spaces or '/', ':' is fine."""
    tags = dict(request.labels)  # ours win over a label of the same key
    tags.update({TAG_DEPLOYMENT: deployment} if deployment else {})
    tags.update({
        TAG_MANAGED: "true",
        TAG_JOB_ID: request.job_id,
        TAG_ATTEMPT: str(request.attempt),
        TAG_OWNER: request.owner,
        "Name": request.name or f"jobplane-{request.job_id}-{request.attempt}",
    })
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _profile(name_or_arn: str) -> dict[str, str]:
    return {"Arn": name_or_arn} if name_or_arn.startswith("arn:") else {"Name": name_or_arn}


def to_instance(raw: dict[str, Any]) -> Instance:
    tags = {t["Key"]: t.get("Value", "") for t in raw.get("Tags", [])}
    attempt = tags.get(TAG_ATTEMPT, "")
    state = str(raw["State"]["Name"])
    return Instance(
        id=raw["InstanceId"],
        state="terminated" if state == "shutting-down" else state,
        launched_at=raw["LaunchTime"].astimezone(UTC),
        managed=tags.get(TAG_MANAGED) == "true",
        job_id=tags.get(TAG_JOB_ID),
        attempt=int(attempt) if attempt.isdigit() else None,
        rank=int(raw.get("AmiLaunchIndex", 0)),
        spot=raw.get("InstanceLifecycle") == "spot",
        zone=raw.get("Placement", {}).get("AvailabilityZone"),
        instance_type=raw.get("InstanceType"),
        private_ip=raw.get("PrivateIpAddress"),
        tags=tuple(sorted(tags.items())),
    )


def _network_params(p: AwsPlacement, subnet: str | None) -> dict[str, Any]:
    """Subnet and security groups; a public address is a property of the primary interface, so asking for
    (or refusing) one moves both into a NetworkInterfaces entry (EC2 rejects them at both levels)."""
    groups = list(p.security_groups)
    if p.public_ip is None:
        return {**({"SubnetId": subnet} if subnet else {}), **({"SecurityGroupIds": groups} if groups else {})}
    nic: dict[str, Any] = {"DeviceIndex": 0, "AssociatePublicIpAddress": p.public_ip, "DeleteOnTermination": True}
    if subnet:
        nic["SubnetId"] = subnet
    if groups:
        nic["Groups"] = groups
    return {"NetworkInterfaces": [nic]}


def _chunks(items: list[str], size: int = _CHUNK) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


class Ec2Compute:
    """The Compute protocol on EC2, placing VMs where the policy's `aws` section says."""

    cloud = "aws"

    def __init__(self, placement: AwsPlacement | None = None, region: str | None = None, client: Any = None,
                 ssm: Any = None, *, deployment: str | None = None) -> None:
        self.placement = placement or AwsPlacement()
        self.deployment = deployment  # None: every managed VM in the region is this deployment's (tests only)
        self.client = client or ec2_client(region)
        self.region: str = region or str(self.client.meta.region_name)
        self._ssm = ssm
        self._amis: dict[str, str] = {}
        self._root_devices: dict[str, str] = {}
        self._subnet_zones: dict[str, str] = {}

    # ---- launch ------------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[Instance]:
        subnets = self._subnets_for(request.zone)
        error: CapacityError | None = None
        for subnet in subnets:
            try:
                return self._run(request, subnet)
            except CapacityError as exc:  # another subnet of the same zone (or any zone) may have room
                error = exc
        assert error is not None
        raise error

    def run_instances_params(self, request: LaunchRequest, subnet: str | None) -> dict[str, Any]:
        """Every RunInstances parameter for one try (pure apart from the cached image lookups)."""
        p = self.placement
        image = self.ami(request.image)
        params: dict[str, Any] = {
            "ImageId": image,
            "InstanceType": request.instance_type,
            "MinCount": request.num_nodes,
            "MaxCount": request.num_nodes,
            "UserData": request.user_data,
            "ClientToken": client_token(request, subnet),
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled",
                                "InstanceMetadataTags": "enabled"},
            "BlockDeviceMappings": [{"DeviceName": self._root_device(image),
                                     "Ebs": {"VolumeSize": request.disk_gb, "VolumeType": "gp3",
                                             "DeleteOnTermination": True}}],
            "TagSpecifications": [{"ResourceType": kind, "Tags": launch_tags(request, self.deployment)}
                                  for kind in ("instance", "volume")],
        }
        if request.spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate",
                                **({"MaxPrice": f"{request.max_price:.6f}"} if request.max_price is not None else {})},
            }
        placement: dict[str, str] = {}
        if request.zone and subnet is None:
            placement["AvailabilityZone"] = request.zone
        if p.placement_group and request.num_nodes > 1:
            placement["GroupName"] = p.placement_group
        if placement:
            params["Placement"] = placement
        params.update(_network_params(p, subnet))
        if p.instance_profile:
            params["IamInstanceProfile"] = _profile(p.instance_profile)
        if p.key_name:
            params["KeyName"] = p.key_name
        return params

    def _run(self, request: LaunchRequest, subnet: str | None) -> list[Instance]:
        try:
            params = self.run_instances_params(request, subnet)
            resp = self.client.run_instances(**params)
        except ClientError as exc:
            code = _code(exc)
            if code in CAPACITY_CODES:
                raise CapacityError(code, _message(exc)) from None
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400))
            if code in TRANSIENT_CODES or status >= 500:
                raise
            raise LaunchRejected(code, _message(exc)) from None
        instances = [to_instance(raw) for raw in resp["Instances"]]
        log.info("launched %d x %s for %s attempt %d: %s", len(instances), request.instance_type,
                 request.job_id, request.attempt, [i.id for i in instances], extra={"job_id": request.job_id})
        return sorted(instances, key=lambda i: i.rank or 0)

    def ami(self, image: str) -> str:
        """The AMI id an image names: itself, or the value of its resolve:ssm: parameter (cached)."""
        if not image.startswith(SSM_PREFIX):
            return image
        if image not in self._amis:
            if self._ssm is None:
                self._ssm = self._ssm_client()
            name = image.removeprefix(SSM_PREFIX)
            try:
                value = str(self._ssm.get_parameter(Name=name)["Parameter"]["Value"])
            except ClientError as exc:
                if _code(exc) in TRANSIENT_CODES:
                    raise
                raise LaunchRejected(_code(exc) or "InvalidParameter",
                                     f"image parameter {name!r} in {self.region}: {_message(exc)}") from None
            log.info("image %s is %s", image, value)
            self._amis[image] = value
        return self._amis[image]

    def _ssm_client(self) -> Any:
        """SSM where EC2 is: an EC2 client pointed at a local endpoint (moto, the local cloud) gets its SSM
        from the same endpoint, never from AWS; on AWS, the region's own."""
        endpoint = str(self.client.meta.endpoint_url)
        host = urlsplit(endpoint).hostname or ""
        local = not (host.endswith(".amazonaws.com") or host.endswith(".amazonaws.com.cn"))
        return boto3.client("ssm", region_name=self.region, endpoint_url=endpoint if local else None, config=RETRIES)

    def _root_device(self, image: str) -> str:
        """The AMI's root device name (/dev/xvda, /dev/sda1...), so disk_gb resizes the root volume."""
        if image not in self._root_devices:
            images = self.client.describe_images(ImageIds=[image]).get("Images", [])
            if not images:
                raise ClientError({"Error": {"Code": "InvalidAMIID.NotFound",
                                             "Message": f"image {image!r} not found"}}, "DescribeImages")
            self._root_devices[image] = str(images[0].get("RootDeviceName") or "/dev/xvda")
        return self._root_devices[image]

    def _subnets_for(self, zone: str | None) -> list[str | None]:
        """Policy subnets to try for this zone, in policy order; [None] means the default VPC."""
        subnets = list(self.placement.subnets)
        if not subnets:
            return [None]
        if zone is None:
            return list(subnets)
        missing = [s for s in subnets if s not in self._subnet_zones]
        if missing:
            for raw in self.client.describe_subnets(SubnetIds=missing)["Subnets"]:
                self._subnet_zones[raw["SubnetId"]] = raw["AvailabilityZone"]
        matching: list[str | None] = [s for s in subnets if self._subnet_zones.get(s) == zone]
        if not matching:
            raise LaunchRejected("NoSubnetInZone", f"zone {zone!r} has none of the policy's subnets "
                                                   f"({', '.join(subnets)}): list a subnet there, or drop the zone")
        return matching

    # ---- listing -----------------------------------------------------------------------------------
    def _describe(self, filters: list[dict[str, Any]], ids: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
        flt = [*filters, {"Name": "instance-id", "Values": list(ids)}] if ids else filters
        for page in self.client.get_paginator("describe_instances").paginate(Filters=flt):
            for reservation in page.get("Reservations", []):
                yield from reservation.get("Instances", [])

    def _ours(self) -> list[dict[str, Any]]:
        """The filters that select this deployment's VMs: managed, and tagged with its id."""
        mine = [{"Name": f"tag:{TAG_DEPLOYMENT}", "Values": [self.deployment]}] if self.deployment else []
        return [{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}, *mine]

    def list_managed(self) -> list[Instance]:
        """Every live instance of this deployment: one paginated DescribeInstances, filtered server-side. A VM
        of another deployment (or one launched before VMs carried the deployment tag) is never listed."""
        filters = [*self._ours(), {"Name": "instance-state-name", "Values": LIVE_STATES}]
        return [to_instance(raw) for raw in self._describe(filters)]

    # ---- terminate ---------------------------------------------------------------------------------
    def terminate(self, instance_ids: list[str]) -> None:
        """Terminate only ids that still carry jobplane:managed=true and this deployment's tag, and have no
        termination protection."""
        for chunk in _chunks(sorted(set(instance_ids))):
            managed = [raw["InstanceId"] for raw in self._describe(self._ours(), chunk)]
            refused = sorted(set(chunk) - set(managed))
            if refused:
                log.warning("not terminating %s: not managed by this jobplane deployment (or gone)", refused)
            doomed = [i for i in managed if not self.protected(i)]
            if doomed:
                self.client.terminate_instances(InstanceIds=doomed)
                log.info("terminated %s", doomed)

    # ---- prices ------------------------------------------------------------------------------------
    def spot_price(self, instance_type: str, zone: str, at: datetime | None = None) -> float | None:
        """The Linux Spot price in effect for this type and zone at `at` (now): given a start time, EC2 returns
        the changes since it plus the last change before it, so the newest entry at or before `at` is the
        price then."""
        at = at or datetime.now(UTC)
        resp = self.client.describe_spot_price_history(
            InstanceTypes=[instance_type], AvailabilityZone=zone, ProductDescriptions=list(LINUX_PRODUCTS),
            StartTime=at, EndTime=at)
        entries = [e for e in resp.get("SpotPriceHistory", [])
                   if e.get("AvailabilityZone") == zone and e.get("InstanceType") == instance_type
                   and e.get("ProductDescription") in LINUX_PRODUCTS and e["Timestamp"] <= at]
        if not entries:
            return None
        return float(max(entries, key=lambda e: e["Timestamp"])["SpotPrice"])

    # ---- diagnostics -------------------------------------------------------------------------------
    def console_output(self, instance_id: str) -> str:
        """The newest console output (Latest works on Nitro instances only; older types give what EC2 last
        captured). botocore decodes the base64."""
        try:
            resp = self.client.get_console_output(InstanceId=instance_id, Latest=True)
        except ClientError as exc:
            if _code(exc) not in ("UnsupportedOperation", "InvalidParameterValue", "InvalidParameter"):
                raise
            resp = self.client.get_console_output(InstanceId=instance_id)
        return str(resp.get("Output") or "")

    def protected(self, instance_id: str) -> bool:
        attr = self.client.describe_instance_attribute(InstanceId=instance_id, Attribute="disableApiTermination")
        if attr.get("DisableApiTermination", {}).get("Value"):
            log.warning("not terminating %s: termination protection is on", instance_id)
            return True
        return False
