"""What a spec may not do to the control plane: expand without bound (F7: a YAML alias bomb), carry
unbounded text that job.json and every event repeat (F10), or ask for a stop grace nobody waits for (F9).
Each is refused before validation or by it, naming the field, and the launcher keeps the drop under rejected/."""

from __future__ import annotations

import tracemalloc

import pytest

from jobplane import keys, yaml_input
from jobplane.errors import SpecError
from jobplane.spec import MAX_SCRIPT, parse_spec
from tests.reconcile.day import Day, day  # noqa: F401  (the fixture)

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


def test_the_launcher_rejects_a_bomb_drop_and_keeps_it_with_the_reason(day: Day) -> None:  # noqa: F811
    key = keys.queue_entry("boom", keys.DEFAULT_OWNER, "yaml")
    day.store.put(day.reg.key(key), bomb(9).encode())
    assert day.backstop()[0].result == "rejected"
    error = day.reg.get_json(keys.rejected_error("boom"))
    assert error["errors"][0]["field"] == "hyperparameters" and "aliases" in error["errors"][0]["message"]
    assert list(day.reg.listing(keys.QUEUE)) == [], "consumed: the next backstop run does not parse it again"
