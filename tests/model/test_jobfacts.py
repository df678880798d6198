"""The facts a vend function reads from job.json (jobplane.model.jobfacts): what JobRecord reads for the same
fields, the rest ignored, and a record that is not the asked job's, or whose facts do not parse, refused naming the
field."""

from __future__ import annotations

import json

import pytest

from jobplane.decide.vend import Caller, decide
from jobplane.model.errors import SpecError
from jobplane.model.jobfacts import parse_facts
from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import State
from tests.decide.helpers import record

RECORDS = [
    record("a"),
    record("b", State.LAUNCHING, attempt=3, instances=[], nodes=2),
    record("c", nodes=4, owner="team-vision", code="s3://reg/code/team-vision/src.tar.gz"),
    record("d", State.SUCCEEDED, attempt=2, code="gs://data/src.tar.gz"),
]


@pytest.mark.parametrize("job", RECORDS, ids=[r.id for r in RECORDS])
def test_the_facts_are_what_the_record_says_and_decide_answers_alike(job: JobRecord) -> None:
    facts = parse_facts(job.model_dump_json(exclude_none=True).encode(), job.id)
    for name in ("id", "state", "attempt", "instances"):
        assert getattr(facts, name) == getattr(job, name), name
    assert (facts.spec.owner, facts.spec.code) == (job.spec.owner, job.spec.code)
    caller = Caller(f"i-{facts.id}-{facts.attempt}-0", facts.id, facts.attempt, tags={})
    assert decide(facts, caller, bucket="reg", root="", deployment="reg") == decide(job, caller, bucket="reg", root="",
                                                                                   deployment="reg")


def test_fields_a_newer_version_added_are_ignored_at_every_level() -> None:
    body = json.loads(record("a").model_dump_json())
    body["colour"], body["spec"]["flavour"] = "blue", "mint"
    assert parse_facts(json.dumps(body).encode(), "a").state == State.RUNNING


@pytest.mark.parametrize(("change", "field"), [
    ({"id": "b"}, "id"),
    ({"state": "DREAMING"}, "state"),
    ({"attempt": "first"}, "attempt"),
    ({"attempt": -1}, "attempt"),
    ({"instances": "i-1"}, "instances"),
    ({"instances": ["i-1", 7]}, "instances[1]"),
    ({"spec": {"owner": "Team A"}}, "spec.owner"),
    ({"spec": {"code": 5}}, "spec.code"),
    ({"spec": None}, "spec"),
])
def test_facts_that_do_not_parse_are_refused_naming_the_field(change: dict[str, object], field: str) -> None:
    body = {**json.loads(record("a").model_dump_json()), **change}
    with pytest.raises(SpecError) as refused:
        parse_facts(json.dumps(body).encode(), "a")
    assert field in {e.path for e in refused.value.errors}, refused.value.errors


def test_a_record_without_its_spec_or_id_is_refused() -> None:
    with pytest.raises(SpecError) as refused:
        parse_facts(b'{"state": "RUNNING"}', "a")
    assert {e.path for e in refused.value.errors} == {"id", "spec"}
    with pytest.raises(ValueError, match="Expecting value"):
        parse_facts(b"not json", "a")
