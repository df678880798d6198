"""What each job costs: the launcher records the attempt's market and hourly price (EC2's Spot price history
at launch, the shipped table or the policy for on-demand), the reconcilers end its instances' time, and
`ls`, `describe` and `jobplane cost` show it, estimated. moto S3 + EC2; only the Spot price history is a
fixture (moto answers every type with one made-up price)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber
from click.testing import CliRunner

from jobplane.cli import cli
from jobplane.clouds.aws import Ec2Compute
from jobplane.control import launcher, reconcile
from jobplane.decide.rules import Rule
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import keys, records
from jobplane.model.admission import month_start
from jobplane.model.jobrecord import JobRecord
from jobplane.model.policy import AwsPlacement, Policy
from jobplane.model.states import State
from jobplane.model.usage import AttemptUsage, InstanceSpan
from jobplane.views import cost
from tests.moto_aws import MotoAws

pytestmark = pytest.mark.timeout(120)

SPOT = "instance_type: g5.xlarge\nzones: [us-east-1a]\nnum_nodes: 2\nspot: true\nrun: python3 train.py\n" \
       "labels: {team: vision}\n"
ON_DEMAND = "instance_type: g5.xlarge\nrun: python3 train.py\nlabels: {team: nlp}\n"


def history(now: datetime) -> list[dict[str, Any]]:
    """DescribeSpotPriceHistory as EC2 answers: several zones, products and changes, newest first."""
    def entry(zone: str, product: str, price: str, ago: timedelta) -> dict[str, Any]:
        return {"AvailabilityZone": zone, "InstanceType": "g5.xlarge", "ProductDescription": product,
                "SpotPrice": price, "Timestamp": now - ago}

    return [entry("us-east-1b", "Linux/UNIX", "0.3011", timedelta(minutes=5)),
            entry("us-east-1a", "Windows", "0.9132", timedelta(minutes=2)),
            entry("us-east-1a", "Linux/UNIX", "0.4213", timedelta(minutes=10)),
            entry("us-east-1a", "Linux/UNIX", "0.3907", timedelta(hours=3))]


def serve_history(client: Any) -> None:
    """The EC2 client answers DescribeSpotPriceHistory from the fixture (everything else goes to moto)."""
    def answer(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        return AWSResponse("https://ec2.us-east-1.amazonaws.com/", 200, {}, None), \
            {"SpotPriceHistory": history(datetime.now(UTC))}

    client.meta.events.register("before-call.ec2.DescribeSpotPriceHistory", answer)


def test_spot_price_is_the_zones_linux_price_in_effect_at_launch() -> None:
    at = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    compute = Ec2Compute(AwsPlacement(), "us-east-1", boto3.client("ec2", region_name="us-east-1"))
    with Stubber(compute.client) as stub:
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": history(at)}, {
            "InstanceTypes": ["g5.xlarge"], "AvailabilityZone": "us-east-1a",
            "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"], "StartTime": at, "EndTime": at})
        assert compute.spot_price("g5.xlarge", "us-east-1a", at=at) == 0.4213
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": []})
        assert compute.spot_price("g5.xlarge", "us-east-1c", at=at) is None


def finish(moto_aws: MotoAws, job_id: str, code: int, at: datetime) -> JobRecord:
    """Every rank's agent reports, and a check at `at` records the outcome (and so the end of the instances)."""
    record = moto_aws.registry.job(job_id)
    for rank in range(record.spec.num_nodes):
        moto_aws.registry.put_json(keys.exit_report(job_id, record.attempt, rank),
                                records.ExitReport(code=code, instance_id=record.instances[rank]).body())
    reconcile.check(moto_aws.context(metrics=CountingMetrics()), now=at, jobs=[job_id])
    return moto_aws.registry.job(job_id)


def launch(moto_aws: MotoAws, job_id: str, text: str, owner: str, at: datetime) -> JobRecord:
    key = moto_aws.drop(job_id, text, owner=owner)
    assert launcher.handle_drop(moto_aws.context(metrics=CountingMetrics()), key, now=at).result == "launched"
    return moto_aws.registry.job(job_id)


def test_a_finished_spot_job_costs_its_instance_time_at_the_spot_price_of_its_launch(moto_aws: MotoAws) -> None:
    serve_history(moto_aws.ec2)
    t0 = datetime.now(UTC)
    launched = launch(moto_aws, "spot-1", SPOT, "alice", t0)
    (used,) = launched.usage
    assert (used.market, used.price, used.price_source, used.zone) == ("spot", 0.4213, cost.SPOT_HISTORY,
                                                                       "us-east-1a")
    assert [s.end for s in used.instances] == [None, None] and len(used.instances) == 2
    assert cost.job_cost(launched, t0 + timedelta(hours=1)).running

    done = finish(moto_aws, "spot-1", 0, t0 + timedelta(hours=2))
    assert done.state == State.SUCCEEDED
    spent = cost.job_cost(done, t0 + timedelta(days=3))  # ended: later reads give the same figure
    assert spent.usd == pytest.approx(2 * 2 * 0.4213) and spent.instance_hours == pytest.approx(4)
    assert not spent.running and spent.unpriced == 0
    launch_event = next(e for e in moto_aws.registry.events("spot-1") if e["kind"] == "launching" and e.get("price"))
    assert launch_event["market"] == "spot" and launch_event["price_source"] == "spot price history"


