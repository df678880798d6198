"""What the agents and bootstraps of a job wrote, read by the reconcilers within a bound (docs/architecture.md).

Every VM's agent may write any of its job's keys, so what a job holds under its attempt is not ours to size: one
check serves every job of the deployment, in one function with a time and a memory limit. A check reads at most
one exit report per node of the attempt (ranks 0 to nodes - 1 of job.json's spec) and one boot failure, and a rerun
one preempted marker per job, each only if the listing says it is within records.MAX_FACT_BYTES; whatever else the
attempt holds (ranks past its nodes, keys no writer makes, objects over the bound) is never read: it is one ignored
fact, the attempt's own prefix, whose event the check records once (decide.model.ignore). Listing a prefix still
costs what the prefix holds: a listing page is 1,000 keys.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from jobplane.clouds.base import NotFound
from jobplane.decide.model import ExitReport, Ignored, PreemptedMark, Snapshot
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.store.registry import Registry

if TYPE_CHECKING:
    from jobplane.model import records  # the records' models: imported where a run reads one

log = logging.getLogger("jobplane.reconcile")

EXAMPLES = 3  # keys an ignored fact's reason names of each kind it ignored: its size stays bounded too


@dataclass(frozen=True)
class Attempt:
    """What the agents and bootstraps of one attempt reported."""

    exits: tuple[ExitReport, ...] = ()
    boot_failure: str | None = None
    unreadable: tuple[Ignored, ...] = ()  # reports that do not parse, and what the attempt holds beyond them
    noted: frozenset[str] = frozenset()  # ignored-fact flags already created


def read_attempt(reg: Registry, job_id: str, attempt: int, nodes: int) -> Attempt:
    """The attempt's exit reports and what a VM's bootstrap reported, if it did: one LIST of attempts/<n>/, then
    one GET per rank below `nodes` that has exited (and one for a boot failure), of an object the listing says is
    within the bound. Everything else the listing holds is one ignored fact, keyed by the attempt's prefix."""
    from jobplane.model import records  # what the agents wrote: only a run that reads an attempt needs the models

    exits: list[ExitReport] = []
    failure: str | None = None
    unreadable: list[Ignored] = []
    noted: set[str] = set()
    past, odd, big = [], [], []  # ranks past the attempt's nodes, keys no writer makes, objects over the bound
    for key, _, size in reg.listing(keys.attempt_prefix(job_id, attempt)):
        node = keys.parse_exit_report(key)
        if key.startswith(keys.ignored_flag(job_id, attempt, "")):
            noted.add(key)
        elif key == keys.cluster(job_id, attempt):
            continue  # the launcher's, for the agents: no check reads it
        elif key != keys.boot_failure(job_id, attempt) and (node is None or node[:2] != (job_id, attempt)):
            odd.append(key)
        elif node is not None and node.rank >= nodes:
            past.append(node.rank)
        elif size > records.MAX_FACT_BYTES:
            big.append(f"{key.removeprefix(keys.attempt_prefix(job_id, attempt))} ({size} bytes)")
        elif node is None:
            boot = _read(reg, key, records.BootFailure, unreadable)
            failure = boot.message[:500] if boot is not None else None
        elif (report := _read(reg, key, records.ExitReport, unreadable)) is not None:
            exits.append(ExitReport.of(node.rank, report))
    if past or odd or big:
        unreadable.append(Ignored(keys.attempt_prefix(job_id, attempt), excess(nodes, sorted(past), odd, big)))
    return Attempt(tuple(exits), failure, tuple(unreadable), frozenset(noted))


def excess(nodes: int, past: list[int], odd: list[str], big: list[str]) -> str:
    """Why an attempt's excess is ignored, naming a few of each kind."""
    from jobplane.model import records

    def some(items: list[str]) -> str:
        return ", ".join(items[:EXAMPLES]) + (", ..." if len(items) > EXAMPLES else "")

    said = [f"{_n(len(past), 'exit report')} of ranks past the attempt's {_n(nodes, 'node')} (ranks {past[0]} to "
            f"{past[-1]})"] if past else []
    said += [f"{_n(len(big), 'object')} over the {records.MAX_FACT_BYTES >> 10} KiB a check reads ({some(big)})"
             ] if big else []
    said += [f"{_n(len(odd), 'key')} no writer makes ({some(odd)})"] if odd else []
    return "not read, now or later: " + "; ".join(said)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + "s" * (count != 1)


R = TypeVar("R", bound="records.Record")


def _read(reg: Registry, key: str, model: type[R], unreadable: list[Ignored]) -> R | None:
    """A record an agent or a bootstrap wrote; one that does not parse, or came back over the bound (rewritten
    since the listing), is added to `unreadable`."""
    from jobplane.model import records

    try:
        data = reg.get_bytes(key)
        if len(data) > records.MAX_FACT_BYTES:
            raise records.RecordError(f"{model.what}: {len(data)} bytes, over the {records.MAX_FACT_BYTES >> 10} "
                                      "KiB a check reads")
        return model.parse(data)
    except NotFound:
        return None  # deleted since the listing
    except records.RecordError as exc:
        log.warning("%s: %s", key, exc)
        unreadable.append(Ignored(key, str(exc)))
        return None


def preempted(reg: Registry) -> dict[str, PreemptedMark]:
    """The preempted-jobs/ markers as one listing gives them: when and how large (their bodies are not read)."""
    return {job_id: PreemptedMark(job_id, at, size=size) for key, at, size in reg.listing(keys.PREEMPTED)
            if (job_id := keys.parse_preempted_marker(key))}


def with_preempted(reg: Registry, snap: Snapshot, reading: Collection[str]) -> Snapshot:
    """The preempted-jobs/ markers from one listing, when the check has them to match: a job it reads (`reading`: a
    preempted attempt is rerun's) or a PREEMPTED marker (whose preempted-jobs/ marker it writes again if lost). A
    check of healthy jobs lists none."""
    if not reading and not any(m.state == State.PREEMPTED for found in snap.active.values() for m in found):
        return snap
    return replace(snap, preempted=preempted(reg))


def with_preempted_bodies(reg: Registry, snap: Snapshot, only: Collection[str] | None = None) -> Snapshot:
    """Read the preempted-jobs/ markers (few: jobs between preemption and rerun) for their attempt; with
    `only`, just those jobs' (the others keep what the listing said). A marker that does not parse, or is over
    the bound (not read), keeps the listing's view and says why (the decisions trust it for no attempt)."""
    marks: dict[str, PreemptedMark] = {}
    for job_id, mark in snap.preempted.items():
        if only is not None and job_id not in only:
            marks[job_id] = mark
            continue
        from jobplane.model import records  # only a run that found markers reads one

        if mark.size > records.MAX_FACT_BYTES:
            marks[job_id] = replace(mark, problem=f"{records.PreemptedMarker.what}: {mark.size} bytes, over the "
                                                  f"{records.MAX_FACT_BYTES >> 10} KiB a function reads")
            continue
        unreadable: list[Ignored] = []
        body = _read(reg, keys.preempted_marker(job_id), records.PreemptedMarker, unreadable)
        if unreadable:
            marks[job_id] = replace(mark, problem=unreadable[0].why)
        elif body is not None:  # else cleared since the listing
            marks[job_id] = replace(mark, attempt=body.attempt, instance_id=body.instance_id)
    return replace(snap, preempted=marks)
