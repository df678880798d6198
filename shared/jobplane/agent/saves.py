"""Which files of a checkpoint directory make one save of a training library, and whether that save is whole.

A save is often not one file. The Hugging Face Trainer writes `checkpoint-N/` file by file (config, weights,
optimizer, scheduler, RNG state, `trainer_state.json` last) and then deletes the oldest beyond
`save_total_limit`; DeepSpeed writes `global_stepN/` and then a `latest` file beside it naming it;
torch.distributed.checkpoint writes one `.distcp` file per rank and `.metadata` last (torchtitan's `step-N/`);
PyTorch Lightning writes `epoch=E-step=S.ckpt` and deletes the one it replaces. Each file of such a save can be
closed and whole while the save is not: a resume rule that picks the highest number (transformers'
`get_last_checkpoint`) then crashes on the half save. So the files of a recognised save go to the bucket, and
stay named in a manifest, only as a set, once the save is whole:

- none of its files is held back by the per-file rules (open for writing, open at the stop, just created...);
- if it is the newest of its series (same parent directory, same naming pattern), the file its library writes
  last is there: `trainer_state.json` in `checkpoint-N/`, a `latest` beside `global_stepN/` naming it, a
  `.metadata` no older than every `.distcp` of a save holding shards. A library writes these on rank 0 (or on
  each node where its predecessor has one too), so another rank's save needs it only where its predecessor
  had it;
- if it is the newest of its series, it has every file its predecessor in the series has (names compared with
  the save's own number taken out): a save the stop cut between two files, whatever the library.

An older save of a series is no longer being written: only the first rule applies to it. Everything not
recognised here keeps the per-file rules (agent/checkpoints.py). `judge` is a pure function of one scan.

Lightning's `last.ckpt` is a copy of the newest save (or a link to it) that `ckpt_path="last"` resumes from alone:
named older than the newest whole `epoch=..-step=..` file beside it, it would resume an older state with the newer
saves restored beside it as orphans, so that save stands in for it (`stand_in`); its own step is read from the
checkpoint (`saved_step`).
"""

from __future__ import annotations

import itertools
import pickletools
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from jobplane.agent.transfer import Stat


@dataclass(frozen=True)
class Habit:
    """One library's way of naming a save: a path component (group 1: its number); the file it writes last in
    the save, or beside it naming the save (a pointer)."""

    library: str
    name: re.Pattern[str]
    marker: str | None = None
    pointer: str | None = None


HABITS = (
    Habit("the Hugging Face Trainer", re.compile(r"checkpoint-(\d+)"), marker="trainer_state.json"),
    Habit("DeepSpeed", re.compile(r"global_step(\d+)"), pointer="latest"),
    Habit("step_N", re.compile(r"step[_-](\d+)")),  # torchtitan's DCP saves, many scripts' own
    Habit("PyTorch Lightning", re.compile(r"(?:.*-)?epoch=\d+-step=(\d+)(?:[-.].*)?")),  # a file or a directory
)
LIGHTNING = HABITS[3]
# ModelCheckpoint's save_last (CHECKPOINT_NAME_LAST, "-vN" when one of that name existed): a copy of (or, with
# save_last="link", a link to) its newest save, which ckpt_path="last" resumes from
LAST = re.compile(r"last(?:-v\d+)?\.ckpt")
TEMP = re.compile(r"\.?tmp[A-Za-z0-9_]{6,8}")  # a library's temp file renamed into place: safetensors', Python's
SHARD, METADATA = ".distcp", ".metadata"  # torch.distributed.checkpoint: shards, then the metadata last
DCP = "torch.distributed.checkpoint"
POINTER_BYTES = 256  # a pointer longer than this names no save


@dataclass(frozen=True)
class Save:
    """One save: its path (relative; "" for the checkpoint directory itself), its series (parent, habit) and
    number, its files."""

    path: str
    habit: Habit | None  # None: a directory holding .distcp shards, by no naming pattern
    number: int
    files: frozenset[str]

    @property
    def label(self) -> str:
        """As the log names it: a directory ends in /."""
        return self.path if self.path in self.files else f"{self.path or '.'}/"

    @cached_property
    def series(self) -> tuple[str, str]:
        """Its parent directory ("" for the checkpoint directory) and habit."""
        return (_parent(self.path), self.habit.library if self.habit else f"{DCP} {self.path}")

    def inside(self, rel: str) -> str:
        """rel's name within the save, its habit's numbers taken out (global_step280/x -> global_step#/x); a
        pointer beside the save is ../<name>."""
        if rel == self.path or not self.path:
            name = rel
        elif rel.startswith(self.path + "/"):
            name = rel[len(self.path) + 1:]
        else:
            return f"../{_name(rel)}"
        return "/".join(_numberless(part) for part in name.split("/"))


