"""From the agent's decision to stop a job to its exit, for a Trainer-like job with no SIGTERM handler (issue 64:
up to 10.7 s on a loaded 2-core machine), and where that time goes.

The job (STOPPED_JOB below) is what a Hugging Face Trainer run is to the kernel: one process with torch's intra-op
threads busy on matmuls (numpy's with --library numpy, or where torch is not installed), --workers DataLoader
workers forked from it (each with its parent's memory map), and a `checkpoint-N/` save every few steps whose
weights are written as safetensors does (a `.tmpXXXXXX` file renamed into place); or, with --job trainer, a real
Trainer. --load busy loops and --idle idle processes (a VM's
daemons) run beside it. Each stop is the agent's (`UserProcess.terminate` with the real Keeper's `freeze`), at a
random moment, split into its phases; in turn as before issue 64 (`whole`: every process on the machine read with
the job frozen, before the signal) and now (`group`: the processes the signal reaches before it, the rest after):

  stop_s    from terminate() to every thread of the group stopped (SIGSTOP, then wait_stopped's polling of /proc)
  scan_s    keeper.freeze: which files the processes hold open for writing (agent/writers.py's /proc scan),
            with fds_s and maps_s, what its two halves cost when run again right after (the job still frozen),
            and maps_read_s, the kernel's share of the second (the maps read, not parsed)
  exit_s    from SIGTERM (and SIGCONT) to the job's main process ending
  finish_s  from that to terminate() returning (the group's leftovers killed, the output pump drained; the exit is
            seen by a thread waiting on a pidfd, whose wake-up may come a few ms late: a small negative figure)

    .venv/bin/python bench/stop_time.py                    # 12 stops, 2 busy loops, 100 idle processes
    .venv/bin/python bench/stop_time.py --stops 4 --load 0
    .venv/bin/python bench/stop_time.py --job trainer --python /path/to/venv-with-transformers/bin/python

Writes bench/results/stop_time.json (and prints it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(ROOT), str(ROOT / "shared")]

import report  # noqa: E402

from jobplane.agent.keeper import Keeper, Node  # noqa: E402
from jobplane.agent.layout import Layout  # noqa: E402
from jobplane.agent.output import OutputLog  # noqa: E402
from jobplane.agent.process import UserProcess  # noqa: E402
from jobplane.agent.writers import PROC, _pids, _writable_fds, _writable_maps  # noqa: E402
from jobplane.clouds.memory import MemoryStore  # noqa: E402
from jobplane.model.spec import JobSpec  # noqa: E402
from jobplane.store.registry import Registry  # noqa: E402

STOPPED_JOB = r"""
import multiprocessing as mp, os, pathlib, sys, time
out, threads, workers, mib = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    if sys.argv[5] == "numpy":
        raise ImportError
    import torch
    torch.set_num_threads(threads)
    weights = torch.randn(mib << 18)  # float32: mib MiB
    a = torch.randn(256, 256)
    def train(): return (a @ a).sum()
    def dump(path): torch.save({"w": weights}, path)
except ImportError:
    import numpy as np
    weights, a = np.random.rand(mib << 17), np.random.rand(256, 256)
    def train(): return (a @ a).sum()
    def dump(path): np.save(open(path, "wb"), weights)

def worker(q):  # a DataLoader worker: batches, forever
    while True:
        q.put(os.urandom(1 << 14))

q = mp.get_context("fork").Queue(maxsize=16)
for _ in range(workers):
    mp.get_context("fork").Process(target=worker, args=(q,), daemon=True).start()
step = 0
while True:
    for _ in range(20):
        q.get()
        train()
    step += 1
    if step % 3 == 0:  # a Trainer save: the weights through a temp file, as safetensors writes them
        d = out / f"checkpoint-{step}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text("{}")
        dump(d / ".tmpWYajo3")
        os.replace(d / ".tmpWYajo3", d / "model.safetensors")
        (d / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    if step == 2:
        (out / "ready").touch()
"""


# --job trainer: a real Hugging Face Trainer (tiny GPT-2 from its config, no download) where --python has
# transformers and accelerate; its saves are the Trainer's own (safetensors' temp file, then the rest)
TRAINER_JOB = r"""
import pathlib, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
out, threads, workers = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=128, vocab_size=1000, n_positions=64))

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20
    def __getitem__(self, i):
        ids = torch.randint(0, 1000, (64,))
        return {"input_ids": ids, "labels": ids}

class Ready(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 4:
            (out / "ready").touch()

args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, save_steps=3, save_total_limit=2,
                         report_to=[], dataloader_num_workers=workers, use_cpu=True, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=Data(), callbacks=[Ready()]).train()
