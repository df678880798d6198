"""Training loops that save the way four libraries do, with small files, for tests/agent/test_library_saves.py.

Each is a simulation written from the libraries' own code (the order of writes, what is written last, what is
deleted and when), not their code:
- `trainer`: transformers' Trainer `_save_checkpoint`: `checkpoint-<global step>/` file by file (the model's
  config and generation config, its weights, the training arguments, optimizer, scheduler, RNG state,
  `trainer_state.json` last), then `_rotate_checkpoints` deletes the lowest-numbered beyond save_total_limit (2)
  with `shutil.rmtree`. Resumed by `get_last_checkpoint`: the highest-numbered `checkpoint-N` directory.
- `deepspeed`: `DeepSpeedEngine.save_checkpoint`: `global_step<N>/` (model states, each rank's optimizer
  states), the recovery script copied beside it, then `latest` (opened "w", the tag written). Resumed by
  `load_checkpoint`: the directory `latest` names.
- `dcp`: torch.distributed.checkpoint's FileSystemWriter in torchtitan's `step-<N>/` layout: each rank writes its
  `__<rank>_0.distcp` at once, then the coordinator writes `.metadata.tmp` and renames it to `.metadata`;
  torchtitan then purges all but the newest two (keep_latest_k). Resumed by torchtitan's rule: the
  highest-numbered `step-N` holding a `.metadata`.
- `lightning`: ModelCheckpoint(every_n_train_steps, save_top_k=2 by step, save_last=True), where TMPDIR is on
  another filesystem (a VM's tmpfs /tmp): `_atomic_save` pickles the checkpoint into a buffer and fsspec's commit
  copies it into `epoch=E-step=S.ckpt`, in place; the save beyond the top 2 is deleted; then `last.ckpt` is saved
  the same way, in place. Resumed by ckpt_path="last": the newest `last*.ckpt`, none: a fresh start.

Every file carries its step at its head and tail (`step N` ... `end N`), so a torn or mixed save shows; Lightning's
are zip archives whose pickle holds `global_step`, as torch.save writes them (`lightning_step`). The loop's log
opens with `began`; after a save (and its rotation) it appends `step began ended` (wall clock). With `handler`,
SIGTERM ends the loop after the save in progress; without, it kills the process.

`STEPPED_LIGHTNING` saves as ModelCheckpoint does, step by step when a test says so, and can stop in the middle of a
save's writes until killed: for the moments a random preemption rarely hits.
"""

from __future__ import annotations

import inspect
import io
import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path


def lightning_checkpoint(step: int, size: int) -> bytes:
    """A Lightning checkpoint as torch.save writes it: a zip whose data.pkl (protocol 2) begins with epoch and
    global_step."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps(
            {"epoch": step // 100, "global_step": step, "pytorch-lightning_version": "2.6.6",
             "state_dict": {"w": b"w" * size}}, protocol=2))
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


# the writers' own copy of it, and fsspec's commit across filesystems: shutil.move's copy into the file, in place
LIGHTNING_SAVES = "import io, pickle, time, zipfile\n" + inspect.getsource(lightning_checkpoint) + r"""
checkpoint = lightning_checkpoint

def commit(path, data, seconds, stop=None):  # three writes (sendfile's chunks); stop: after the first, until killed
    with open(path, "wb") as f:
        for i in range(3):
            f.write(data[i * len(data) // 3:(i + 1) * len(data) // 3])
            f.flush()
            if stop is not None:
                stop()
            time.sleep(seconds / 3)
"""

WRITER = LIGHTNING_SAVES + r"""
import os, pathlib, random, re, shutil, signal, sys, threading, time
habit, out, log, handler, step = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]), \
    sys.argv[4] == "handler", int(sys.argv[5])
stopping = False
if handler:
    def stop(*_):
        global stopping
        stopping = True
    signal.signal(signal.SIGTERM, stop)

