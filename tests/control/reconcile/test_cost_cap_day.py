"""Per-job cost caps through a day on the manual clock (issue 59): `max_cost` asks the job to stop when its estimate
reaches it, as the uptime cap does (so it checkpoints), and ends it naming max_cost; `max_price` refuses an instance
type priced above it, naming the field."""

from __future__ import annotations

from jobplane.model import keys
from jobplane.model.states import State, StopBy
from tests.control.reconcile.day import Day

POLICY = b"prices: {t3.micro: 2.0}\n"  # $2 an hour: max_cost 5 is two and a half hours


def stop_request(day: Day, job_id: str) -> dict[str, object] | None:
    key = keys.stop_request(job_id)
    return day.reg.get_json(key) if day.reg.has(key) else None


def run_until(day: Day, job_id: str, until: str) -> str | None:
    """Every five minutes from 12:05 to `until` the job beats and the check runs; the first HH:MM a stop request
    was there after the check (None: never)."""
    hour, minute = 12, 5
    while f"{hour:02d}:{minute:02d}" <= until:
        hhmm = f"{hour:02d}:{minute:02d}"
        day.at(hhmm)
        day.beat(job_id)
        day.sweeper()
        if stop_request(day, job_id) is not None:
            return hhmm
        hour, minute = (hour + 1, 0) if minute == 55 else (hour, minute + 5)
    return None


def test_max_cost_stops_the_job_with_a_stop_request_at_about_two_and_a_half_hours(day: Day) -> None:
    day.reg.put(keys.POLICY, POLICY)
    assert day.drop("team-a", "capped", spec="max_cost: 5\n") == "launched"
    assert run_until(day, "capped", "16:00") == "14:30", "$5 at $2 an hour: 2.5 h after its 12:00 launch"
    request = stop_request(day, "capped")
    assert request is not None and request["by"] == StopBy.MAX_COST
    assert day.job("capped").state == State.RUNNING, "asked to stop: it checkpoints first"
    day.at("14:32")
    day.exits("capped", 0, 143, reason="stopped", stopped_by=StopBy.MAX_COST)
    day.sweeper(jobs=["capped"])
    record = day.job("capped")
    assert record.state == State.FAILED
    assert "max_cost" in (record.reason or "") and "$5.0" in (record.reason or ""), record.reason
    assert record.cause == "max-cost"
    assert "running" not in day.vms("capped")[1]


def test_a_job_that_does_not_stop_ends_a_stop_grace_after_its_max_cost(day: Day) -> None:
    day.reg.put(keys.POLICY, POLICY + b"safety: {stop_grace: 10m}\n")
    assert day.drop("team-a", "stubborn", spec="max_cost: 5\n") == "launched"
    assert run_until(day, "stubborn", "14:30") == "14:30"
    for hhmm in ("14:35", "14:40"):
        day.at(hhmm)
        day.beat("stubborn")
        day.sweeper()
    record = day.job("stubborn")
    assert record.state == State.FAILED and "max_cost" in (record.reason or ""), record.reason
    assert day.vms("stubborn")[1] == ["shutting-down"], "terminated by the check"


def test_a_job_under_its_max_cost_runs_on(day: Day) -> None:
    day.reg.put(keys.POLICY, POLICY)
    assert day.drop("team-a", "cheap", spec="max_cost: 50\n") == "launched"
    assert run_until(day, "cheap", "16:00") is None
    assert day.job("cheap").state == State.RUNNING


def test_the_policy_default_caps_a_spec_without_one_and_its_ceiling_refuses_naming_max_cost(day: Day) -> None:
    day.reg.put(keys.POLICY, POLICY + b"default_max_cost: 1\nmax_cost_ceiling: 100\n")
    assert day.drop("team-a", "dear", spec="max_cost: 200\n") == "invalid"
    assert "max_cost" in (day.job("dear").reason or "")
    assert day.drop("team-a", "plain") == "launched"
    assert run_until(day, "plain", "13:00") == "12:30", "the policy's $1 at $2 an hour"


def test_max_price_refuses_a_type_above_it_naming_the_field(day: Day) -> None:
    day.reg.put(keys.POLICY, b"")
    assert day.drop("team-a", "big", "p4d.24xlarge", spec="max_price: 10\n") == "invalid"
    reason = day.job("big").reason or ""
    assert "max_price" in reason and "p4d.24xlarge" in reason, reason
    assert day.drop("team-a", "both", spec="instance_type: [t3.micro, p4d.24xlarge]\nmax_price: 10\n") == "invalid"
    assert "p4d.24xlarge on-demand" in (day.job("both").reason or "")
    assert day.drop("team-a", "small", spec="max_price: 10\n") == "launched"


def test_an_ec2_spot_type_under_max_price_is_bid_at_it_and_reserved_at_most_at_it(day: Day) -> None:
    """EC2 Spot's price is known only at launch: the launch bids max_price (a Spot price above it is no capacity),
    and the admission's estimate is max_price rather than the on-demand ceiling."""
    day.reg.put(keys.POLICY, b"budgets: {monthly_usd: {team-a: 1000}}\n")
    assert day.drop("team-a", "bid", "p4d.24xlarge", spec="spot: true\nmax_price: 10\n") == "launched"
    (launch,) = day.compute.launches
    assert launch.max_price == 10 and launch.spot
    owner = day.reg.get_json(keys.admission_owner("team-a"))
    assert owner["reservations"][0]["rate"] == 10, "p4d on-demand is $21.96; EC2 bills this Spot VM $10 at most"
    (used,) = day.job("bid").usage
    assert (used.price, used.price_source) == (10, "on-demand price, Spot's ceiling"), "no Spot price seen: the bid"
    assert day.drop("team-a", "od", "p4d.24xlarge", spec="spot: {fallback: on_demand, after: 20m}\nmax_price: 10\n") \
        == "invalid", "its on-demand fallback would cost more"
    assert "p4d.24xlarge on-demand costs $21.9600 an hour" in (day.job("od").reason or "")
