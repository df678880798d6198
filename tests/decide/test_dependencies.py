"""A job's `after:` gate (jobplane.decide.dependencies): go on once every dependency is met (afterok: SUCCEEDED, an
array COMPLETED; afterany: ended; afternotok: ended otherwise), wait naming the ones not ended with their states,
fail naming the first that can no longer be met (or no longer exists); and what a spec's `after:` names wrongly."""

from __future__ import annotations

import pytest

from jobplane.decide.dependencies import Dependency, Entry, Failed, Waiting, entries, gate, problems
from jobplane.model.errors import FieldError
from jobplane.model.states import State


@pytest.mark.parametrize(("found", "step"), [
    pytest.param([], None, id="no dependency"),
    pytest.param([Dependency("a", State.SUCCEEDED), Dependency("b", State.SUCCEEDED)], None, id="all succeeded"),
    pytest.param([Dependency("a", State.SUCCEEDED), Dependency("b", State.RUNNING),
                  Dependency("c", State.WAITING_CAPACITY)],
                 Waiting("waiting for b (RUNNING), c (WAITING_CAPACITY) (after)", ("b", "c")), id="some not ended"),
    pytest.param([Dependency("a", State.RUNNING), Dependency("b", State.CANCELLED, "cancelled by ana")],
                 Failed("dependency b ended CANCELLED: cancelled by ana (after)"), id="one ended otherwise: fail"),
    pytest.param([Dependency("a", State.TIMED_OUT), Dependency("b", State.FAILED)],
                 Failed("dependency a ended TIMED_OUT (after)"), id="the first that ended otherwise is named"),
    pytest.param([Dependency("a", None)], Failed("dependency a no longer exists (after)"), id="gone"),
    pytest.param([Dependency("a", State.FAILED, kind="afterany"), Dependency("b", State.SUCCEEDED, kind="afterany")],
                 None, id="afterany: ended however"),
    pytest.param([Dependency("a", State.CANCELLED, kind="afternotok")], None, id="afternotok: ended otherwise"),
    pytest.param([Dependency("a", State.SUCCEEDED, kind="afternotok")],
                 Failed("dependency a ended SUCCEEDED: afternotok:a can never be met (after)"),
                 id="afternotok: it succeeded: fail"),
    pytest.param([Dependency("a", State.RUNNING, kind="afterany"), Dependency("arr", "RUNNING", array=True)],
                 Waiting("waiting for afterany:a (RUNNING), array arr (RUNNING) (after)", ("a", "arr")),
                 id="a kind and an array named as they wait"),
    pytest.param([Dependency("arr", "COMPLETED", array=True)], None, id="an array COMPLETED: every member SUCCEEDED"),
    pytest.param([Dependency("arr", "FAILED", "3 members: 2 SUCCEEDED, 1 FAILED", array=True)],
                 Failed("dependency array arr ended FAILED: 3 members: 2 SUCCEEDED, 1 FAILED (after)"),
                 id="an array FAILED: fail"),
    pytest.param([Dependency("arr", "CANCELLED", kind="afterany", array=True),
                  Dependency("b", "FAILED", kind="afternotok", array=True)], None, id="arrays: afterany, afternotok"),
    pytest.param([Dependency("arr", "COMPLETED", kind="afternotok", array=True)],
                 Failed("dependency array arr ended COMPLETED: afternotok:arr can never be met (after)"),
                 id="an array COMPLETED, afternotok: fail"),
])
def test_gate(found: list[Dependency], step: Waiting | Failed | None) -> None:
    assert gate(found) == step


def test_entries_read_slurms_kinds_and_a_plain_id_as_afterok() -> None:
    found = entries(["prep", "afterok:a", "afterany:b", "afternotok:c"])
    assert found == [Entry("afterok", "prep"), Entry("afterok", "a"), Entry("afterany", "b"), Entry("afternotok", "c")]
    assert [str(e) for e in found] == ["prep", "a", "afterany:b", "afternotok:c"]


def test_problems_name_each_entry_wrongly_named() -> None:
    exists = {"a": True, "arr": True, "gone": False}
    assert problems(["a", "afterany:arr"], "j", exists) == []
    assert problems(["afterany:a", "gone", "j", "afternotok:a"], "j", exists) == [
        FieldError("after[1]", "no job or array 'gone': submit what this one waits for first"),
        FieldError("after[2]", "a job cannot wait for itself"),
        FieldError("after[3]", "'a' is named twice")]
