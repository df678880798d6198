"""Why a job waits (issue 58): one function says it (jobplane.decide.waiting.why), for the launcher's WAITING reason
and for every view of the queue (`jobplane queue`, describe's queue line, Client.queue, the dashboard's Queue page:
all jobplane.ops.queue.standing), so the record and the queue never disagree. On main the view built its reason from
the owner's record alone (`quota: 0 of 3 nodes in use by nlp`) while the launcher, which checked the deployment's
cap first, recorded the deployment's figures; with a family cap full too, the two named different caps."""

from __future__ import annotations

from jobplane.model import keys
from jobplane.ops import queue
from tests.control.reconcile.day import Day


def agree(day: Day) -> list[tuple[str, str]]:
    """(job, why) for every job waiting in a line, after checking that its record says the same."""
    out = []
    for standing in queue.standing(day.reg, now=day.clock()):
        if standing.position is not None:
            assert standing.why == day.job(standing.job_id).reason, standing.job_id
            out.append((standing.job_id, standing.why))
    return out


def fill(day: Day, policy: str) -> None:
    """vision holds 3 nodes and research 2: the deployment's cap of 5 is full; nlp holds none."""
    day.reg.put(keys.POLICY, f"max_active_instances_per_owner: 3\nmax_active_instances: 5\n{policy}".encode())
    assert [day.drop("vision", f"v{n}") for n in (1, 2, 3)] == ["launched"] * 3
    assert [day.drop("research", f"r{n}") for n in (1, 2)] == ["launched"] * 2


def test_a_job_the_deployments_cap_holds_says_so_in_its_record_and_in_the_queue(day: Day) -> None:
    fill(day, "")
    day.at("12:01")
    assert day.drop("nlp", "n1") == "waiting"
    assert agree(day) == [("n1", "the deployment has 5 active instances; 1 more would exceed the quota of 5 "
                                 "(max_active_instances)")]


def test_with_a_full_family_cap_too_the_record_and_the_queue_name_the_same_cap(day: Day) -> None:
    fill(day, "max_active_by_family: {t3: 5}\n")
    day.at("12:01")
    assert day.drop("nlp", "n1") == "waiting"
    assert agree(day) == [("n1", "instance family 't3' has 5 active instances; 1 more would exceed the quota of 5 "
                                 "(max_active_by_family.t3)")]


def test_the_jobs_behind_in_a_line_and_the_owners_quota_agree_too(day: Day) -> None:
    fill(day, "")
    day.at("12:01")
    assert [day.drop("vision", "v4"), day.drop("nlp", "n1"), day.drop("nlp", "n2")] == ["waiting"] * 3
    assert agree(day) == [
        ("n1", "the deployment has 5 active instances; 1 more would exceed the quota of 5 (max_active_instances)"),
        ("n2", "1 earlier job of owner 'nlp' waits first (n1 next); 0 of 3 nodes in use "
               "(max_active_instances_per_owner)"),
        ("v4", "owner 'vision' has 3 active instances; 1 more would exceed the quota of 3 "
               "(max_active_instances_per_owner)")]