"""


def stop_once(tmp: Path, args: argparse.Namespace, rng: random.Random, whole: bool) -> dict[str, Any]:
    spec = JobSpec.model_validate({"instance_type": "t3.micro", "run": "python3 train.py"})
    procs: list[UserProcess] = []
    keeper = Keeper(Registry(MemoryStore()), Layout(tmp), spec, Node("stop", 1, 0), interval=60, say=lambda _: None,
                    step=lambda: None, processes=lambda: procs[0] if procs else None)
    if whole:  # as before issue 64: every process read with the job frozen, before the signal
        keeper.processes = lambda: None
    keeper.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    script = tmp / "train.py"
    script.write_text(TRAINER_JOB if args.job == "trainer" else STOPPED_JOB)
    proc = UserProcess(f"exec {args.python} {script} {keeper.checkpoint_dir} {args.threads} {args.workers}"
                       f" {args.mib} {args.library}", tmp, dict(os.environ), OutputLog(None))
    procs.append(proc)
    deadline = time.monotonic() + 120
    while not (keeper.checkpoint_dir / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the job did not start")
        time.sleep(0.05)
    time.sleep(rng.uniform(0.2, 1.5))  # a random moment: training, or inside a save
    marks: dict[str, float] = {}
    halves: dict[str, float] = {}

    def frozen() -> None:
        started = time.perf_counter()  # first the whole machine's scan by halves, the job frozen: what it costs
        pids = _pids(PROC)
        for pid in pids:
            _writable_fds(PROC / pid)
        halves["fds_s"], started = time.perf_counter() - started, time.perf_counter()
        for pid in pids:
            _writable_maps(PROC / pid)
        halves["maps_s"], started = time.perf_counter() - started, time.perf_counter()
        lines = 0
        for pid in pids:  # the kernel's share: the maps read, not parsed
            with contextlib.suppress(OSError):
                lines += (PROC / pid / "maps").read_bytes().count(b"\n")
        halves["maps_read_s"], halves["processes"], halves["map_lines"] = (time.perf_counter() - started, len(pids),
                                                                           lines)
        marks["frozen"] = time.perf_counter()
        keeper.freeze()  # the agent's
        marks["scanned"] = time.perf_counter()

    exit_fd = os.pidfd_open(proc.pid)  # readable once the job's main process ends, reaped or not

    def exited() -> None:
        select.select([exit_fd], [], [])
        marks["exited"] = time.perf_counter()

    threads = len(os.listdir(f"/proc/{proc.pid}/task"))
    watcher = threading.Thread(target=exited, daemon=True)
    watcher.start()
    began = time.perf_counter()
    code = proc.terminate(args.grace, frozen=frozen)
    ended = time.perf_counter()
    watcher.join(5)
    os.close(exit_fd)
    measured = halves["fds_s"] + halves["maps_s"] + halves["maps_read_s"]  # the bench's own look, not the agent's
    return {"scan": "whole" if whole else "group", "code": code, "job_threads": threads,
            "stop_s": round(marks["frozen"] - began - measured, 3),
            "scan_s": round(marks["scanned"] - marks["frozen"], 3),
            "exit_s": round(marks["exited"] - marks["scanned"], 3),
            "finish_s": round(ended - marks["exited"], 3),
            "total_s": round(ended - began - measured, 3), **{k: round(v, 3) for k, v in halves.items()},
            "writing": sorted(keeper.left_out(keeper.checkpoint_dir))}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("stop_s", "scan_s", "fds_s", "maps_s", "maps_read_s", "exit_s", "finish_s", "total_s")
    return {k: {"median": round(statistics.median(r[k] for r in rows), 3), "max": max(r[k] for r in rows)}
            for k in keys}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--stops", type=int, default=12)
    p.add_argument("--threads", type=int, default=4, help="the job's intra-op threads")
    p.add_argument("--workers", type=int, default=2, help="its DataLoader workers")
    p.add_argument("--mib", type=int, default=64, help="its weights, saved every third step")
    p.add_argument("--grace", type=float, default=5.0)
    p.add_argument("--load", type=int, default=2, help="busy loops meanwhile")
    p.add_argument("--idle", type=int, default=100, help="idle processes meanwhile (a VM's daemons)")
    p.add_argument("--seed", type=int, default=64)
    p.add_argument("--job", choices=("loop", "trainer"), default="loop")
    p.add_argument("--library", choices=("torch", "numpy"), default="torch", help="the loop's (numpy: no torch)")
    p.add_argument("--python", default=sys.executable, help="the job's interpreter (--job trainer: with transformers)")
    args = p.parse_args()
    rng = random.Random(args.seed)
    others = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    others += [subprocess.Popen(["sleep", "3600"]) for _ in range(args.idle)]
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="stop-time-") as tmp:
            for n in range(args.stops):  # the two ways in turn: a busy machine's drift hits both alike
                rows.append(stop_once(Path(tmp) / str(n), args, rng, whole=n % 2 == 0))
                print(rows[-1], flush=True)
    finally:
        for other in others:
            other.kill()
            other.wait()
    if args.job == "trainer":
        asked = subprocess.run([args.python, "-c", "import transformers as t; print(t.__version__)"],
                               capture_output=True, text=True)
        library = "transformers " + asked.stdout.strip()
    else:
        library = args.library
        if library == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                library = "numpy"
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "job": library},
              "args": vars(args), "stops": rows,
              "summary": {way: summary([r for r in rows if r["scan"] == way]) for way in ("whole", "group")}}
    return report.save("stop_time", result)


if __name__ == "__main__":
    raise SystemExit(main())