def _numberless(part: str) -> str:
    for habit in HABITS:
        if (m := habit.name.fullmatch(part)) is not None:
            return part[:m.start(1)] + "#" + part[m.end(1):]
    return part


@dataclass
class Saves:
    """The saves found in one scan: each by path, the save of each file in one, and why some are not whole."""

    saves: dict[str, Save] = field(default_factory=dict)
    of: dict[str, str] = field(default_factory=dict)
    partial: dict[str, str] = field(default_factory=dict)

    def older(self, save: Save) -> list[Save]:
        """The saves of its series with a lower number, newest first."""
        return sorted((s for s in self.saves.values() if s.series == save.series and s.number < save.number),
                      key=lambda s: s.number, reverse=True)


def save_of(rel: str) -> tuple[str, Habit, int] | None:
    """The save a file belongs to by its path: the first component from the top that names one."""
    parts = rel.split("/")  # a scan's relative POSIX path
    for i, part in enumerate(parts):
        for habit in HABITS:
            if (m := habit.name.fullmatch(part)) is not None:
                return "/".join(parts[:i + 1]), habit, int(m[1])
    return None


def group(files: set[str] | Mapping[str, object]) -> Saves:
    """The saves among these files (paths relative to the checkpoint directory), by naming pattern, and the
    directories of .distcp shards named by none; a pointer (DeepSpeed's `latest`) is not grouped here."""
    found: dict[str, tuple[Habit | None, int, set[str]]] = {}
    for rel in files:
        if (named := save_of(rel)) is not None:
            path, habit, number = named
            found.setdefault(path, (habit, number, set()))[2].add(rel)
    grouped = {rel for _, _, members in found.values() for rel in members}
    loose = [rel for rel in files if rel not in grouped]
    shards = {_parent(rel) for rel in loose if rel.endswith(SHARD)}
    for directory in shards:
        found[directory] = (None, 0, {rel for rel in loose if _parent(rel) == directory})
    saves = Saves({path: Save(path, habit, number, frozenset(members)) for path, (habit, number, members)
                   in found.items()})
    saves.of = {rel: path for path, save in saves.saves.items() for rel in save.files}
    return saves


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


def _name(rel: str) -> str:
    return rel.rpartition("/")[2]


def judge(stats: Mapping[str, Stat], held: Mapping[str, str], pointers: Mapping[str, str] | None, *,
          rank: int) -> Saves:
    """The saves in one scan (relative path -> Stat of every file), with why each that is not whole is not.
    held: the files the per-file rules hold back, and why; pointers: the content of each pointer file (a
    DeepSpeed `latest`), which joins the save it names; None where it is not known (a manifest's files, before
    they are downloaded): the pointer rule is not applied."""
    saves = group(stats)
    for rel, named in (pointers or {}).items():  # `latest` goes up with the save it names, never ahead of it
        target = f"{_parent(rel)}/{named}" if _parent(rel) else named
        save = saves.saves.get(target)
        if save is not None and save.habit is not None and save.habit.pointer == _name(rel):
            saves.saves[target] = Save(save.path, save.habit, save.number, save.files | {rel})
            saves.of[rel] = target
    newest: dict[tuple[str, str], int] = {}
    for save in saves.saves.values():
        newest[save.series] = max(newest.get(save.series, save.number), save.number)
    for path, save in saves.saves.items():
        why = _partial(save, stats, held, pointers, rank, saves, newest[save.series] == save.number)
        if why is not None:
            saves.partial[path] = why
    return saves


