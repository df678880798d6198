"""decide.members and decide.trials.parent_of: which drops are a sweep's trials or an array's members. Only the
record's own member, of its owner and exactly its spec, is one; a claim of membership anywhere else is refused naming
each field, and a plain drop may not take a member id of a sweep or array that exists. Pure: no store."""

from __future__ import annotations

import pytest

from jobplane.decide.members import Parent, admit, claims
from jobplane.decide.trials import parent_of, trial_id
from jobplane.model.errors import FieldError
from jobplane.model.spec import JobSpec, parse_spec

BASE = "run: python3 train.py\ninstance_type: t3.micro\n"


def spec(job_id: str, extra: str = "", owner: str = "team-b") -> JobSpec:
    return parse_spec(BASE + extra, job_id=job_id).model_copy(update={"owner": owner})


MEMBER = spec("train-2", "labels: {array: train}\narray: {size: 3, index: 2}\n")
TRIAL = spec("exp-t003", "labels: {sweep: exp, trial: '3'}\n")


@pytest.mark.parametrize(("job_id", "parent"), [
    ("exp-t001", ("exp", False)), ("exp-t1000", ("exp", False)), ("arr-0", ("arr", True)), ("arr-12", ("arr", True)),
    ("a-1-2", ("a-1", True)), ("x-t001-3", ("x-t001", True)), ("run-2024", ("run", True)),
    ("exp-t000", None), ("exp-t0001", None), ("exp-t02", None), ("arr-03", None), ("solo", None), ("exp-x1", None),
])
def test_parent_of_inverts_trial_id(job_id: str, parent: tuple[str, bool] | None) -> None:
    assert parent_of(job_id) == parent
    if parent is not None:
        sweep_id, array = parent
        number = int(job_id.rsplit("-", 1)[1].removeprefix("t")) + array
        assert trial_id(sweep_id, number, array=array) == job_id


def test_claims_name_the_index_and_the_labels_jobplane_sets_on_members() -> None:
    assert claims(MEMBER) == ["array.index", "labels.array"]
    assert claims(TRIAL) == ["labels.sweep", "labels.trial"]
    assert claims(spec("j", "labels: {team: vision}\n")) == []


def fields(found: JobSpec | list[FieldError]) -> list[str]:
    assert isinstance(found, list), found
    return [e.path for e in found]


def test_only_the_records_own_member_is_admitted_and_then_as_the_record_made_it() -> None:
    made = MEMBER.model_copy()
    assert admit(MEMBER, "train-2", Parent("train", True, "team-b", made)) is made
    assert fields(admit(MEMBER, "train-2", Parent("train", True, "team-a", made))) == ["array.index", "labels.array"]
    assert fields(admit(MEMBER.model_copy(update={"run": "python3 other.py"}), "train-2",
                        Parent("train", True, "team-b", made))) == ["array.index", "labels.array"]
    assert fields(admit(MEMBER, "train-2", Parent("train", True, "team-b", None))) == ["array.index", "labels.array"]
    refused = admit(TRIAL, "exp-t003", None)
    assert fields(refused) == ["labels.sweep", "labels.trial"]
    assert isinstance(refused, list) and "submit the array or the sweep" in refused[0].message


def test_a_plain_drop_is_anyones_unless_its_id_is_a_member_id_of_a_sweep_that_exists() -> None:
    plain = spec("exp-t002")
    assert admit(plain, "exp-t002", None) is plain
    refused = admit(plain, "exp-t002", Parent("exp", False))
    assert fields(refused) == ["id"]
    assert isinstance(refused, list) and refused[0].message == (
        "'exp-t002' is a member id of sweep 'exp': jobplane makes its members; pick another id")
