"""Caps per instance family (issue 40), through a day on the manual clock: `max_active_by_family` bounds the nodes
all owners' jobs of one family hold at once (Kueue's nominal quota per resource flavor, an AWS Batch compute
environment's maxvCpus over its instance types), admitted by compare-and-swap on the family's own admission record;
other families go on, and when the cap binds a freed node goes to the owner furthest below its weight. On main the
policy had no such field and every job launched."""

from __future__ import annotations

import pytest

from jobplane.control import launcher
from jobplane.model import keys
from jobplane.model.admission import AdmissionRecord
from jobplane.model.errors import SpecError
from jobplane.model.policy import parse_policy
from jobplane.ops import queue
from jobplane.store import admission
from tests.control.reconcile.day import Day


def family(day: Day, name: str) -> AdmissionRecord:
    return admission.read(day.reg, keys.admission_family(name))[0]


def test_a_family_cap_holds_its_nodes_across_owners_and_a_freed_one_goes_by_fair_share(day: Day) -> None:
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 4\nmax_active_by_family: {t3: 2}\n")
    assert [day.drop("team-a", f"a{n}") for n in (1, 2, 3)] == ["launched", "launched", "waiting"]
    assert day.job("a3").reason == ("instance family 't3' has 2 active instances; 1 more would exceed the quota "
                                    "of 2 (max_active_by_family.t3)")
    day.at("12:01")
    assert day.drop("team-b", "b1") == "waiting"
    assert day.drop("team-c", "c1", "m5.large") == "launched", "another family is not capped"
    assert family(day, "t3").used() == 2 and [r.job_id for r in family(day, "t3").reservations] == ["a1", "a2"]
    full = "instance family 't3' has 2 active instances; 1 more would exceed the quota of 2 (max_active_by_family.t3)"
    assert [(s.job_id, s.why) for s in queue.standing(day.reg, now=day.clock())] == [("a3", full), ("b1", full)]
    assert day.job("b1").reason == full

    assert day.ends("a1", "12:10") == ["b1"], "team-b holds no node, team-a one: b first, though a3 came earlier"
    assert day.ends("a2", "12:20") == ["a3"]
    assert day.ends("c1", "12:30") == [], "a node of another family frees none of t3's"
    assert sorted(r.job_id for r in family(day, "t3").reservations) == ["a3", "b1"]


def test_a_job_bigger_than_its_familys_cap_is_invalid_naming_the_field(day: Day) -> None:
    day.reg.put(keys.POLICY, b"max_active_by_family: {t3: 2}\n")
    key = keys.queue_entry("big", "team-a", "yaml")
    day.store.put(day.reg.key(key), b"run: python3 train.py\ninstance_type: [m5.large, t3.micro]\nnum_nodes: 3\n")
    assert launcher.handle_drop(day.context(), key, now=day.clock()).result == "invalid"
    assert "max_active_by_family.t3" in (day.job("big").reason or "")


def test_the_caps_are_bounded_and_errors_name_the_field() -> None:
    assert parse_policy("max_active_by_family: {p4d: 4, a2: 8}").max_active_by_family == {"p4d": 4, "a2": 8}
    for text, field in [("max_active_by_family: {p4d: 0}", "max_active_by_family.p4d"),
                        ("max_active_by_family: {p4d: 100001}", "max_active_by_family.p4d"),
                        ("max_active_by_family: {p4d.24xlarge: 4}", "max_active_by_family.p4d.24xlarge")]:
        with pytest.raises(SpecError) as refused:
            parse_policy(text)
        assert field in {e.path for e in refused.value.errors}, refused.value.errors
