"""What a spec may not do to the control plane: expand without bound (F7: a YAML alias bomb), carry
unbounded text that job.json and every event repeat (F10), ask for a stop grace nobody waits for (F9), or give a
duration past its ceiling (issue 37, G3: `max_wait: 3000000d` overflowed the launch decision's date). Each is
refused before validation or by it, naming the field, and the launcher keeps the drop under rejected/."""

from __future__ import annotations

import dataclasses
import tracemalloc

import pytest

from jobplane.model import bounds, keys, spec, yaml_input
from jobplane.model.bounds import format_duration
from jobplane.model.errors import SpecError
from jobplane.model.jobrecord import JobRecord
from jobplane.model.policy import Policy, check_against_policy, parse_policy
from jobplane.model.spec import MAX_SCRIPT, parse_spec
from tests.control.reconcile.day import Day

BASE = "run: python3 train.py\ninstance_type: t3.micro\n"


def bomb(depth: int) -> str:
    """The classic billion laughs: each level names the one below ten times (479 bytes at depth 7)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join(f'*a{i - 1}' for _ in range(10))}]" for i in range(1, depth + 1)]
    return BASE + "hyperparameters:\n" + "".join(f"  {line}\n" for line in lines)


def fields(text: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        parse_spec(text, "j")
    return [e.path for e in err.value.errors]


def test_an_alias_bomb_is_refused_before_it_expands_naming_the_field() -> None:
    text = bomb(9)  # 10^10 strings if it were expanded
    assert len(text) < 1000
    tracemalloc.start()
    try:
        assert fields(text) == ["hyperparameters"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 << 20, f"refusing it took {peak} bytes"


def test_any_alias_is_refused_and_plain_yaml_and_json_still_parse() -> None:
    assert fields(BASE + "env: &e\n  A: '1'\nlabels: *e\n") == ["labels"]
    assert parse_spec(BASE + "env:\n  A: '1'\n", "j").env == {"A": "1"}
    assert parse_spec('{"run": "python3 t.py", "instance_type": "t3.micro"}', "j").run == "python3 t.py"


def test_size_depth_and_node_count_are_capped() -> None:
    assert fields(BASE + "# " + "x" * yaml_input.MAX_BYTES + "\n") == ["(spec)"]
    deep = BASE + "hyperparameters:\n  h: " + "[" * (yaml_input.MAX_DEPTH + 1) + "]" * (yaml_input.MAX_DEPTH + 1) + "\n"
    assert fields(deep) == ["hyperparameters"]
    wide = BASE + "hyperparameters:\n  h: [" + ",".join(["1"] * (yaml_input.MAX_NODES + 1)) + "]\n"
    assert fields(wide) == ["hyperparameters"]


def test_run_and_setup_are_bounded_and_so_is_the_stop_grace() -> None:
    assert fields(f"run: '{'x' * (MAX_SCRIPT + 1)}'\ninstance_type: t3.micro\n") == ["run"]
    assert fields(BASE + f"setup: '{'x' * (MAX_SCRIPT + 1)}'\n") == ["setup"]
    assert parse_spec(f"run: '{'x' * MAX_SCRIPT}'\ninstance_type: t3.micro\n", "j").run == "x" * MAX_SCRIPT
    assert fields(BASE + "stop_grace: 100000d\n") == ["stop_grace"]
    assert fields(BASE + "stop_grace: 61m\n") == ["stop_grace"]
    assert parse_spec(BASE + "stop_grace: 1h\n", "j").stop_grace == 3600
    assert fields(BASE + "debug_hold: 25h\n") == ["debug_hold"]  # held VMs bill: a day at most
    assert parse_spec(BASE + "debug_hold: 30m\n", "j").debug_hold == 1800


def test_labels_in_jobplanes_namespace_are_refused() -> None:
    assert fields(BASE + "labels:\n  jobplane-owner: bob\n  jobplane-rank: '0'\n  team: a\n") == [
        "labels.jobplane-owner", "labels.jobplane-rank"]


def test_the_launcher_rejects_a_bomb_drop_and_keeps_it_with_the_reason(day: Day) -> None:
    key = keys.queue_entry("boom", keys.DEFAULT_OWNER, "yaml")
    day.store.put(day.reg.key(key), bomb(9).encode())
    assert day.backstop()[0].result == "rejected"
    error = day.reg.get_json(keys.rejected_error("boom"))
    assert error["errors"][0]["field"] == "hyperparameters" and "aliases" in error["errors"][0]["message"]
    assert list(day.reg.listing(keys.QUEUE)) == [], "consumed: the next backstop run does not parse it again"


DURATIONS = [  # every duration a spec has, its ceiling, and how a value is written there
    ("max_runtime", bounds.MAX_RUNTIME, "max_runtime: {}\n"),
    ("max_wait", bounds.MAX_WAIT, "max_wait: {}\n"),
    ("stall_timeout", bounds.MAX_STALL_TIMEOUT, "stall_timeout: {}\n"),
    ("boot_timeout", bounds.MAX_BOOT_TIMEOUT, "boot_timeout: {}\n"),
    ("stop_grace", bounds.MAX_STOP_GRACE, "stop_grace: {}\n"),
    ("debug_hold", bounds.MAX_DEBUG_HOLD, "debug_hold: {}\n"),
    ("spot.after", bounds.MAX_SPOT_WAIT, "spot: {{fallback: on_demand, after: {}}}\n"),
]


@pytest.mark.parametrize(("path", "ceiling", "form"), DURATIONS, ids=[d[0] for d in DURATIONS])
def test_every_duration_has_a_ceiling_refused_naming_the_field(path: str, ceiling: int, form: str) -> None:
    parse_spec(BASE + form.format(format_duration(ceiling)), "j")  # at the ceiling: fine
    for over in (ceiling + 1, "3000000d", 10 ** 30):
        with pytest.raises(SpecError) as err:
            parse_spec(BASE + form.format(over), "j")
        [error] = err.value.errors
        assert error.path == path and error.message.endswith(f"is more than the ceiling of "
                                                             f"{format_duration(ceiling)}"), error


def durations(schema: object, where: str = "") -> dict[str, int | None]:
    """Every duration (seconds, or a number with a unit) in a JSON Schema: where it is, and its maximum."""
    found: dict[str, int | None] = {}
    if isinstance(schema, dict):
        forms = schema.get("anyOf", [])
        if any(isinstance(f, dict) and "[smhd]" in f.get("pattern", "") for f in forms):
            found[where] = next((f.get("maximum") for f in forms if f.get("type") == "integer"), None)
        for key, value in schema.items():
            found |= durations(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            found |= durations(value, f"{where}/{i}")
    return found


def policy_durations(document: object, where: str = "") -> dict[str, int]:
    """Every duration field of the policy (jobplane.model.checked.duration): where it is, and its ceiling."""
    found: dict[str, int] = {}
    for field in dataclasses.fields(document):  # type: ignore[arg-type]
        value = getattr(document, field.name)
        if dataclasses.is_dataclass(value):
            found |= policy_durations(value, f"{where}{field.name}.")
        elif (ceiling := getattr(field.metadata["check"], "ceiling", None)) is not None:
            found[where + field.name] = ceiling
    return found


def test_no_duration_of_a_spec_or_the_policy_is_unbounded_and_the_schema_says_so() -> None:
    specs, policies = durations(spec.json_schema()), policy_durations(Policy())
    assert len(specs) == len(DURATIONS) and len(policies) == 9, policies
    assert [where for where, top in specs.items() if top is None] == []
    assert specs["/properties/max_wait/anyOf/0"] == bounds.MAX_WAIT


@pytest.mark.parametrize(("text", "path"), [
    ("max_runtime_ceiling: 31d\n", "max_runtime_ceiling"), ("default_max_runtime: 31d\n", "default_max_runtime"),
    ("max_wait_ceiling: 91d\n", "max_wait_ceiling"), ("default_max_wait: 3000000d\n", "default_max_wait"),
    ("default_stall_timeout: 8d\n", "default_stall_timeout"), ("default_boot_timeout: 25h\n", "default_boot_timeout"),
    ("safety: {orphan_grace: 2d}\n", "safety.orphan_grace"), ("safety: {stop_grace: 2d}\n", "safety.stop_grace"),
    ("idle_gpu: {window: 2d}\n", "idle_gpu.window"), ("max_attempts_per_job: 202\n", "max_attempts_per_job"),
    ("max_attempts_per_job: 0\n", "max_attempts_per_job"),
])
def test_the_policys_durations_and_attempts_have_ceilings_too(text: str, path: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_policy(text)
    assert [e.path for e in err.value.errors] == [path]


def test_the_policy_caps_max_wait_and_the_attempts_a_spec_may_ask_for() -> None:
    policy = parse_policy("max_wait_ceiling: 7d\nmax_attempts_per_job: 10\n")
    assert check_against_policy(parse_spec(BASE + "max_wait: 7d\nmax_restarts: 9\n", "j"), policy) == []
    assert [str(e) for e in check_against_policy(parse_spec(BASE + "max_wait: 8d\nmax_restarts: 10\n", "j"),
                                                 policy)] == [
        "max_wait: 8d exceeds the policy ceiling of 7d (max_wait_ceiling)",
        "max_restarts: max_restarts 10 and retry.max 0 allow 11 attempts; the policy allows 10 (max_attempts_per_job)"]
    retried = parse_spec(BASE + "max_restarts: 3\nretry: {max: 7, on_lost: true}\n", "j")
    assert [str(e) for e in check_against_policy(retried, policy)] == [
        "retry.max: max_restarts 3 and retry.max 7 allow 11 attempts; the policy allows 10 (max_attempts_per_job)"]
    assert check_against_policy(parse_spec(BASE + "max_restarts: 3\n", "j"), Policy()) == [], "the default: 20"


def test_a_record_accepted_before_a_ceiling_is_still_read_and_held_to_the_policy() -> None:
    """job.json written by a version without the ceilings: the registry reads it as it was accepted (a job must never
    become unreadable by an upgrade), and the policy bounds what the decisions take from it."""
    accepted = parse_spec(BASE + "max_wait: 1d\n", "old")
    huge = 3_000_000 * 86400
    body = JobRecord(id="old", spec=accepted.model_copy(update={"max_wait": huge, "stall_timeout": 30 * 86400}),
                     state="QUEUED", owner="default", created_at="2026-01-01T00:00:00Z",
                     updated_at="2026-01-01T00:00:00Z", state_since="2026-01-01T00:00:00Z").model_dump(mode="json")
    with pytest.raises(ValueError, match="max_wait"):
        JobRecord.model_validate(body)  # as a new spec: refused
    stored = JobRecord.model_validate(body, context=bounds.STORED)
    assert (stored.spec.max_wait, stored.spec.stall_timeout) == (huge, 30 * 86400)
    assert Policy().max_wait(stored.spec) == 14 * 86400