def test_an_on_demand_job_costs_the_table_price_or_the_policys(moto_aws: MotoAws) -> None:
    t0 = datetime.now(UTC)
    launch(moto_aws, "od-1", ON_DEMAND, "bob", t0)
    failed = finish(moto_aws, "od-1", 1, t0 + timedelta(minutes=30))
    assert failed.state == State.FAILED
    (used,) = failed.usage
    assert (used.market, used.price, used.price_source) == ("on-demand", 1.006, cost.TABLE)
    assert cost.job_cost(failed, t0 + timedelta(days=1)).usd == pytest.approx(0.503)

    moto_aws.set_policy(f"aws:\n  default_image: {moto_aws.image}\nprices: {{g5.xlarge: 0.8}}\n")
    priced = launch(moto_aws, "od-2", ON_DEMAND, "bob", t0)
    assert (priced.usage[0].price, priced.usage[0].price_source) == (0.8, cost.POLICY)


def test_a_rerun_ends_the_first_attempts_time_and_starts_the_next(moto_aws: MotoAws) -> None:
    t0 = datetime.now(UTC)
    launch(moto_aws, "twice", ON_DEMAND, "bob", t0)
    rerun = launcher.launch_attempt(moto_aws.context(metrics=CountingMetrics()), "twice",
                                    now=t0 + timedelta(minutes=20), expect={State.LAUNCHING}, expect_attempt=1,
                                    cause=Rule.BOOT_RETRY)
    first, second = rerun.usage
    assert first.instances[0].end == t0 + timedelta(minutes=20) and second.instances[0].end is None
    assert second.attempt == 2 and second.instances[0].start == t0 + timedelta(minutes=20)


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_ls_describe_and_cost_show_the_estimates_and_sum_them_by_owner(moto_aws: MotoAws) -> None:
    serve_history(moto_aws.ec2)
    t0 = datetime.now(UTC) - timedelta(hours=3)
    launch(moto_aws, "spot-a", SPOT, "alice", t0)
    finish(moto_aws, "spot-a", 0, t0 + timedelta(hours=2))  # 2 x 2 h x 0.4213 = 1.6852
    launch(moto_aws, "od-b", ON_DEMAND, "bob", t0)
    finish(moto_aws, "od-b", 1, t0 + timedelta(minutes=30))  # 0.5 h x 1.006 = 0.503
    launch(moto_aws, "od-a", ON_DEMAND.replace("nlp", "vision"), "alice", t0)
    finish(moto_aws, "od-a", 0, t0 + timedelta(hours=1))  # 1.006

    by_owner = run("cost", "--by", "owner", "--json")
    assert by_owner.exit_code == 0, by_owner.output
    rows = {r["owner"]: r for r in json.loads(by_owner.stdout)}
    assert rows["alice"]["usd"] == pytest.approx(1.6852 + 1.006) and rows["alice"]["jobs"] == 2
    assert rows["bob"]["usd"] == pytest.approx(0.503) and rows["bob"]["jobs"] == 1
    assert {r["basis"] for r in rows.values()} == {"estimated"}

    table = run("cost", "--by", "owner")
    assert table.exit_code == 0 and "EST. COST" in table.stdout and "~$2.69" in table.stdout
    assert "TOTAL" in table.stdout and "~$3.19" in table.stdout and "estimated" in table.stderr
    by_label = json.loads(run("cost", "--by", "label:team", "--json").stdout)
    assert {r["label:team"]: round(r["usd"], 4) for r in by_label} == {"vision": 2.6912, "nlp": 0.503}
    recent = json.loads(run("cost", "--since", "2h", "--json").stdout)  # only the last 2 h of instance time
    assert {r["job"] for r in recent} == {"spot-a"}

    listed = run("ls", "--all")
    assert "EST. COST" in listed.stdout and "~$1.69" in listed.stdout and "~$0.50" in listed.stdout
    rows_json = {r["id"]: r for r in json.loads(run("ls", "--all", "--json").stdout)}
    assert rows_json["od-b"]["cost"] == pytest.approx(0.503)
    described = " ".join(run("describe", "spot-a").stdout.split())  # as one line, whatever the wrapping
    assert "usage attempt 1: 2 x g5.xlarge spot in us-east-1a at $0.4213/h (spot price history), 4h00m instance " \
           "time -> ~$1.69 (estimated)" in described
    assert json.loads(run("describe", "od-b", "--json").stdout)["cost"]["basis"] == "estimated"
    assert run("cost", "--by", "colour").exit_code == 2


