"""Ec2Compute against moto: every RunInstances parameter, error mapping, listing and guarded terminate."""

from __future__ import annotations

import base64

import boto3
import pytest

from jobplane.clouds.aws import Ec2Compute, client_token
from jobplane.clouds.base import CapacityError, LaunchRejected, LaunchRequest
from jobplane.model import images
from jobplane.model.policy import AwsPlacement
from tests.moto_aws import REGION, MotoAws

pytestmark = pytest.mark.timeout(120)


def request(moto_aws: MotoAws, **over: object) -> LaunchRequest:
    fields: dict[str, object] = dict(
        job_id="train-1", attempt=2, num_nodes=2, instance_type="g5.xlarge", zone="us-east-1b",
        image=moto_aws.image, spot=True, user_data="#!/bin/bash\necho hi\n", max_runtime=3600, disk_gb=150,
        owner="alice", labels=(("team", "vision"),),
    )
    fields.update(over)
    return LaunchRequest(**fields)  # type: ignore[arg-type]


def profile(moto_aws: MotoAws, name: str) -> str:
    import boto3

    iam = boto3.client("iam", region_name=REGION)
    return str(iam.create_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Arn"])


def placement(moto_aws: MotoAws, zone: str = "us-east-1b") -> AwsPlacement:
    ec2 = moto_aws.ec2
    subnet = next(s["SubnetId"] for s in ec2.describe_subnets()["Subnets"] if s["AvailabilityZone"] == zone)
    sg = ec2.create_security_group(GroupName="jobplane-vms", Description="vms")["GroupId"]
    profile_arn = profile(moto_aws, "jobplane-vm")
    return AwsPlacement(instance_profile=profile_arn, subnets=[subnet], security_groups=[sg],
                        placement_group="jobplane-cluster", key_name="ops")


def test_run_instances_parameters(moto_aws: MotoAws) -> None:
    moto_aws.ec2.create_key_pair(KeyName="ops")
    policy = placement(moto_aws)
    compute = Ec2Compute(policy, REGION, moto_aws.ec2)
    req = request(moto_aws)

    launched = compute.launch(req)

    # one call, all or nothing
    assert len(moto_aws.calls.run_instances) == 1
    sent = moto_aws.calls.run_instances[0]
    assert sent["MinCount"] == sent["MaxCount"] == 2
    assert sent["InstanceMarketOptions.MarketType"] == "spot"
    assert sent["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert sent["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    assert "InstanceMarketOptions.SpotOptions.MaxPrice" not in sent, "no max_price: up to the on-demand price"
    assert sent["MetadataOptions.HttpTokens"] == "required"
    assert sent["MetadataOptions.InstanceMetadataTags"] == "enabled"
    assert sent["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert sent["Placement.GroupName"] == "jobplane-cluster"  # moto drops it, so check the request
    assert sent["SubnetId"] == policy.subnets[0] and "Placement.AvailabilityZone" not in sent
    assert sent["ClientToken"] == client_token(req, policy.subnets[0]) and len(sent["ClientToken"]) <= 64
    assert sent["IamInstanceProfile.Arn"] == policy.instance_profile
    assert sent["KeyName"] == "ops"
    assert sent["BlockDeviceMapping.1.Ebs.VolumeSize"] == 150
    assert sent["BlockDeviceMapping.1.DeviceName"] == "/dev/sda1"  # the AMI's root device

    # what EC2 (moto) made of it
    assert [i.rank for i in launched] == [0, 1]
    raw = {i["InstanceId"]: i for i in moto_aws.instances()}
    assert set(raw) == {i.id for i in launched}
    for inst in launched:
        r = raw[inst.id]
        assert r["InstanceType"] == "g5.xlarge" and r["ImageId"] == moto_aws.image
        assert r["InstanceLifecycle"] == "spot" and inst.spot
        assert r["SubnetId"] == policy.subnets[0] and inst.zone == "us-east-1b"
        assert [g["GroupId"] for g in r["SecurityGroups"]] == policy.security_groups
        assert r["MetadataOptions"]["HttpTokens"] == "required"
        assert r["MetadataOptions"]["InstanceMetadataTags"] == "enabled"
        assert inst.private_ip == r["PrivateIpAddress"]
        tags = {t["Key"]: t["Value"] for t in r["Tags"]}
        assert tags == {"jobplane:managed": "true", "jobplane:job-id": "train-1", "jobplane:attempt": "2",
                        "jobplane:owner": "alice", "Name": "jobplane-train-1-2", "team": "vision"}
        assert all(" " not in k and "/" not in k for k in tags)  # IMDS tag access forbids these in keys
        user_data = moto_aws.ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="userData")
        assert base64.b64decode(user_data["UserData"]["Value"]).decode() == req.user_data
        volumes = moto_aws.ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [inst.id]}])
        vol_tags = {t["Key"]: t["Value"] for v in volumes["Volumes"] for t in v.get("Tags", [])}
        assert vol_tags["jobplane:managed"] == "true" and vol_tags["jobplane:job-id"] == "train-1"