def write(path, n, size=3000):  # one save call: open, a few writes (serializing: 10 ms a KB), close
    with open(path, "wb") as f:
        f.write(f"step {n}\n".encode())
        for _ in range(3):
            f.write(b"x" * (size // 3))
            f.flush()
            time.sleep(size / 3e5)
        f.write(f"\nend {n}\n".encode())

def numbered(pattern):
    found = [(int(m[1]), out / p) for p in os.listdir(out) if (m := re.fullmatch(pattern, p))]
    return [path for _, path in sorted(found)]

def trainer(n):
    d = out / f"checkpoint-{n}"
    d.mkdir(exist_ok=True)  # os.makedirs(..., exist_ok=True), as the libraries do
    for name in ("config.json", "generation_config.json", "model.safetensors", "training_args.bin",
                 "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
        write(d / name, n, 6000 if name in ("model.safetensors", "optimizer.pt") else 600)
    for old in numbered(r"checkpoint-(\d+)")[:-2]:  # save_total_limit=2
        shutil.rmtree(old, ignore_errors=True)

def deepspeed(n):
    d = out / f"global_step{n}"
    d.mkdir(exist_ok=True)  # os.makedirs(..., exist_ok=True), as the libraries do
    write(d / "mp_rank_00_model_states.pt", n, 6000)
    for rank in range(2):
        write(d / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", n, 4000)
    write(out / "zero_to_fp32.py", 0, 300)  # copied again at every save
    with open(out / "latest", "w") as f:
        f.write(f"global_step{n}")

def dcp(n):
    d = out / f"step-{n}"
    d.mkdir(exist_ok=True)  # os.makedirs(..., exist_ok=True), as the libraries do
    ranks = [threading.Thread(target=write, args=(d / f"__{rank}_0.distcp", n, 6000)) for rank in range(2)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join()
    write(d / ".metadata.tmp", n, 300)
    if (d / ".metadata").exists():
        (d / ".metadata").unlink()
    (d / ".metadata.tmp").rename(d / ".metadata")
    for old in numbered(r"step-(\d+)")[:-2]:  # keep_latest_k=2
        shutil.rmtree(old, ignore_errors=True)

def lightning(n):
    commit(out / f"epoch={n // 100}-step={n}.ckpt", checkpoint(n, 6000), 0.06)
    for old in numbered(r"epoch=\d+-step=(\d+)\.ckpt")[:-2]:  # save_top_k=2
        old.unlink()
    commit(out / "last.ckpt", checkpoint(n, 6000), 0.06)

save = {"trainer": trainer, "deepspeed": deepspeed, "dcp": dcp, "lightning": lightning}[habit]
out.mkdir(parents=True, exist_ok=True)
with log.open("a") as f:  # training has begun: the test's random run time counts from here, not from the launch
    f.write("began\n")
while True:
    time.sleep(random.uniform(0.1, 0.2))  # training steps
    step += 20
    began = time.time()
    save(step)
    with log.open("a") as f:
        f.write(f"{step} {began} {time.time()}\n")
    if stopping:
        sys.exit(0)
"""


def step_of(path: Path) -> int | None:
    """The step of a whole file; None if torn."""
    data = path.read_bytes()
    head, tail = data[:32].split(b"\n", 1)[0].split(), data.rstrip(b"\n").rsplit(b"\n", 1)[-1].split()
    if len(head) != 2 or head[0] != b"step" or tail != [b"end", head[1]]:
        return None
    return int(head[1])


def _numbered(out: Path, pattern: str, *, holding: str | None = None) -> list[tuple[int, Path]]:
    found = [(int(m[1]), p) for p in out.iterdir() if (m := re.fullmatch(pattern, p.name))]
    return sorted(item for item in found if holding is None or (item[1] / holding).exists())


def _whole_dir(directory: Path, names: tuple[str, ...], step: int) -> int:
    """The step, if every named file is there and whole at that step; else raises (the library would)."""
    for name in names:
        if not (directory / name).is_file():
            raise AssertionError(f"{directory.name} has no {name}: the library cannot load it")
        if step_of(directory / name) != step:
            raise AssertionError(f"{directory.name}/{name} is torn or of another step")
    return step


TRAINER_FILES = ("config.json", "generation_config.json", "model.safetensors", "training_args.bin", "optimizer.pt",
                 "scheduler.pt", "rng_state.pth", "trainer_state.json")


def resume_trainer(out: Path) -> int | None:
    """get_last_checkpoint: the highest checkpoint-N directory; the Trainer then loads every file of it."""
    found = [(n, p) for n, p in _numbered(out, r"checkpoint-(\d+)") if p.is_dir()]
    return _whole_dir(found[-1][1], TRAINER_FILES, found[-1][0]) if found else None


def resume_deepspeed(out: Path) -> int | None:
    """load_checkpoint(tag=None): the directory `latest` names (none: a fresh start)."""
    if not (out / "latest").is_file():
        return None
    tag = (out / "latest").read_text().strip()
    m = re.fullmatch(r"global_step(\d+)", tag)
    assert m is not None, f"latest names {tag!r}"
    return _whole_dir(out / tag, ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                  "zero_pp_rank_1_mp_rank_00_optim_states.pt"), int(m[1]))


def resume_dcp(out: Path) -> int | None:
    """torchtitan: the highest step-N holding a .metadata; DCP then reads every rank's shard."""
    found = _numbered(out, r"step-(\d+)", holding=".metadata")
    return _whole_dir(found[-1][1], (".metadata", "__0_0.distcp", "__1_0.distcp"), found[-1][0]) if found else None


def lightning_step(path: Path) -> int | None:
    """The global_step of a whole Lightning checkpoint; None if torn."""
    try:
        with zipfile.ZipFile(path) as z:
            state = pickle.loads(z.read("archive/data.pkl"))
    except (OSError, zipfile.BadZipFile, pickle.UnpicklingError, KeyError, EOFError):
        return None
    return int(state["global_step"])


def resume_lightning(out: Path) -> int | None:
    """ckpt_path="last" (Lightning 2.6's checkpoint connector): the newest `last*.ckpt` by mtime; without one, a
    fresh start. Every epoch=..-step=.. file restored must be whole and none newer than the step resumed: its state
    would not know it (an orphan restored at every attempt, and Lightning, at that step again, saves a -v1 beside
    it)."""
    saves = _numbered(out, r"epoch=\d+-step=(\d+)\.ckpt")
    for step, path in saves:
        assert lightning_step(path) == step, f"{path.name} is torn"
    lasts = [p for p in out.iterdir() if p.name.startswith("last") and p.suffix == ".ckpt"]
    if not lasts:
        return None
    last = max(lasts, key=lambda p: p.stat().st_mtime_ns)
    step = lightning_step(last)
    assert step is not None, f"{last.name} is torn"
    orphans = [path.name for n, path in saves if n > step]
    assert not orphans, f"{last.name} resumes step {step}, older than {orphans}: orphans its state does not know"
    return step


RESUME: dict[str, Callable[[Path], int | None]] = {"trainer": resume_trainer, "deepspeed": resume_deepspeed,
                                                     "dcp": resume_dcp, "lightning": resume_lightning}


# ModelCheckpoint(every_n_train_steps, save_top_k=TOP_K by step, save_last=LAST: "save" or "link") at each save the
# test tells it of, in order: flags/save-<n> holds "STEP TOP CUT": TOP "top" (the step is in the top k: its
# epoch=0-step=STEP.ckpt is saved, then the one beyond the top k deleted; _update_best_and_save) or "no-top" (by the
# metric it is not: only last.ckpt); CUT "epoch" or "last" (stops midway through that file's commit until killed),
# "unlinked" (link: stops after removing last.ckpt, before linking it again, as _link_checkpoint does), or "none".
STEPPED_LIGHTNING = LIGHTNING_SAVES + r"""
import os, pathlib, sys, time
out, flags, last, top_k = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
best, saved, n = [], None, 0
while True:
    n += 1
    while not (flags / f"save-{n}").exists():
        time.sleep(0.01)
    words = (flags / f"save-{n}").read_text().split()
    step, top, cut = int(words[0]), words[1] == "top", words[2]

    def halt():
        (flags / f"cut-{n}").touch()
        time.sleep(3600)

    if top:
        saved = out / f"epoch=0-step={step}.ckpt"
        commit(saved, checkpoint(step, 30000), 0.03, halt if cut == "epoch" else None)
        best.append(saved.name)
        for old in best[:-top_k]:
            os.remove(out / old)
        del best[:-top_k]
    if last == "link" and saved is not None:
        if os.path.lexists(out / "last.ckpt"):
            os.remove(out / "last.ckpt")
        if cut == "unlinked":
            halt()
        os.symlink(saved.name, out / "last.ckpt")
    else:
        commit(out / "last.ckpt", checkpoint(step, 30000), 0.03, halt if cut == "last" else None)
    (flags / f"saved-{n}").touch()
"""
