"""`local up --faults`'s middleware over moto's real server (jobplane.local.api_faults), each fault as botocore reads
it: every service's throttle or server error in its own protocol, the local cloud's own calls spared, RunInstances'
ClientToken honoured as EC2 honours it (moto ignores it), a multi-node launch refused for capacity making nothing,
and a new instance missing from listings (not from a describe of its id) until its lag is over."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

from jobplane.clouds.aws_local import LOCAL_AGENT
from jobplane.clouds.faults import SERVICE_ERRORS, VISIBILITY_S, Faults
from jobplane.local.api_faults import FaultyApi

REGION = "eu-north-1"  # moto's backends are this process's: a region no other test of the worker uses
ONCE = Config(retries={"total_max_attempts": 1})  # what reaches the SDK, before its retries


@dataclass
class Api:
    url: str
    faults: Faults
    now: list[float]

    def client(self, service: str, config: Config = ONCE) -> object:
        return boto3.client(service, region_name=REGION, endpoint_url=self.url, config=config,
                            aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    now = [0.0]
    faults = Faults(0.0, seed=3)
    server = make_server("127.0.0.1", 0, FaultyApi(DomainDispatcherApplication(create_backend_app), faults,
                                                   clock=lambda: now[0]), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Api(f"http://127.0.0.1:{server.server_address[1]}", faults, now)
    finally:
        server.shutdown()
        thread.join()


def code_of(call: object) -> str:
    with pytest.raises(ClientError) as raised:
        call()  # type: ignore[operator]
    return str(raised.value.response["Error"]["Code"])


def test_each_service_answers_its_own_throttle_or_server_error(api: Api) -> None:
    api.faults.rate = 1.0
    calls = {"ec2": lambda c: c.describe_instances(), "s3": lambda c: c.list_buckets(),
             "sts": lambda c: c.get_caller_identity(), "ssm": lambda c: c.get_parameter(Name="/x"),
             "sns": lambda c: c.list_topics()}
    for service, call in calls.items():
        client = api.client(service)
        codes = {code_of(lambda: call(client)) for _ in range(8)}  # noqa: B023  # called at once
        assert codes and codes <= {e.code for e in SERVICE_ERRORS[service]}, (service, codes)
    spared = api.client("ec2", Config(retries={"total_max_attempts": 1}, user_agent_extra=LOCAL_AGENT))
    assert spared.describe_instances()["Reservations"] is not None  # type: ignore[attr-defined]
    api.faults.rate = 0.0


def test_run_instances_honours_its_client_token_and_refuses_a_multi_node_launch_for_capacity(api: Api) -> None:
    ec2 = api.client("ec2")
    image = ec2.describe_images()["Images"][0]["ImageId"]  # type: ignore[attr-defined]
    params = {"ImageId": image, "InstanceType": "t3.micro", "MinCount": 2, "MaxCount": 2}
    first = ec2.run_instances(ClientToken="job-1-abc", **params)  # type: ignore[attr-defined]
    again = ec2.run_instances(ClientToken="job-1-abc", **params)  # type: ignore[attr-defined]
    assert [i["InstanceId"] for i in again["Instances"]] == [i["InstanceId"] for i in first["Instances"]]
    before = len(ec2.describe_instances(InstanceIds=[i["InstanceId"] for i in first["Instances"]])  # type: ignore
                 ["Reservations"][0]["Instances"])
    api.faults.rate = 1.0
    try:
        assert code_of(lambda: ec2.run_instances(ClientToken="job-2-abc", **params)) in (  # type: ignore
            "InsufficientInstanceCapacity", *(e.code for e in SERVICE_ERRORS["ec2"]))
    finally:
        api.faults.rate = 0.0
    assert before == 2


def test_a_new_instance_is_missing_from_listings_until_its_lag_is_over_but_found_by_its_id(api: Api) -> None:
    ec2 = api.client("ec2")
    image = ec2.describe_images()["Images"][0]["ImageId"]  # type: ignore[attr-defined]
    api.faults.rate = 1e-9  # lags on, errors (all but) off
    try:
        api.now[0] = 1000.0
        made = [i["InstanceId"] for i in ec2.run_instances(  # type: ignore[attr-defined]
            ImageId=image, InstanceType="t3.micro", MinCount=3, MaxCount=3,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "lag", "Value": "yes"}]}])["Instances"]]

        def listed() -> set[str]:
            pages = ec2.describe_instances(Filters=[{"Name": "tag:lag", "Values": ["yes"]}])  # type: ignore
            return {i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"]}

        assert listed() < set(made)
        found = ec2.describe_instances(InstanceIds=made)["Reservations"]  # type: ignore[attr-defined]
        assert {i["InstanceId"] for r in found for i in r["Instances"]} == set(made)
        api.now[0] += VISIBILITY_S
        assert listed() == set(made)
    finally:
        api.faults.rate = 0.0