def test_single_node_on_demand_default_vpc(moto_aws: MotoAws) -> None:
    profile(moto_aws, "vm-profile")
    compute = Ec2Compute(AwsPlacement(placement_group="jobplane-cluster", instance_profile="vm-profile"),
                         REGION, moto_aws.ec2)
    compute.launch(request(moto_aws, num_nodes=1, spot=False, zone="us-east-1c"))
    sent = moto_aws.calls.run_instances[0]
    assert "Placement.GroupName" not in sent  # a cluster placement group only for multi-node jobs
    assert "InstanceMarketOptions.MarketType" not in sent
    assert sent["Placement.AvailabilityZone"] == "us-east-1c" and "SubnetId" not in sent
    assert sent["IamInstanceProfile.Name"] == "vm-profile"
    (inst,) = moto_aws.instances()
    assert inst["Placement"]["AvailabilityZone"] == "us-east-1c" and "InstanceLifecycle" not in inst


def test_a_spot_launch_under_max_price_bids_it_as_the_spot_max_price(moto_aws: MotoAws) -> None:
    compute = Ec2Compute(AwsPlacement(), REGION, moto_aws.ec2)
    compute.launch(request(moto_aws, num_nodes=1, max_price=0.5))
    sent = moto_aws.calls.run_instances[0]
    assert sent["InstanceMarketOptions.SpotOptions.MaxPrice"] == "0.500000"


@pytest.mark.parametrize("public_ip", [True, False])
def test_public_ip_request_goes_on_the_primary_interface_and_overrides_the_subnet(moto_aws: MotoAws,
                                                                                  public_ip: bool) -> None:
    vpc = moto_aws.ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = moto_aws.ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/20",
                                     AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    # the subnet's own setting says the opposite: the request must win
    moto_aws.ec2.modify_subnet_attribute(SubnetId=subnet, MapPublicIpOnLaunch={"Value": not public_ip})
    sg = moto_aws.ec2.create_security_group(GroupName="jobplane-vms", Description="vms", VpcId=vpc)["GroupId"]
    compute = Ec2Compute(AwsPlacement(subnets=[subnet], security_groups=[sg], public_ip=public_ip),
                         REGION, moto_aws.ec2)

    launched = compute.launch(request(moto_aws))

    sent = moto_aws.calls.run_instances[0]
    assert sent["NetworkInterface.1.DeviceIndex"] == 0
    assert sent["NetworkInterface.1.AssociatePublicIpAddress"] == str(public_ip).lower()
    assert sent["NetworkInterface.1.SubnetId"] == subnet
    assert sent["NetworkInterface.1.SecurityGroupId.1"] == sg
    assert "SubnetId" not in sent and "SecurityGroupId.1" not in sent  # EC2 refuses them at both levels
    raw = {i["InstanceId"]: i for i in moto_aws.instances()}
    assert len(launched) == 2
    for inst in launched:
        r = raw[inst.id]
        assert r["SubnetId"] == subnet and inst.zone == "us-east-1b"
        (nic,) = r["NetworkInterfaces"]  # moto lists an interface's groups there only
        assert [g["GroupId"] for g in nic["Groups"]] == [sg]
        assert ("PublicIpAddress" in r) is public_ip, r.get("PublicIpAddress")
        assert inst.private_ip == r["PrivateIpAddress"] and inst.private_ip.startswith("10.9.")


def test_without_public_ip_the_subnet_decides_and_no_interface_is_described(moto_aws: MotoAws) -> None:
    compute = Ec2Compute(placement(moto_aws), REGION, moto_aws.ec2)
    assert compute.placement.public_ip is None
    compute.launch(request(moto_aws, num_nodes=1))
    sent = moto_aws.calls.run_instances[0]
    assert not any(k.startswith("NetworkInterface") for k in sent)
    assert sent["SubnetId"] == compute.placement.subnets[0]


def test_client_token_is_deterministic_bounded_and_per_candidate(moto_aws: MotoAws) -> None:
    long = request(moto_aws, job_id="j" + "x" * 62, attempt=123)
    assert client_token(long, "subnet-1") == client_token(long, "subnet-1")
    assert len(client_token(long, "subnet-1")) <= 64 and client_token(long, "subnet-1").isascii()
    assert client_token(long, "subnet-1") != client_token(long, "subnet-2")
    assert client_token(long, None) != client_token(request(moto_aws, job_id=long.job_id, attempt=124), None)


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "Unsupported",
                                  "MaxSpotInstanceCountExceeded", "InsufficientFreeAddressesInSubnet"])
def test_capacity_codes_raise_capacity_error(moto_aws: MotoAws, code: str) -> None:
    moto_aws.calls.no_capacity.add(("g5.xlarge", None))
    moto_aws.calls.error_code = code
    with pytest.raises(CapacityError) as err:
        moto_aws.compute.launch(request(moto_aws))
    assert err.value.code == code
    assert moto_aws.instances() == []


