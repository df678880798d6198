"""`secrets:` and `container.registry_auth` in a spec: bounded, each error naming its field; what job.json keeps of
them (names), what the vend function reads of them (model/jobfacts.py), and the grant decide.vend makes of them (the
session policy's statement naming exactly those secrets' parameters). Pure: no cloud."""

from __future__ import annotations

import json

import pytest

from jobplane.clouds.aws_secrets import parameter_path
from jobplane.decide.vend import Caller, Grant, decide
from jobplane.model.errors import SpecError
from jobplane.model.jobfacts import parse_facts
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.vending import aws_iam
from tests.decide.helpers import record

BASE = "instance_type: t3.micro\nrun: echo\nowner: team-s\n"


@pytest.mark.parametrize(("text", "field"), [
    ("secrets: {HF_TOKEN: Bad_Name}\n", "secrets.HF_TOKEN.name"),
    ("secrets: {HF_TOKEN: " + "a" * 33 + "}\n", "secrets.HF_TOKEN.name"),
    ("secrets: {JOBPLANE_X: hf}\n", "secrets.JOBPLANE_X"),
    ("env: {HF_TOKEN: x}\nsecrets: {HF_TOKEN: hf}\n", "secrets.HF_TOKEN"),
    ("secrets: {1BAD: hf}\n", "secrets.1BAD"),
    ("secrets: {A: {name: hf, file: maybe}}\n", "secrets.A.file"),
    ("secrets: {A: {name: hf, mode: 777}}\n", "secrets.A.mode"),
    ("secrets: {" + ", ".join(f"V{i}: s{i}" for i in range(8)) + "}\ncontainer: {image: x/y:1, registry_auth: r}\n",
     "secrets"),
    ("container: {image: x/y:1, registry_auth: 'user:token'}\n", "container.registry_auth"),
])
def test_a_bad_secret_field_is_refused_naming_it(text: str, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(BASE + text, "j1")
    assert field in [e.path for e in caught.value.errors], caught.value


def test_the_record_keeps_names_and_the_vend_grant_names_exactly_those_secrets() -> None:
    spec = parse_spec(BASE + "secrets: {HF_TOKEN: hf-token, KEY: {name: gcp-key, file: true}}\n"
                             "container: {image: x/y:1, registry_auth: registry}\n", "j1")
    assert spec.secret_names == ("gcp-key", "hf-token", "registry")
    rec = record("j1", State.RUNNING, 1, owner="team-s", secrets=spec.secrets, container=spec.container)
    facts = parse_facts(rec.model_dump_json().encode(), "j1")
    assert facts.spec.secret_names == spec.secret_names
    grant = decide(facts, Caller("i-j1-1-0", "j1", 1, tags={}), bucket="reg", root="", deployment="reg")
    assert isinstance(grant, Grant) and grant.scope.secrets == spec.secret_names
    assert grant.scope.secret_owner == "team-s"
    policy = aws_iam.session_policy(grant.scope, "aws", "reg")
    (reads,) = [st for st in policy["Statement"] if st["Action"] == "ssm:GetParameter"]
    assert reads["Resource"] == [f"arn:aws:ssm:*:*:parameter{parameter_path('reg', 'team-s', n)}/*"
                                 for n in spec.secret_names]
    assert len(aws_iam.packed(policy)) <= aws_iam.SESSION_POLICY_LIMIT
    bare = decide(parse_facts(record("j1", owner="team-s").model_dump_json().encode(), "j1"),
                  Caller("i-j1-1-0", "j1", 1, tags={}), bucket="reg", root="", deployment="reg")
    assert isinstance(bare, Grant) and "ssm" not in json.dumps(aws_iam.session_policy(bare.scope, "aws", "reg"))
    over = decide(parse_facts(record("j1", State.SUCCEEDED, owner="team-s", secrets=spec.secrets)
                              .model_dump_json().encode(), "j1"),
                  Caller("i-j1-1-0", "j1", 1, tags={}), bucket="reg", root="", deployment="reg")
    assert not isinstance(over, Grant)  # a finished job's VMs get no grant, so no secret
