"""One outcome type (issue 39): what the launcher, the reconcilers and the sweeps' reconcile say they did."""

from __future__ import annotations

import pytest

from jobplane.control import launcher, reconcile
from jobplane.decide.effects import Terminate
from jobplane.decide.model import Action, Rule
from jobplane.deployment.outcome import Outcome
from jobplane.sweeps import run


def test_the_launcher_the_reconcilers_and_the_sweeps_answer_with_one_type() -> None:
    assert launcher.Outcome is reconcile.Outcome is run.Outcome is Outcome


def test_an_actions_outcome_names_its_job_or_the_vms_of_a_jobless_one() -> None:
    orphans = Action(Rule.ORPHAN, None, "orphan i-1: managed instance without a job id", (Terminate(("i-1",)),))
    assert Outcome.of(orphans, reconcile.Result.REFUSED, "budget").subject == "i-1"
    finished = Action(Rule.FINISHED, "j", "every rank exited 0")
    said = Outcome.of(finished, reconcile.Result.APPLIED)
    assert (said.subject, said.acted.rule, said.trial) == ("j", Rule.FINISHED, None)
    with pytest.raises(ValueError, match="not the outcome of an action"):
        _ = Outcome("queue/a.yaml", launcher.Result.LAUNCHED).acted
