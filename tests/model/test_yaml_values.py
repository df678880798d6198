"""Every value a YAML reader can produce is refused naming its field or read as YAML 1.2 reads it (issue 63's review
findings): a value PyYAML cannot build (an integer past Python's 4,300 digits, a `!!timestamp` that is no date) used
to escape as a plain ValueError, so a drop stayed in queue/ for every backstop run and a policy failed every function
naming no field; and 1.1's sexagesimal, octal and yes/no forms read `8:00` as 480 and `010` as 8."""

from __future__ import annotations

import pytest

from jobplane.model import keys, yaml_input
from jobplane.model.errors import SpecError
from jobplane.model.policy import parse_policy
from jobplane.model.spec import parse_spec
from tests.control.reconcile.day import Day

BASE = "run: python3 train.py\ninstance_type: t3.micro\n"
HUGE = "9" * 5000  # past Python's int() limit of 4,300 digits

UNBUILDABLE = [  # (spec text, the field it names)
    (BASE + "name: !!timestamp 2026-02-30\n", "name"),
    (BASE + f"max_restarts: {HUGE}\n", "max_restarts"),
    (BASE + "env:\n  A: !!binary zz\n", "env"),
    (BASE + "env:\n  A: !!python/object:os.system x\n", "env"),
    (BASE + "hyperparameters:\n  a: !!float nope\n", "hyperparameters"),
]


def refused(text: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        parse_spec(text, "j")
    return [e.path for e in err.value.errors]


@pytest.mark.parametrize(("text", "field"), UNBUILDABLE, ids=[f for _, f in UNBUILDABLE])
def test_a_value_yaml_cannot_build_is_refused_naming_its_field(text: str, field: str) -> None:
    assert refused(text) == [field]


def test_the_policy_names_the_field_too() -> None:
    for text in (f"max_active_instances: {HUGE}\n", "max_active_instances: !!timestamp 2026-02-30\n"):
        with pytest.raises(SpecError) as err:
            parse_policy(text)
        assert [e.path for e in err.value.errors] == ["max_active_instances"], text


def test_values_read_as_yaml_1_2_reads_them() -> None:
    read = yaml_input.load("a: 8:00\nb: 010\nc: 0o10\nd: 0x1f\ne: yes\nf: 1e-4\ng: 2026-02-30\nh: ~\ni:\nj: True\n"
                           "k: .inf\nl: 1_000\n")
    assert read == {"a": "8:00", "b": 10, "c": 8, "d": 31, "e": "yes", "f": 1e-4, "g": "2026-02-30", "h": None,
                    "i": None, "j": True, "k": float("inf"), "l": "1_000"}
    assert refused(BASE + "max_runtime: 8:00\n") == ["max_runtime"]  # not 480 s
    assert parse_spec(BASE + "name: 2026-02-30\n", "j").name == "2026-02-30"  # a name, not a date
    assert parse_spec(BASE + "max_restarts: 010\n", "j").max_restarts == 10  # not octal 8


def test_the_launcher_rejects_such_a_drop_and_keeps_it_with_the_reason(day: Day) -> None:
    key = keys.queue_entry("baddate", keys.DEFAULT_OWNER, "yaml")
    day.store.put(day.reg.key(key), (BASE + "name: !!timestamp 2026-02-30\n").encode())
    assert day.backstop()[0].result == "rejected"
    error = day.reg.get_json(keys.rejected_error("baddate"))
    assert error["errors"][0]["field"] == "name" and "day is out of range" in error["errors"][0]["message"]
    assert list(day.reg.listing(keys.QUEUE)) == [], "consumed: the next backstop run does not parse it again"
