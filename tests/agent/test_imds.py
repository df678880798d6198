"""The IMDSv2 client against the fake metadata service: token flow, identity, tags, Spot notice."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from jobplane.agent.cli import cloud_adapters, parse_args
from jobplane.clouds.aws_imds import Ec2Metadata, MetadataError
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID
from jobplane.local.imds import FakeImds, ImdsInstance

pytestmark = pytest.mark.timeout(30)


class Imds(FakeImds):
    """The fake with what only these tests do to it: a request log, a notice withdrawn, tokens expired."""

    def __init__(self, instance: ImdsInstance) -> None:
        super().__init__(instance)
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def clear_notice(self) -> None:
        with self._lock:
            self._notice = None

    def expire_tokens(self) -> None:
        """Invalidate every issued token, as if their TTL ran out."""
        with self._lock:
            self._tokens.clear()


@pytest.fixture
def imds() -> Iterator[Imds]:
    inst = ImdsInstance("i-0123456789abcdef0", launch_index=2,
                        tags={TAG_JOB_ID: "train-1", TAG_ATTEMPT: "3"}, local_ipv4="127.0.0.7")
    with Imds(inst) as fake:
        yield fake


def test_identity_and_tags(imds: Imds) -> None:
    md = Ec2Metadata(imds.url)
    assert md.instance_id() == "i-0123456789abcdef0"
    assert md.rank() == 2
    assert md.tag(TAG_JOB_ID) == "train-1"
    assert md.tag(TAG_ATTEMPT) == "3"
    assert md.tag("jobplane:absent") is None
    assert md.local_ipv4() == "127.0.0.7"
    # one token for the whole session, every GET carried it
    assert [r for r in imds.requests if r[0] == "PUT"] == [("PUT", "/latest/api/token", 200)]
    assert all(status in (200, 404) for _, _, status in imds.requests)


def test_the_agent_takes_the_endpoint_from_its_environment(imds: Imds, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url + "/")
    _, metadata, _, _ = cloud_adapters(parse_args(["--cloud", "aws", "--bucket", "b", "--region", "us-east-1"]))
    assert metadata.instance_id() == "i-0123456789abcdef0"


def test_spot_notice_404_then_served(imds: Imds) -> None:
    md = Ec2Metadata(imds.url)
    assert md.preemption_notice() is None
    served = imds.set_notice("terminate")
    assert md.preemption_notice() == served
    assert served["action"] == "terminate" and served["time"].endswith("Z")
    imds.clear_notice()
    assert md.preemption_notice() is None


def test_expired_token_is_refreshed(imds: Imds) -> None:
    md = Ec2Metadata(imds.url)
    assert md.rank() == 2
    imds.expire_tokens()
    assert md.rank() == 2
    assert [r for r in imds.requests if r[2] == 401] == [("GET", "/latest/meta-data/ami-launch-index", 401)]
    assert len([r for r in imds.requests if r[0] == "PUT"]) == 2


def test_fake_enforces_the_token_flow(imds: Imds) -> None:
    def status(req: urllib.request.Request) -> int:
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return err.code

    url = imds.url + "/latest/meta-data/instance-id"
    assert status(urllib.request.Request(url)) == 401  # IMDSv1 style: no token
    assert status(urllib.request.Request(url, headers={"X-aws-ec2-metadata-token": "forged"})) == 401
    token_url = imds.url + "/latest/api/token"
    assert status(urllib.request.Request(token_url, method="PUT")) == 400  # no TTL
    assert status(urllib.request.Request(token_url, method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": "99999"})) == 400
    assert status(urllib.request.Request(token_url, method="PUT", headers={
        "X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "1.2.3.4"})) == 403


def test_unreachable_service_is_a_clear_error() -> None:
    with FakeImds(ImdsInstance("i-gone")) as fake:
        url = fake.url
    md = Ec2Metadata(url, timeout=0.5, retries=2)
    with pytest.raises(MetadataError, match="api/token"):
        md.instance_id()
