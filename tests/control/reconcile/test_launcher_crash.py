"""The launcher dies between its claim and recording the attempt's VMs (a Lambda timeout, an OOM), F5.
Before: the job sat LAUNCHING with no VM until the boot timeout failed it (or burned a restart), and VMs
started before the crash waited 900 s for a cluster.json that never came. Now the check resumes the launch
of the same attempt, no restart counted: it adopts the VMs if RunInstances ran, else launches them."""

from __future__ import annotations

from typing import Any

import pytest

from jobplane.clouds.memory import MemoryCompute
from jobplane.control import launcher
from jobplane.decide.model import Rule
from jobplane.model import keys
from jobplane.model.states import State
from tests.control.reconcile.day import Day


class Died(BaseException):
    """The launcher's runtime was killed here."""


def rules(outcomes: list[Any]) -> list[tuple[str, str]]:
    return [(o.action.rule, o.result) for o in outcomes]


def crash_after(monkeypatch: pytest.MonkeyPatch, day: Day, where: str) -> None:
    """Kill the launcher right after the claim ("claim") or right after RunInstances ("run")."""
    if where == "claim":
        monkeypatch.setattr(launcher, "_launch", lambda *a, **k: (_ for _ in ()).throw(Died()))
        return
    real = MemoryCompute.launch

    def launched_then_died(self: MemoryCompute, request: Any) -> Any:
        real(self, request)
        raise Died

    monkeypatch.setattr(MemoryCompute, "launch", launched_then_died)


@pytest.mark.parametrize("where", ["claim", "run"])
def test_a_launch_cut_short_is_resumed_by_the_sweep_without_a_restart(day: Day, where: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        crash_after(m, day, where)
        with pytest.raises(Died):
            day.submit("cut", num_nodes=2)
    record = day.job("cut")
    assert record.state == State.LAUNCHING and record.instances == [] and record.attempt == 1
    day.at("12:05")
    assert rules(day.sweeper()) == [], "a launcher may still be at it: the grace is longer than any launcher run"
    day.at("12:11")
    assert rules(day.sweeper()) == [(Rule.RESUME_LAUNCH, "applied")]
    assert Rule.RESUME_LAUNCH not in [r for r, _ in rules(day.sweeper())], "once"
    resumed = day.job("cut")
    assert resumed.state == State.LAUNCHING and resumed.attempt == 1 and resumed.restarts == 0
    assert len(resumed.instances) == 2
    vms = day.vms("cut")
    if where == "run":  # RunInstances ran before the crash: those VMs are adopted, none launched again
        assert len(day.compute.launches) == 1 and vms == {1: ["running", "running"]}
    else:
        assert len(day.compute.launches) == 1 and vms == {1: ["pending", "pending"]}
    cluster = day.reg.get_json(keys.cluster("cut", 1))
    assert cluster["instances"] == resumed.instances
    day.at("12:13")
    day.beat("cut")
    assert rules(day.sweeper()) == [(Rule.STARTED, "applied")]


def test_the_backstop_stops_at_its_time_budget_and_the_next_run_goes_on(day: Day) -> None:
    for n in range(3):
        day.store.put(day.reg.key(keys.queue_entry(f"late-{n}", keys.DEFAULT_OWNER, "yaml")),
                      b"run: python3 train.py\ninstance_type: t3.micro\n")
    assert launcher.backstop(day.context(), now=day.clock(), min_age=0, budget=0) == []
    assert day.metrics.totals["BackstopBudgetSpent"] == 1
    launched = launcher.backstop(day.context(), now=day.clock(), min_age=0, budget=60)
    assert [o.result for o in launched] == ["launched"] * 3
