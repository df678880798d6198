"""Local instances live on loopback: the local cloud's VPC is inside 127.0.0.0/8, the launcher's own EC2 code
path hands out addresses there, and the instance runner refuses to boot anything with an address elsewhere.
On moto in-process (EC2 + S3); the instance runner is the real one, with real processes and fake IMDS."""

from __future__ import annotations

import ipaddress
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

from jobplane.clouds.aws import Ec2Compute
from jobplane.clouds.aws_local import LOOPBACK_VPC, LocalAws
from jobplane.clouds.base import TAG_JOB_ID, TAG_MANAGED, LaunchRequest
from jobplane.local.ec2_runner import Ec2Runner
from jobplane.local.loopback import on_loopback
from jobplane.model.policy import AwsPlacement
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(120)
REGION = "us-east-1"


@pytest.fixture
def aws() -> Iterator[LocalAws]:
    with mock_aws():
        yield LocalAws(REGION)


@pytest.fixture
def runner(aws: LocalAws, tmp_path: Path) -> Iterator[Ec2Runner]:
    events: list[dict[str, Any]] = []
    runner = Ec2Runner(aws, tmp_path, {"PATH": "/usr/bin:/bin"}, "loopback-test", events.append)
    try:
        yield runner
    finally:
        runner.stop_all()


def request(aws: LocalAws, nodes: int, zone: str | None = None) -> LaunchRequest:
    return LaunchRequest(job_id="net", attempt=1, num_nodes=nodes, instance_type="t3.micro", zone=zone,
                         image=aws.register_image(), spot=False, user_data="", max_runtime=600, disk_gb=8,
                         owner="default")


def test_on_loopback() -> None:
    assert all(on_loopback(a) for a in ("127.0.0.1", "127.100.1.4", "127.255.255.254"))
    assert not any(on_loopback(a) for a in ("10.0.0.5", "172.31.0.9", "54.12.0.1", "::1", "", None, "host"))


def test_the_launchers_ec2_path_hands_out_loopback_addresses_only(aws: LocalAws) -> None:
    subnets = aws.loopback_subnets()
    assert subnets == aws.loopback_subnets(), "made once, found after"
    described = aws.ec2.describe_subnets(SubnetIds=subnets)["Subnets"]
    assert all(ipaddress.ip_network(s["CidrBlock"]).subnet_of(ipaddress.ip_network(LOOPBACK_VPC)) for s in described)
    assert not any(s["MapPublicIpOnLaunch"] for s in described)

    compute = Ec2Compute(AwsPlacement(subnets=subnets), REGION, aws.ec2)
    anywhere = compute.launch(request(aws, 3))
    in_zone_c = compute.launch(request(aws, 1, zone="us-east-1c"))
    assert [i.zone for i in in_zone_c] == ["us-east-1c"]
    raw = {i.id: i for i in aws.instances()}
    for inst in [*anywhere, *in_zone_c]:
        assert on_loopback(inst.private_ip), inst
        assert raw[inst.id].public_ip is None, raw[inst.id]
    by_hand = aws.run(managed=True)  # `jobplane local instance` lands there too
    assert on_loopback({i.id: i for i in aws.instances()}[by_hand].private_ip)


def test_the_runner_refuses_an_instance_off_loopback(aws: LocalAws, runner: Ec2Runner, tmp_path: Path) -> None:
    # An instance in moto's default VPC, as a launch without the local policy's subnets would get.
    off = aws.ec2.run_instances(
        ImageId=aws.register_image(), InstanceType="t3.micro", MinCount=1, MaxCount=1,
        UserData=f"#!/bin/sh\ntouch {tmp_path}/it-ran\n", InstanceInitiatedShutdownBehavior="terminate",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": TAG_MANAGED, "Value": "true"},
                                                                 {"Key": TAG_JOB_ID, "Value": "off"}]}],
    )["Instances"][0]
    assert not on_loopback(off["PrivateIpAddress"])
    runner.sync()
    assert {i.id: i.state for i in aws.instances()}[off["InstanceId"]] in ("shutting-down", "terminated")
    assert off["InstanceId"] in runner.done and not (tmp_path / "it-ran").exists()


def test_a_loopback_instance_boots_and_its_imds_answers_its_address(aws: LocalAws, runner: Ec2Runner) -> None:
    iid = aws.run(managed=True, job_id="on", user_data="#!/bin/sh\nsleep 30\n")
    runner.sync()
    wait_for("the instance process", lambda: runner.status() and runner.status()[0]["pid"], 30)
    node = runner.nodes[iid]
    private_ip = {i.id: i for i in aws.instances()}[iid].private_ip
    assert on_loopback(private_ip)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    token = opener.open(urllib.request.Request(f"{node.metadata.url}/latest/api/token", method="PUT", headers={
        "X-aws-ec2-metadata-token-ttl-seconds": "60"}), timeout=10).read().decode()

    def meta(path: str) -> tuple[int, str]:
        req = urllib.request.Request(f"{node.metadata.url}/latest/meta-data/{path}",
                                     headers={"X-aws-ec2-metadata-token": token})
        try:
            with opener.open(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, ""

    assert meta("local-ipv4") == (200, private_ip)
    assert meta("public-ipv4")[0] == 404
    assert on_loopback(node.metadata.url.split("//")[1].split(":")[0])
