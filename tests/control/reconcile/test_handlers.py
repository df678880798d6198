"""The AWS handlers, invoked with the events EventBridge delivers, against moto (in-process)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from functions.aws import rerun, sweeper, uptime_cap
from jobplane.local import triggers
from jobplane.local.ec2_runner import spot_warning, state_change
from jobplane.model import keys, records
from jobplane.model.states import State
from tests.helpers import LambdaContext as Context
from tests.helpers import wait_for
from tests.moto_aws import REGION, SCHEDULED, SPEC, MotoAws, beat, created, launch, report_exit

pytestmark = pytest.mark.timeout(120)


def rules(result: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    return [(a["rule"], a["job_id"], a["result"]) for a in result["actions"]]


def emitted(out: str) -> dict[str, Any]:
    """Metric values from the EMF lines Powertools printed."""
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"_aws"' in line]
    return {m["Name"]: doc[m["Name"]] for doc in docs for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}


def test_sweeper_cron_then_exit_report_event(moto_aws: MotoAws, capsys: pytest.CaptureFixture[str]) -> None:
    record = launch(moto_aws, "train")
    beat(moto_aws, record)
    capsys.readouterr()
    assert rules(sweeper.handler(SCHEDULED, Context())) == [("started", "train", "applied")]
    metrics = emitted(capsys.readouterr().out)
    assert metrics["ApiCalls"][0] >= 5 and "CheckDuration" in metrics  # 4 listings, DescribeInstances, GETs, puts
    exit_key = keys.exit_report("train", 1, 0)
    report_exit(moto_aws, record, 2)
    assert rules(sweeper.handler(created(exit_key), Context())) == [("finished", "train", "applied")]
    final = moto_aws.registry.job("train")
    assert final.state == State.FAILED and final.reason == "rank 0 exited with code 2" and final.exit_code == 2


def test_sweeper_state_change_event_and_dry_run(moto_aws: MotoAws) -> None:
    record = launch(moto_aws, "train")
    beat(moto_aws, record)
    event = triggers.ec2(state_change(record.instances[0], "running"), REGION) | {"dry_run": True}
    assert rules(sweeper.handler(event, Context())) == [("started", "train", "dry-run")]
    assert moto_aws.registry.job("train").state == State.LAUNCHING


def test_rerun_records_a_spot_warning_then_reruns_on_the_marker(moto_aws: MotoAws) -> None:
    record = launch(moto_aws, "spotty", SPEC + "spot: true\n")
    iid = record.instances[0]
    warning = triggers.ec2(spot_warning(iid), REGION)
    assert rerun.handler(warning, Context()) == {"instance_id": iid, "result": "recorded"}
    moto_aws.registry.mark_preempted("spotty", records.PreemptedMarker(attempt=1, rank=0, instance_id=iid))
    assert rules(rerun.handler(created(keys.preempted_marker("spotty")), Context())) == [
        ("rerun", "spotty", "applied")]
    after = moto_aws.registry.job("spotty")
    assert after.attempt == 2 and after.notices[0]["instance_id"] == iid and moto_aws.registry.preempted() == {}


def test_uptime_cap_cron_times_out_a_job_past_its_cap(moto_aws: MotoAws) -> None:
    record = launch(moto_aws, "brief", SPEC + "max_runtime: 1s\n")
    # the handler reads the clock and EC2's LaunchTime: its runs do nothing until a second of uptime has passed
    ran = wait_for("an uptime-cap run to act", lambda: rules(uptime_cap.handler(SCHEDULED, Context())), 60, 0.2)
    assert ran == [("timed-out", "brief", "applied")]
    final = moto_aws.registry.job("brief")
    assert final.state == State.TIMED_OUT and final.reason == "uptime cap 1s reached"
    assert {i["InstanceId"]: i["State"]["Name"] for i in moto_aws.instances()}[record.instances[0]] != "running"


@pytest.mark.timeout(60)
def test_handlers_never_import_google() -> None:
    # a *-nspkg.pth pre-registers empty `google` namespace stubs at startup: count modules with code only
    code = "import functions.aws.sweeper, functions.aws.rerun, functions.aws.uptime_cap, sys; " \
           "print(sorted(m for m, mod in sys.modules.items() if m.startswith('google') and " \
           "getattr(mod, '__file__', None)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
