"""The local cloud's ports are its own: a server it starts serves on a socket it bound first, so a port another
server already answers on fails the start naming the port and the option to change (a second `local up` once
took the first's moto as its own), and a dashboard beside it never prints another cloud's URL. Two whole clouds
side by side: tests/local/test_ssh.py."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from jobplane.local.cloud import PortInUse, ServiceProcess, local_policy
from jobplane.local.control import STATE_FILE
from jobplane.local.dashboard import UI_URL_FILE, Beside
from jobplane.local.loopback import LoopbackServer
from jobplane.model.policy import parse_policy
from jobplane.model.spec import SpecError

pytestmark = pytest.mark.timeout(60)


class Other(LoopbackServer):
    """Someone else's server: answers every request."""

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        request.send_response(200)
        request.send_header("Content-Length", "0")
        request.end_headers()


def test_a_service_on_a_port_another_server_answers_on_fails_naming_the_port(tmp_path: Path) -> None:
    with Other() as other:
        port = int(other.address.rsplit(":", 1)[1])
        service = ServiceProcess("jobplane.local.fake_gcs", port)
        try:
            with pytest.raises(PortInUse) as caught:
                service.start(tmp_path / "gcs.log")
        finally:
            service.stop()
        assert service.proc is None  # refused before anything started
    assert str(caught.value) == (f"port {port} on 127.0.0.1 is in use (by another local cloud?): choose another "
                                 "--port, or --port 0 for a free one")


def test_a_service_on_port_0_serves_on_the_port_it_was_handed(tmp_path: Path) -> None:
    service = ServiceProcess("jobplane.local.fake_gcs", 0, "--bucket", "b").start(tmp_path / "gcs.log")
    try:
        assert service.port and service.proc is not None and service.proc.poll() is None
        with urllib.request.urlopen(f"{service.url}/storage/v1/b/b", timeout=5) as answer:
            assert json.load(answer)["name"] == "b"
    finally:
        service.stop()


def test_the_dashboard_beside_on_a_busy_port_says_so_and_never_claims_the_other(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Other() as other:
        port = int(other.address.rsplit(":", 1)[1])
        beside = Beside(tmp_path, port, {})
        beside.stop()
    assert capsys.readouterr().out == (f"dashboard: not started: port {port} on 127.0.0.1 is in use (by another "
                                       "local cloud?): choose another --ui-port, or --ui-port 0 for a free one\n")
    assert not (tmp_path / UI_URL_FILE).exists()


def test_local_up_policy_fields_merge_over_the_local_policy_and_a_bad_one_is_named() -> None:
    policy = parse_policy(local_policy("aws:\n  subnets: [subnet-1]", {"access": {"ssh": True},
                                                                      "safety": {"stop_grace": "5s"}}))
    assert policy.access.ssh and policy.aws.subnets == ["subnet-1"]
    assert (policy.safety.stop_grace, policy.safety.orphan_grace, policy.max_nodes_per_job) == (5, 20, 4)
    assert not parse_policy(local_policy("")).access.ssh
    with pytest.raises(SpecError) as caught:
        local_policy("", {"access": {"shh": True}})
    assert [e.path for e in caught.value.errors] == ["access.shh"]


def test_local_up_refuses_a_policy_file_with_a_bad_field_before_starting_anything(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("access: {shh: true}\n")
    done = subprocess.run([sys.executable, "-m", "jobplane.cli", "local", "up", "--policy", str(policy), "--port", "0",
                           "--ui-port", "-1", "--state-dir", str(tmp_path / "state")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stderr.startswith(f"Error: {policy}: access.shh: unknown field"), done.stderr
    assert not (tmp_path / "state" / STATE_FILE).exists()
