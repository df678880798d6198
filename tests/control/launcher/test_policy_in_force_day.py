"""Waiting jobs are judged against the policy in force (issue 58), through a day on the manual clock: a job that can
no longer ever fit (its owner's quota or the deployment's cap lowered below its size) ends FAILED naming the field
at the next in-order pass, and the jobs behind it go on; a cap set while jobs run counts them. On main such a job
stayed at the head of its line, or of every line, until its max_wait (2 days by default), and a cap set while 4 nodes
ran let 4 more launch."""

from __future__ import annotations

from jobplane.decide.rules import LaunchCause
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.store import admission
from tests.control.reconcile.day import Day


def test_a_lowered_quota_ends_the_job_it_can_never_fit_and_the_line_goes_on(day: Day) -> None:
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 4\n")
    assert day.drop("team-a", "a1") == "launched"
    day.at("12:01")
    assert day.drop("team-a", "big", spec="num_nodes: 4\n") == "waiting"
    day.at("12:02")
    assert day.drop("team-a", "a2") == "waiting", "behind big"
    day.at("12:05")
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 2\n")
    day.backstop()
    big = day.job("big")
    assert big.state == State.FAILED and big.cause == LaunchCause.NEVER_FITS
    assert big.reason == ("num_nodes: 4 nodes can never fit the owner quota of 2 active instances "
                          "(max_active_instances_per_owner), as the policy stands now")
    assert day.job("a2").state == State.LAUNCHING, "the job behind it goes on"


def test_a_lowered_cap_ends_the_job_it_can_never_fit_and_every_line_goes_on(day: Day) -> None:
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 3\nmax_active_instances: 4\n")
    assert [day.drop("team-b", f"b{n}") for n in (1, 2, 3)] == ["launched"] * 3
    assert day.drop("team-b", "b4") == "waiting", "team-b's quota"
    day.at("12:01")
    assert day.drop("team-a", "big", spec="num_nodes: 3\n") == "waiting", "the cap"
    day.at("12:05")
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 3\nmax_active_instances: 2\n")
    assert day.ends("b1", "12:10") == [], "the cap of 2 is full: b2 and b3 run"
    assert (day.job("big").state, day.job("big").reason) == (
        State.FAILED, "num_nodes: 3 nodes can never fit the deployment's cap of 2 active instances "
                      "(max_active_instances), as the policy stands now")
    assert day.ends("b2", "12:20") == ["b4"]


def test_a_cap_set_while_jobs_run_counts_them(day: Day) -> None:
    assert [day.drop("team-a", f"a{n}") for n in (1, 2, 3, 4)] == ["launched"] * 4
    day.at("12:05")
    day.reg.put(keys.POLICY, b"max_active_instances: 4\n")
    assert day.drop("team-b", "b1") == "waiting"
    assert day.job("b1").reason == ("the deployment has 4 active instances; 1 more would exceed the quota of 4 "
                                    "(max_active_instances)")
    assert day.ends("a1", "12:10") == ["b1"]
    deployment = admission.read(day.reg, keys.ADMISSION_DEPLOYMENT)[0]
    assert sorted(r.job_id for r in deployment.reservations) == ["a2", "a3", "a4", "b1"], "a1's end gave its node back"


def test_a_family_cap_set_while_jobs_run_counts_them(day: Day) -> None:
    assert [day.drop("team-a", f"a{n}") for n in (1, 2)] == ["launched"] * 2
    day.at("12:05")
    day.reg.put(keys.POLICY, b"max_active_by_family: {t3: 2}\n")
    assert day.drop("team-b", "b1") == "waiting"
    assert day.job("b1").reason == ("instance family 't3' has 2 active instances; 1 more would exceed the quota of 2 "
                                    "(max_active_by_family.t3)")
    assert day.ends("a1", "12:10") == ["b1"]
