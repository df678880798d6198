"""A spec's `array:` section: its bounds, each refusal naming its field, a member's spec as the array drops it, and
the section round-tripping through job.json."""

from __future__ import annotations

import pytest

from jobplane.model.errors import SpecError
from jobplane.model.policy import check_against_policy, parse_policy
from jobplane.model.spec import JobSpec, known_fields, parse_spec, spec_to_json

BASE = "run: python3 train.py\ninstance_type: t3.micro\n"


def errors_of(doc: str, job_id: str | None = None) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(doc, job_id=job_id)
    return [str(e) for e in info.value.errors]


def test_an_array_parses_and_is_many_jobs_while_a_member_is_one() -> None:
    spec = parse_spec(BASE + "array: {size: 10, max_parallel: 3}\n", job_id="a")
    assert spec.array is not None and (spec.array.size, spec.array.parallel) == (10, 3)
    assert spec.fan_out is spec.array and spec.belongs_to is None
    assert parse_spec(BASE + "array: {size: 250}\n").array.parallel == 100  # type: ignore[union-attr]
    assert parse_spec(BASE + "array: {size: 7}\n").array.parallel == 7  # type: ignore[union-attr]
    member = parse_spec(BASE + "array: {size: 10, max_parallel: 3, index: 9}\nlabels: {array: a}\n", job_id="a-9")
    assert member.fan_out is None and member.belongs_to == ("array", "a")
    assert JobSpec.model_validate(known_fields(spec_to_json(member))) == member  # as job.json stores it
    newer = {**spec_to_json(spec), "array": {"size": 10, "max_parallel": 3, "stride": 2}}
    assert JobSpec.model_validate(known_fields(newer)) == spec  # a newer version's array field: ignored on read


@pytest.mark.parametrize(("section", "expected"), [
    ("{size: 0}", "array.size: Input should be greater than or equal to 1"),
    ("{size: 1001}", "array.size: Input should be less than or equal to 1000"),
    ("{size: 10, max_parallel: 0}", "array.max_parallel: Input should be greater than or equal to 1"),
    ("{size: 500, max_parallel: 101}", "array.max_parallel: Input should be less than or equal to 100"),
    ("{size: 3, max_parallel: 4}", "array.max_parallel: 4 exceeds the array's 3 members"),
    ("{max_parallel: 2}", "array.size: required field is missing"),
    ("{size: 3, every: 2}", "array.every: unknown field"),
    ("{size: 3, index: 1}", "array.index: set by jobplane on each member of an array (job <array>-<index>, label "
                            "array: <array>): leave it out"),
    ("{size: 3, index: 3}", "array.index: 3 is outside the array's 0 to 2"),
])
def test_errors_name_the_field(section: str, expected: str) -> None:
    errors = errors_of(BASE + f"array: {section}\n", job_id="a")
    assert any(e.startswith(expected) for e in errors), errors


def test_a_member_index_must_be_the_members_own() -> None:
    """Only the array's reconcile writes an index: a member's id is <array>-<index> and its label names the array."""
    labelled = BASE + "array: {size: 10, index: 4}\nlabels: {array: a}\n"
    assert parse_spec(labelled, job_id="a-4").array is not None
    for doc, job_id in ((labelled, "a-5"), (labelled, "b-4"), (BASE + "array: {size: 10, index: 4}\n", "a-4")):
        assert errors_of(doc, job_id) == ["array.index: set by jobplane on each member of an array (job "
                                          "<array>-<index>, label array: <array>): leave it out"], (doc, job_id)


def test_an_array_is_neither_a_sweep_nor_held_nor_labelled_array() -> None:
    sweep = ("sweep: {parameters: {lr: {uniform: [0.1, 0.2]}}, max_trials: 4, objective: {metric: loss, goal: "
             "minimize}}\n")
    assert errors_of(BASE + "array: {size: 4}\n" + sweep) == [
        "array: not with sweep: a sweep's trials differ by their parameters, an array's members by their index; "
        "submit one or the other"]
    assert errors_of(BASE + "array: {size: 4}\ndebug_hold: 30m\n") == [
        "debug_hold: not in an array: a failed member's held VMs would run beside the next members, past "
        "array.max_parallel; submit the failed member's spec as a job with debug_hold to look at it"]
    assert errors_of(BASE + "array: {size: 4}\nlabels: {array: x}\n") == [
        "labels.array: set on every member by the array"]
    many = "labels: {" + ", ".join(f"l{i}: v" for i in range(32)) + "}\n"
    assert errors_of(BASE + "array: {size: 4}\n" + many) == ["labels: a member adds the label array: at most 31 here"]


def test_the_array_id_leaves_room_for_its_members_ids() -> None:
    doc = BASE + "array: {size: 1000}\n"
    assert parse_spec(doc, job_id="a" * 59).array is not None  # a...a-999: 63 characters
    assert errors_of(doc, job_id="a" * 60) == [
        f"id: {'a' * 60!r} is too long for an array: its members are {'a' * 60}-999..., at most 63 characters; use "
        "at most 59"]
    assert parse_spec(BASE + "array: {size: 10}\n", job_id="a" * 61).array is not None  # a...a-9


def test_max_parallel_above_the_owner_quota_is_a_policy_error() -> None:
    spec = parse_spec(BASE + "num_nodes: 4\narray: {size: 30, max_parallel: 20}\n")
    assert check_against_policy(spec, parse_policy("max_active_instances_per_owner: 80\n")) == []
    [error] = check_against_policy(spec, parse_policy("max_active_instances_per_owner: 64\n"))
    assert str(error) == ("array.max_parallel: 20 members of 4 node(s) at once can never fit the owner quota of 64 "
                          "active instances")
    unset = parse_spec(BASE + "num_nodes: 4\narray: {size: 30}\n")  # the owner's quota queues them: no refusal
    assert check_against_policy(unset, parse_policy("max_active_instances_per_owner: 64\n")) == []
