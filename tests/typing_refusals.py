"""Writes a job record may not take, which mypy must refuse before anything runs: a misspelt field of a transition,
a wrong type for a field of an update, a misspelt field of a reconcile effect's transition (jobrecord.Updates).

Not a test module: `make typecheck` checks it (pyproject's [tool.mypy] modules). Each line carries the ignore of
the exact error mypy gives; strict mode warns of an unused ignore, so the check fails if mypy ever stops refusing
one of them (or refuses it for another reason). tests/store/test_registry.py keeps it in that list.
"""

from __future__ import annotations

from jobplane.decide.effects import Transition
from jobplane.model.states import State
from jobplane.store.registry import Registry


def write(reg: Registry) -> None:
    reg.transition("j", State.LAUNCHING, lauched_at=None)  # type: ignore[call-arg]
    reg.update("j", exit_code="zero")  # type: ignore[arg-type]
    Transition(State.FAILED, {"exit_cod": 1})  # type: ignore[typeddict-unknown-key]