def test_bad_image_is_rejected_not_retried(moto_aws: MotoAws) -> None:
    with pytest.raises(LaunchRejected) as err:
        moto_aws.compute.launch(request(moto_aws, image="ami-00000000deadbeef"))
    assert err.value.code.startswith("InvalidAMIID")
    assert moto_aws.calls.run_instances == []


def test_other_client_errors_are_rejections(moto_aws: MotoAws) -> None:
    moto_aws.calls.no_capacity.add(("g5.xlarge", None))
    moto_aws.calls.error_code = "InvalidParameterValue"
    with pytest.raises(LaunchRejected):
        moto_aws.compute.launch(request(moto_aws))


def test_zone_without_policy_subnet_is_rejected(moto_aws: MotoAws) -> None:
    compute = Ec2Compute(placement(moto_aws, "us-east-1a"), REGION, moto_aws.ec2)
    with pytest.raises(LaunchRejected) as err:
        compute.launch(request(moto_aws, zone="us-east-1b"))
    assert err.value.code == "NoSubnetInZone" and "us-east-1b" in str(err.value)


def test_list_managed_maps_fields_and_skips_unmanaged_and_terminated(moto_aws: MotoAws) -> None:
    launched = moto_aws.compute.launch(request(moto_aws))
    gone = moto_aws.compute.launch(request(moto_aws, job_id="old", num_nodes=1, spot=False))
    moto_aws.ec2.run_instances(ImageId=moto_aws.image, MinCount=1, MaxCount=1)  # not ours
    moto_aws.ec2.terminate_instances(InstanceIds=[gone[0].id])

    listed = sorted(moto_aws.compute.list_managed(), key=lambda i: i.rank or 0)

    assert [i.id for i in listed] == [i.id for i in launched]
    first = listed[0]
    assert first.managed and first.job_id == "train-1" and first.attempt == 2 and first.rank == 0
    assert first.spot and first.zone == "us-east-1b" and first.instance_type == "g5.xlarge"
    assert first.state in ("pending", "running") and first.launched_at.tzinfo is not None
    assert ("jobplane:owner", "alice") in first.tags


def test_terminate_only_managed_unprotected(moto_aws: MotoAws) -> None:
    ours = moto_aws.compute.launch(request(moto_aws, num_nodes=2))
    protected = ours[1].id
    moto_aws.ec2.modify_instance_attribute(InstanceId=protected, DisableApiTermination={"Value": True})
    foreign = moto_aws.ec2.run_instances(ImageId=moto_aws.image, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]

    moto_aws.compute.terminate([ours[0].id, protected, foreign, "i-0000000000000000"])

    states = {i["InstanceId"]: i["State"]["Name"] for i in moto_aws.instances()}
    assert states[ours[0].id] in ("shutting-down", "terminated")
    assert states[protected] in ("pending", "running")
    assert states[foreign] in ("pending", "running")


def test_an_image_alias_launches_the_ami_its_ssm_parameter_names(moto_aws: MotoAws) -> None:
    """ubuntu-24.04 on a Graviton type: the arm64 parameter is read and RunInstances gets its AMI (with that
    AMI's root device); a parameter that does not exist refuses the launch naming it."""
    image = moto_aws.ec2.register_image(
        Name="ubuntu-arm", Architecture="arm64", RootDeviceName="/dev/sda1", VirtualizationType="hvm",
        BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 8}}])["ImageId"]
    parameter = images.ALIASES["ubuntu-24.04"].aws[images.AARCH64]
    boto3.client("ssm", region_name=REGION).put_parameter(Name=parameter, Value=image, Type="String",
                                                          DataType="aws:ec2:image")
    compute = Ec2Compute(AwsPlacement(), REGION, moto_aws.ec2)
    resolved = images.resolve("aws", "ubuntu-24.04", "c7g.large")
    assert resolved == "resolve:ssm:" + parameter
    compute.launch(request(moto_aws, image=resolved, instance_type="c7g.large", num_nodes=1, zone=None))
    sent = moto_aws.calls.run_instances[-1]
    assert sent["ImageId"] == image and sent["BlockDeviceMapping.1.DeviceName"] == "/dev/sda1"
    with pytest.raises(LaunchRejected, match="image parameter '/aws/service/debian/release/12/latest/arm64'"):
        compute.launch(request(moto_aws, image=images.resolve("aws", "debian-12", "c7g.large"), zone=None))


def test_ssm_is_asked_where_ec2_is_never_at_aws(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An EC2 client pointed at a local endpoint (the local cloud's, a test's) gets its SSM there too, even
    with no AWS_ENDPOINT_URL in the environment: a test must never reach AWS."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_server)
    boto3.client("ssm", region_name=REGION, endpoint_url=moto_server).put_parameter(
        Name="/team/golden-ami", Value="ami-0123456789abcdef0", Type="String", Overwrite=True)
    assert Ec2Compute(AwsPlacement(), REGION, ec2).ami("resolve:ssm:/team/golden-ami") == "ami-0123456789abcdef0"
