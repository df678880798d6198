"""jobplane:network: how VMs in the stack's own VPC reach beyond S3. The default (public subnets, an
internet gateway, a public address per VM, no NAT) is the session synth; private-nat and isolated are one
session synth each (cdk-nag and cfn-lint check all three in test_checks)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.conftest import Synth, cdk_context
from tests.infra.iam_eval import Request, allows, role_statements

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]  # a cold cache downloads wheels

ARN = "arn:aws:ec2:us-east-1:123456789012"
ANYWHERE = "0.0.0.0/0"


def job_subnets(synth: Synth) -> list[str]:
    """Logical ids of the subnets the policy sends VMs to."""
    subnets = [s.strip("<>") for s in synth.policy().aws.subnets]
    assert len(subnets) == 2 and set(subnets) <= set(synth.resources("AWS::EC2::Subnet")), subnets
    return subnets


def route_table(synth: Synth, subnet: str) -> str:
    (table,) = [a["Properties"]["RouteTableId"]["Ref"]
                for a in synth.resources("AWS::EC2::SubnetRouteTableAssociation").values()
                if a["Properties"]["SubnetId"] == {"Ref": subnet}]
    return str(table)


def internet_routes(synth: Synth, subnet: str) -> list[dict[str, Any]]:
    """The subnet's routes to anywhere (where its traffic beyond the VPC goes)."""
    table = {"Ref": route_table(synth, subnet)}
    return [r["Properties"] for r in synth.resources("AWS::EC2::Route").values()
            if r["Properties"]["RouteTableId"] == table and r["Properties"].get("DestinationCidrBlock") == ANYWHERE]


def assert_s3_endpoint_serves(synth: Synth, subnets: list[str]) -> None:
    (endpoint,) = synth.resources("AWS::EC2::VPCEndpoint").values()
    props = endpoint["Properties"]
    assert props["VpcEndpointType"] == "Gateway" and ".s3" in str(props["ServiceName"])
    tables = [t["Ref"] for t in props["RouteTableIds"]]
    assert all(route_table(synth, s) in tables for s in subnets)
    assert len(synth.resources("AWS::EC2::FlowLog")) == 1


def subnet_props(synth: Synth, subnet: str) -> dict[str, Any]:
    return dict(synth.template["Resources"][subnet]["Properties"])


def subnet_type(synth: Synth, subnet: str) -> str:
    tags = {t["Key"]: t["Value"] for t in subnet_props(synth, subnet)["Tags"]}
    return str(tags["aws-cdk:subnet-type"])


# ---- default: public ---------------------------------------------------------------------------------
def test_default_gives_vms_public_addresses_behind_an_internet_gateway_and_no_nat(synth: Synth) -> None:
    assert not synth.resources("AWS::EC2::NatGateway") and not synth.resources("AWS::EC2::EIP")
    igw = synth.logical_id("AWS::EC2::InternetGateway", "IGW")
    assert synth.policy().aws.public_ip is True  # the launcher asks EC2 for one address per VM
    subnets = job_subnets(synth)
    assert sorted(subnets) == sorted(synth.resources("AWS::EC2::Subnet"))
    zones = {str(subnet_props(synth, s)["AvailabilityZone"]) for s in subnets}
    assert len(zones) == 2
    for subnet in subnets:
        assert subnet_type(synth, subnet) == "Public"
        # nothing in the subnet gets an address it did not ask for
        assert subnet_props(synth, subnet)["MapPublicIpOnLaunch"] is False
        (route,) = internet_routes(synth, subnet)
        assert route["GatewayId"] == {"Ref": igw}
    assert_s3_endpoint_serves(synth, subnets)


def test_vms_send_anywhere_and_accept_only_other_jobplane_vms(synth: Synth) -> None:
    sg = synth.logical_id("AWS::EC2::SecurityGroup", "JobSecurityGroup")
    props = synth.template["Resources"][sg]["Properties"]
    (egress,) = props["SecurityGroupEgress"]
    assert egress["CidrIp"] == ANYWHERE and egress["IpProtocol"] == "-1"  # every protocol and port
    assert "SecurityGroupIngress" not in props
    for ingress in synth.resources("AWS::EC2::SecurityGroupIngress").values():
        assert set(ingress["Properties"]) >= {"SourceSecurityGroupId"}
        assert not {"CidrIp", "CidrIpv6", "SourcePrefixListId"} & set(ingress["Properties"])


def test_functions_stay_outside_the_vpc(synth: Synth) -> None:
    # they need only AWS APIs; in the VPC the isolated variant would cut them off (and ENIs add cold starts)
    for name, fn in synth.functions().items():
        assert "VpcConfig" not in fn["Properties"], name


# ---- private subnets behind one NAT gateway ----------------------------------------------------------
def test_private_nat_has_one_nat_gateway_and_sends_vms_to_private_subnets(private_nat: Synth) -> None:
    (nat_id,) = private_nat.resources("AWS::EC2::NatGateway")
    assert len(private_nat.resources("AWS::EC2::EIP")) == 1
    assert private_nat.policy().aws.public_ip is False
    subnets = job_subnets(private_nat)
    nat_subnet = private_nat.template["Resources"][nat_id]["Properties"]["SubnetId"]["Ref"]
    assert nat_subnet not in subnets and subnet_type(private_nat, nat_subnet) == "Public"
    for subnet in subnets:
        assert subnet_type(private_nat, subnet) == "Private"
        assert subnet_props(private_nat, subnet)["MapPublicIpOnLaunch"] is False
        (route,) = internet_routes(private_nat, subnet)
        assert route["NatGatewayId"] == {"Ref": nat_id}  # both zones share the one gateway
    assert_s3_endpoint_serves(private_nat, subnets)
    # launches go to the private subnets only, never next to the NAT gateway
    role = private_nat.functions()["launcher"]["Properties"]["Role"]["Fn::GetAtt"][0]
    sts = role_statements(private_nat.template, role)
    assert all(allows(sts, Request("ec2:RunInstances", f"{ARN}:subnet/<{s}>")) for s in subnets)
    assert not allows(sts, Request("ec2:RunInstances", f"{ARN}:subnet/<{nat_subnet}>"))


# ---- isolated: S3 only -------------------------------------------------------------------------------
def test_isolated_has_no_way_out_but_the_s3_endpoint(isolated: Synth) -> None:
    for kind in ("AWS::EC2::InternetGateway", "AWS::EC2::VPCGatewayAttachment", "AWS::EC2::NatGateway",
                 "AWS::EC2::EIP"):
        assert not isolated.resources(kind), kind
    assert isolated.policy().aws.public_ip is False
    subnets = job_subnets(isolated)
    assert sorted(subnets) == sorted(isolated.resources("AWS::EC2::Subnet"))
    for subnet in subnets:
        assert subnet_type(isolated, subnet) == "Isolated"
        assert internet_routes(isolated, subnet) == []
    assert_s3_endpoint_serves(isolated, subnets)


def test_an_unknown_network_fails_the_synth_naming_the_field() -> None:
    import aws_cdk as cdk

    from infra.aws.stack import JobplaneStack

    app = cdk.App(context=cdk_context(**{"jobplane:network": "private"}))
    with pytest.raises(ValueError, match=r"jobplane:network: 'private' is not one of public, private-nat, isolated"):
        JobplaneStack(app, "Jobplane")
