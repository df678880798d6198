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
- `lightning`: ModelCheckpoint with save_top_k=1 and save_last=True: the new `epoch=E-step=S.ckpt` (one
  torch.save, in place), the one it replaces deleted after it, then `last.ckpt` saved in place. Resumed by
  ckpt_path="last": `last.ckpt`, else the newest `epoch=..-step=..`.

Every file carries its step at its head and tail (`step N` ... `end N`), so a torn or mixed save shows. After a
save (and its rotation) the loop appends `step began ended` (wall clock) to its log. With `handler`, SIGTERM ends
the loop after the save in progress; without, it kills the process.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

WRITER = r"""
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
    before = [p for p in out.iterdir() if "epoch=" in p.name]
    write(out / f"epoch={n // 100}-step={n}.ckpt", n, 6000)
    for old in before:  # save_top_k=1: the one it replaces
        old.unlink()
    write(out / "last.ckpt", n, 6000)

save = {"trainer": trainer, "deepspeed": deepspeed, "dcp": dcp, "lightning": lightning}[habit]
out.mkdir(parents=True, exist_ok=True)
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


def resume_lightning(out: Path) -> int | None:
    """ckpt_path="last": last.ckpt; else the newest epoch=..-step=.. checkpoint."""
    if (out / "last.ckpt").is_file():
        step = step_of(out / "last.ckpt")
        assert step is not None, "last.ckpt is torn"
        return step
    found = _numbered(out, r"epoch=\d+-step=(\d+)\.ckpt")
    if not found:
        return None
    assert step_of(found[-1][1]) == found[-1][0], f"{found[-1][1].name} is torn"
    return found[-1][0]


RESUME: dict[str, Callable[[Path], int | None]] = {"trainer": resume_trainer, "deepspeed": resume_deepspeed,
                                                     "dcp": resume_dcp, "lightning": resume_lightning}