def test_cost_shows_each_owners_spend_this_month_against_its_budget(moto_aws: MotoAws) -> None:
    now = datetime.now(UTC)
    t0 = max(now - timedelta(hours=2), month_start(now))  # in this month, however early in it the test runs
    moto_aws.set_policy(f"aws:\n  default_image: {moto_aws.image}\nbudgets:\n  monthly_usd: {{bob: 1, carol: 50}}\n")
    launch(moto_aws, "od-1", ON_DEMAND, "bob", t0)
    finish(moto_aws, "od-1", 0, now)
    spent = 1.006 * max(60.0, (now - t0).total_seconds()) / 3600  # the table's g5.xlarge, as the row's estimate

    table = run("cost", "--by", "owner")
    assert table.exit_code == 0, table.output
    assert "budgets (calendar month, UTC; '|' warn line at 80%):" in table.stdout
    bob = next(line for line in table.stdout.splitlines() if line.startswith("  bob "))
    figures = f"${spent:,.2f} of $1.00 this month ({100 * spent:.0f}%)" if spent >= 1 else \
        f"${spent:.3f} of $1.00 this month ({100 * spent:.0f}%)"
    assert figures in bob, bob
    if spent >= 1:  # over its budget: marked, with what happens to its jobs
        assert "[################|####]>" in bob and "OVER BUDGET: new jobs refused until" in bob, bob
    assert "  carol  [................|....]  $0.00 of $50.00 this month (0%)" in table.stdout
    (row,) = json.loads(run("cost", "--by", "owner", "--json").stdout)
    assert row["usd"] == pytest.approx(spent) and row["spent_this_month_usd"] == pytest.approx(spent)
    assert (row["budget_usd"], row["budget_percent"], row["warn_at_percent"]) == (1, round(100 * spent, 2), 80)
    assert row["level"] == ("exceeded" if spent >= 1 else "warning" if spent >= 0.8 else "ok")


def test_prices_come_from_the_cloud_the_policy_or_the_table() -> None:
    policy = Policy(prices={"g5.xlarge": 0.9}, spot_prices={"a2-highgpu-1g": 1.2})
    assert cost.hourly_price("aws", "g5.xlarge", spot=False, policy=Policy()) == (1.006, cost.TABLE)
    assert cost.hourly_price("aws", "g5.xlarge", spot=False, policy=policy) == (0.9, cost.POLICY)
    assert cost.hourly_price("aws", "g5.xlarge", spot=True, policy=policy, observed_spot=0.31) == \
        (0.31, cost.SPOT_HISTORY)
    assert cost.hourly_price("aws", "g5.xlarge", spot=True, policy=policy) == (0.9, cost.SPOT_CEILING), \
        "an EC2 Spot price nobody told us: its on-demand price, the most EC2 bills it (never nothing)"
    assert cost.hourly_price("gcp", "a2-highgpu-1g", spot=True, policy=policy) == (1.2, cost.POLICY)
    price, source = cost.hourly_price("gcp", "g2-standard-8", spot=True, policy=Policy())
    assert source == cost.TABLE and price == pytest.approx(0.85362 * 0.4)
    assert cost.hourly_price("aws", "x9.huge", spot=False, policy=Policy()) == (None, cost.UNKNOWN)


def test_billing_counts_a_minute_at_least_and_only_the_window_asked_for() -> None:
    t0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    short = InstanceSpan(id="i-1", start=t0, end=t0 + timedelta(seconds=20))
    assert cost.billed_seconds(short, t0 + timedelta(hours=1)) == 60
    long = InstanceSpan(id="i-2", start=t0, end=t0 + timedelta(hours=10))
    assert cost.billed_seconds(long, t0 + timedelta(hours=11), since=t0 + timedelta(hours=9)) == 3600
    assert cost.billed_seconds(long, t0 + timedelta(hours=11), since=t0 + timedelta(hours=10, minutes=1)) == 0
    unknown = AttemptUsage(attempt=1, instance_type="x9.huge", market="on-demand", instances=[long])
    spent = cost.attempt_cost(unknown, t0)
    assert spent.unpriced == 1 and spent.usd == 0 and spent.instance_hours == 10
    assert cost.money(spent) == "?" and cost.money(cost.Cost(usd=0.00017)) == "~$0.0002"
    assert cost.money(cost.Cost(usd=12.345, unpriced=1)) == "~$12.35+?"
