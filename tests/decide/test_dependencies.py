"""A job's `after:` gate (jobplane.decide.dependencies): go on once every dependency SUCCEEDED, wait naming the ones
not ended with their states, fail naming the first that ended otherwise (or no longer exists)."""

from __future__ import annotations

import pytest

from jobplane.decide.dependencies import Dependency, Failed, Waiting, gate
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
])
def test_gate(found: list[Dependency], step: Waiting | Failed | None) -> None:
    assert gate(found) == step
