"""Shared fixtures. Nothing here, or in any test, may reach a real cloud."""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Iterator

import pytest

from jobplane.local.moto_server import patch_moto, share_botocore_loader
from tests.warm import Warm

# Before anything imports boto3: fake credentials and a fixed region, so a mistake fails locally.
for _var, _val in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    # moto's EC2 with the one AMI the tests launch (tests/moto_aws.py's MOTO_AMI) rather than its thousands of
    # vendor AMIs, which every mock_aws() loaded again: 0.2 CPU s a test, about a fifth of the moto tests' time
    "MOTO_AMIS_PATH": os.path.join(os.path.dirname(__file__), "moto_amis.json"),
}.items():
    os.environ[_var] = _val
for _var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST"):
    os.environ.pop(_var, None)


# moto gives every mock_aws() a new default boto3 session, and a new session parses botocore's service models again
# (EC2's is megabytes of JSON): 0.1 CPU s a client, 8 s of test_cli_jobs' 15. One loader serves the test process.
share_botocore_loader()
# In-process moto (mock_aws) too: atomic S3 conditional writes, public SSM parameters (see jobplane.local.moto_server).
patch_moto()
# The fixtures more than one module uses, for every test package (none imports a fixture), and how xdist spreads the
# suite: moto_aws (in-process moto), day (a day on the manual clock), registry_cloud and reg (a registry on each
# cloud, for the CLI and the SDK); basetemp, which deletes old sessions' temporary directories while this one tests;
# and rewritten, which rewrites the test modules' asserts once, before the workers start.
pytest_plugins = ["tests.moto_aws", "tests.control.reconcile.day", "tests.registry_clouds", "tests.scheduling",
                  "tests.basetemp", "tests.rewritten"]


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """The collected suite's modules (moto, botocore's models, pydantic's, hypothesis) are hundreds of thousands of
    objects that live as long as the process: frozen, no collection walks them again, and collections come ten
    times less often. The collector's share of a worker's CPU fell from 15% to 6% (a chaos day and the CLI's tests)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def warm() -> Iterator[Warm]:
    """`python -m MODULE` and `python SCRIPT` forked from an interpreter with the CLI's and the agent's imports done
    (tests/warm.py): one server per worker, stopped at the session's end."""
    server = Warm()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """A moto server on loopback for HTTP-fidelity tests; yields its endpoint URL.

    It runs in its own process rather than as ThreadedMotoServer: in-process, the server and a test's
    client threads share one GIL, and a 16-thread CAS race runs several times slower.
    """
    import sys

    from tests.helpers import http_server

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with http_server(f"the moto server on {url}", [sys.executable, "-m", "jobplane.local.moto_server", "-H",
                                                   "127.0.0.1", "-p", str(port)], f"{url}/moto-api/"):
        yield url


@pytest.fixture
def moto_endpoint(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The moto server, reset, with boto3 pointed at it through AWS_ENDPOINT_URL."""
    import requests

    requests.post(f"{moto_server}/moto-api/reset", timeout=10)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    yield moto_server