def _partial(save: Save, stats: Mapping[str, Stat], held: Mapping[str, str], pointers: Mapping[str, str] | None,
             rank: int, saves: Saves, newest: bool) -> str | None:
    before = next(iter(saves.older(save)), None)
    names = {save.inside(rel) for rel in save.files}
    had = {before.inside(rel) for rel in before.files} if before is not None else set()
    for rel in sorted(save.files):
        if rel in held:
            name = save.inside(rel) if save.path != rel else rel
            if TEMP.fullmatch(_name(name)) is not None:
                return f"{_stands_for(name, had - names)} (being written as {_name(name)}: {held[rel]})"
            return f"being written ({name}: {held[rel]})"
    if not newest or save.path in save.files:  # its writer has moved on to a later save; or a save of one file
        return None
    habit = save.habit
    if habit is not None and habit.marker and (rank == 0 or habit.marker in had) and habit.marker not in names:
        return f"not finished: {habit.marker} is not there yet ({habit.library} writes it last)"
    if habit is not None and habit.pointer and pointers is not None:
        pointer = f"{save.series[0]}/{habit.pointer}" if save.series[0] else habit.pointer
        expected = rank == 0 or pointer in stats
        if expected and pointers.get(pointer) != _name(save.path):
            return f"not finished: no {habit.pointer} beside it names it yet ({habit.library} writes it after the save)"
    if rank == 0 or any(name.rpartition("/")[2] == METADATA for name in had):  # each shard directory's own
        for directory in sorted({_parent(rel) for rel in save.files if rel.endswith(SHARD)}):
            metadata = f"{directory}/{METADATA}" if directory else METADATA
            if metadata not in stats:
                return f"not finished: {save.inside(metadata)} is not there yet ({DCP} writes it last)"
            late = max((rel for rel in save.files if rel.endswith(SHARD) and _parent(rel) == directory),
                       key=lambda rel: stats[rel][1])
            if stats[late][1] > stats[metadata][1]:
                return f"not finished: {save.inside(metadata)} is older than {save.inside(late)} ({DCP} writes it last)"
    missing = sorted(had - names - {f"../{habit.pointer}" if habit and habit.pointer else ""})
    if before is not None and missing:
        return f"not finished: it has no {missing[0]}, which {before.label} has"
    return None


def _stands_for(temp: str, missing: set[str]) -> str:
    """What a library's temp file in a save will be renamed to: of the files its predecessor has and it lacks yet
    (beside the temp), safetensors' weights first (it writes them so), the first by name (shards go in order)."""
    beside = sorted(name for name in missing if _parent(name) == _parent(temp))
    found = next((name for name in beside if name.endswith(".safetensors")), beside[0] if len(beside) == 1 else None)
    return _name(found) if found is not None else "a file"


def saved_step(path: Path) -> int | None:
    """The global_step a Lightning checkpoint holds (torch.save's zip: a pickle whose dict begins with epoch and
    global_step), read from the pickle's first operations without unpickling it; None if it is torn (a zip's
    directory is at its end) or not one."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            if name is None:
                return None
            with archive.open(name) as pickled:
                key = None
                for op, arg, _ in itertools.islice(pickletools.genops(pickled), 64):
                    if op.name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                        continue
                    if key == "global_step":
                        return arg if isinstance(arg, int) and not isinstance(arg, bool) else None
                    key = arg if isinstance(arg, str) else None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, KeyError, RuntimeError):
        return None
    return None


def stand_in(rel: str, named: Mapping[str, object], step: int | None, exists: bool) -> Save | None:
    """Lightning's last.ckpt (rel) is a copy of its newest save: the newest whole epoch=..-step=.. file named
    beside it stands in for it where the version named is older (its global_step, `step`), or none is
    while the job has one (`exists`: there, or named before and unlinked for save_last="link"; cut before its first
    upload). ckpt_path="last" then resumes from
    the newest whole save, and no newer save restored beside it is an orphan its state does not know."""
    if LAST.fullmatch(_name(rel)) is None:
        return None
    newest = max((s for s in group(named).saves.values() if s.habit is LIGHTNING and s.path in s.files
                  and _parent(s.path) == _parent(rel)), key=lambda s: s.number, default=None)
    if newest is None:
        return None
    if rel in named:
        return newest if step is not None and step < newest.number else None  # unknown: as it is
    return newest if exists else None


def read_pointers(local: Path, stats: Mapping[str, Stat]) -> dict[str, str]:
    """The content of each pointer file in the scan (DeepSpeed's `latest`), if small and readable."""
    names = {habit.pointer for habit in HABITS if habit.pointer}
    found = {}
    for rel, st in stats.items():
        if _name(rel) in names and 0 < st[0] <= POINTER_BYTES:
            try:
                found[rel] = (local / rel).read_text(errors="replace").strip()
            except OSError:  # deleted since the scan
                continue
    return found
